"""Envoy's external processing (ext_proc v3) messages as the endpoint-picker protocol v1 uses them: reading
a request's headers, metadata and attributes, and building the answers (headers with the destination,
streamed body chunks, immediate responses). Only message shapes here; the decisions are ``epp.picker``'s.

Protocol (gateway-api-inference-extension, endpoint picker protocol v1):
- the proxy may send a subset of eligible endpoints in ``filter_metadata["envoy.lb.subset_hint"]
  ["x-gateway-destination-endpoint-subset"]`` (a list of ``ip:port``);
- the picker answers the request headers with the header ``x-gateway-destination-endpoint`` and the same
  value in the dynamic metadata ``envoy.lb`` / ``x-gateway-destination-endpoint``: ``ip:port`` or an ordered,
  comma-separated fallback list;
- the proxy reports the endpoint it used in ``envoy.lb`` / ``x-gateway-destination-endpoint-served``
  (plain Envoy does not: the ``upstream.address`` response attribute says the same); the
  ``response.flags`` attribute says whether the connection to it failed (passive health).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from envoy.config.core.v3 import base_pb2
from envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as ext
from envoy.type.v3 import http_status_pb2
from google.protobuf import struct_pb2

DESTINATION_HEADER = "x-gateway-destination-endpoint"
LB_NAMESPACE = "envoy.lb"
SUBSET_NAMESPACE = "envoy.lb.subset_hint"
SUBSET_KEY = "x-gateway-destination-endpoint-subset"
SERVED_KEY = "x-gateway-destination-endpoint-served"
EXT_PROC_ATTRIBUTES = "envoy.filters.http.ext_proc"  # the key Envoy files requested attributes under
UPSTREAM_ADDRESS = "upstream.address"
RESPONSE_FLAGS = "response.flags"
RESPONSE_CODE = "response.code"  # the status, for a response whose headers the picker does not see
UPSTREAM_CONNECTION_FAILURE = 0x20  # Envoy's response flag UF
# the most the picker sends back in one body message: under gRPC's 64 KiB default frame budget
CHUNK_BYTES = 62_000

Headers = dict[str, str]


def header_map(message: ext.HttpHeaders) -> Headers:
    """A headers message as a dict of lower-case names (Envoy sends ``raw_value`` bytes, or ``value``); a
    repeated name keeps its values joined by commas, as HTTP allows."""
    out: Headers = {}
    for header in message.headers.headers:
        value = header.raw_value.decode("utf-8", "replace") if header.raw_value else header.value
        key = header.key.lower()
        out[key] = f"{out[key]},{value}" if key in out else value
    return out


def _struct_value(value: struct_pb2.Value) -> Any:
    kind = value.WhichOneof("kind")
    if kind == "list_value":
        return [_struct_value(v) for v in value.list_value.values]
    if kind == "struct_value":
        return {k: _struct_value(v) for k, v in value.struct_value.fields.items()}
    if kind is None or kind == "null_value":
        return None
    return getattr(value, kind)


def _metadata(request: ext.ProcessingRequest, namespace: str, key: str) -> Any:
    if not request.HasField("metadata_context"):
        return None
    struct = request.metadata_context.filter_metadata.get(namespace)
    if struct is None or key not in struct.fields:
        return None
    return _struct_value(struct.fields[key])


def endpoints_of(value: Any) -> list[str] | None:
    """A metadata value naming endpoints (a list, or one comma-separated string) as ``ip:port`` strings."""
    if value is None:
        return None
    items = value if isinstance(value, list) else [value]
    out: list[str] = []
    for item in items:
        if isinstance(item, str):
            out.extend(part.strip() for part in item.split(",") if part.strip())
    return out


def subset_hint(request: ext.ProcessingRequest) -> list[str] | None:
    """The proxy's eligible endpoints (None: no hint, every endpoint is eligible; ``[]``: none is)."""
    return endpoints_of(_metadata(request, SUBSET_NAMESPACE, SUBSET_KEY))


def _attribute(request: ext.ProcessingRequest, name: str) -> Any:
    attributes = request.attributes.get(EXT_PROC_ATTRIBUTES)
    if attributes is None or name not in attributes.fields:
        return None
    return _struct_value(attributes.fields[name])


def connect_failed(request: ext.ProcessingRequest) -> bool:
    """Whether the gateway could not connect to the endpoint (the ``response.flags`` attribute's UF)."""
    flags = _attribute(request, RESPONSE_FLAGS)
    return isinstance(flags, float | int) and bool(int(flags) & UPSTREAM_CONNECTION_FAILURE)


def response_status(request: ext.ProcessingRequest) -> int:
    """The response's status from the ``response.code`` attribute (0: not sent)."""
    code = _attribute(request, RESPONSE_CODE)
    return int(code) if isinstance(code, float | int) else 0


def served_endpoint(request: ext.ProcessingRequest) -> str | None:
    """The endpoint the proxy used: its ``envoy.lb`` report, else the ``upstream.address`` attribute."""
    reported = endpoints_of(_metadata(request, LB_NAMESPACE, SERVED_KEY))
    if reported:
        return reported[0]
    value = _attribute(request, UPSTREAM_ADDRESS)
    return value if isinstance(value, str) and value else None


def _header_option(name: str, value: str) -> base_pb2.HeaderValueOption:
    return base_pb2.HeaderValueOption(
        header=base_pb2.HeaderValue(key=name, raw_value=value.encode()),
        append_action=base_pb2.HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD,
    )


def mutation(set_headers: Mapping[str, str], remove: Iterable[str] = ()) -> ext.HeaderMutation:
    return ext.HeaderMutation(
        set_headers=[_header_option(k, v) for k, v in set_headers.items()], remove_headers=list(remove)
    )


def destination(set_headers: Mapping[str, str], remove: Iterable[str] = ()) -> ext.ProcessingResponse:
    """The request-headers answer: ``set_headers`` (the destination header among them) and the destination
    in ``envoy.lb`` too."""
    answer = ext.ProcessingResponse(
        request_headers=ext.HeadersResponse(
            response=ext.CommonResponse(header_mutation=mutation(set_headers, remove))
        )
    )
    fields = answer.dynamic_metadata.fields[LB_NAMESPACE].struct_value.fields
    fields[DESTINATION_HEADER].string_value = set_headers[DESTINATION_HEADER]
    return answer


_MODE = processing_mode_pb2.ProcessingMode
# the response side as the picker asks for it (``mode_override``, the filter's ``allow_mode_override``): its
# headers (the status; the decision headers), the body STREAMED (each chunk read as it passes, so a gateway
# configured with the response body NONE still lets the picker learn from the usage) and the trailers (a
# response that has them ends with them). The headers are never skipped here: without them the status
# comes only as the ``response.code`` attribute, which a gateway may not send (a gateway that does can
# skip them in its own config, ``response_header_mode: SKIP``).
RESPONSE_MODE = _MODE(
    response_header_mode=_MODE.SEND, response_body_mode=_MODE.STREAMED, response_trailer_mode=_MODE.SEND
)


def response_mode(answer: ext.ProcessingResponse, request_body: int = 0) -> None:
    """Ask the gateway for the response side in ``RESPONSE_MODE``, in the answer to the request headers.
    Envoy 1.40 applies it only there, only with ``allow_mode_override`` and only when neither body is
    FULL_DUPLEX_STREAMED: so with the request body BUFFERED (its debug log: "Processing mode overridden by
    server"); else it ignores it. The override is the whole mode: a request body still to come keeps its
    mode (``request_body``, else NONE: not sent)."""
    answer.mode_override.CopyFrom(RESPONSE_MODE)
    answer.mode_override.request_body_mode = request_body


def body_continue() -> ext.ProcessingResponse:
    """A response body message let through unchanged."""
    return ext.ProcessingResponse(response_body=ext.BodyResponse(response=ext.CommonResponse()))


BUFFERED = _MODE.BUFFERED


def buffered_request(request: ext.ProcessingRequest) -> bool:
    """Whether the gateway sends this request's body ``BUFFERED`` (its ``protocol_config``, first message):
    then the headers are answered at once and the destination goes with the body's answer, which the
    gateway applies to the headers it still holds; nothing is streamed back."""
    mode = processing_mode_pb2.ProcessingMode
    config = request.protocol_config
    return bool(request.HasField("protocol_config") and config.request_body_mode == mode.BUFFERED)


DUPLEX = _MODE.FULL_DUPLEX_STREAMED
NO_BODY = _MODE.NONE


def response_body_mode(request: ext.ProcessingRequest) -> int | None:
    """How the gateway is configured to send this request's response body (its ``protocol_config``, first
    message; None: not said). FULL_DUPLEX_STREAMED: every response body chunk must be sent back
    (``body_chunks``), a bare continue is out of protocol; Envoy ignores ``mode_override`` then, so the
    response comes in this mode. NONE: no body comes, unless the override (``response_mode``) was
    applied."""
    if not request.HasField("protocol_config"):
        return None
    return int(request.protocol_config.response_body_mode)


def as_body_answer(answer: ext.ProcessingResponse, body: bytes | None) -> ext.ProcessingResponse:
    """A destination answer (``destination``) as the answer to a buffered body (``body``: a new body)."""
    common = ext.CommonResponse()
    common.CopyFrom(answer.request_headers.response)
    if body is not None:
        common.body_mutation.CopyFrom(ext.BodyMutation(body=body))
    out = ext.ProcessingResponse(request_body=ext.BodyResponse(response=common))
    out.dynamic_metadata.CopyFrom(answer.dynamic_metadata)
    return out


def body_chunks(body: bytes, response: bool = False, end: bool = True) -> Iterator[ext.ProcessingResponse]:
    """``body`` streamed back (``FULL_DUPLEX_STREAMED``) in chunks of at most ``CHUNK_BYTES``; the last one
    ends the stream when ``end``. An empty body is one empty chunk (the end still has to be said)."""
    size = len(body)
    starts = range(0, size, CHUNK_BYTES) if size else range(1)
    for start in starts:
        last = start + CHUNK_BYTES >= size
        streamed = ext.StreamedBodyResponse(
            body=body[start : start + CHUNK_BYTES], end_of_stream=end and last
        )
        common = ext.CommonResponse(body_mutation=ext.BodyMutation(streamed_response=streamed))
        if response:
            yield ext.ProcessingResponse(response_body=ext.BodyResponse(response=common))
        else:
            yield ext.ProcessingResponse(request_body=ext.BodyResponse(response=common))


def continue_headers(response: bool) -> ext.ProcessingResponse:
    """Headers passed on untouched."""
    answer = ext.HeadersResponse(response=ext.CommonResponse())
    if response:
        return ext.ProcessingResponse(response_headers=answer)
    return ext.ProcessingResponse(request_headers=answer)


def continue_trailers(response: bool) -> ext.ProcessingResponse:
    if response:
        return ext.ProcessingResponse(response_trailers=ext.TrailersResponse())
    return ext.ProcessingResponse(request_trailers=ext.TrailersResponse())


def immediate(status: int, body: bytes, headers: Mapping[str, str], details: str) -> ext.ProcessingResponse:
    """Answer the client at once (the request goes nowhere): an OpenAI error body."""
    answer = ext.ImmediateResponse(
        status=http_status_pb2.HttpStatus(code=status),
        headers=mutation({"content-type": "application/json", **headers}),
        body=body,
        details=details,
    )
    return ext.ProcessingResponse(immediate_response=answer)
