"""Floor server for ``benchmarks/epp.py``: the least an ext_proc endpoint picker on grpc.aio can do per
request. It serves ``envoy.service.ext_proc.v3.ExternalProcessor`` on the same stack as ``prefix-router
epp`` (grpcio's asyncio server on uvloop, ``tune_gc``), and answers each message with a prebuilt
response: the request headers with one fixed destination (``--destination ip:port``, header and
``envoy.lb`` metadata), the response's messages passed on. A ``FULL_DUPLEX_STREAMED`` request body is
buffered to its end and streamed back in chunks, as the protocol requires. The answers are built here from
Envoy's messages, not by the picker's code. No parsing, no routing, no accounting, no logging: a measuring
instrument, not product code. What the picker costs above it is
the picker's own work.

    python benchmarks/floor_servers/extproc_floor.py --port 9102 --destination 127.0.0.1:8000
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import AsyncIterator, Iterator
from typing import Any

import grpc
from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as ext
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as ext_grpc

from prefix_router.node import loop_factory, tune_gc

Answers = Iterator[ext.ProcessingResponse]
DESTINATION_HEADER = "x-gateway-destination-endpoint"  # endpoint picker protocol v1: header and metadata key
LB_NAMESPACE = "envoy.lb"  # the dynamic metadata namespace the destination goes in
CHUNK_BYTES = 62_000  # a streamed body's chunks, at most (under gRPC's 64 KiB default frame budget)


def destination(endpoint: str) -> ext.ProcessingResponse:
    """The request headers' answer: the destination header set, and the same value in ``envoy.lb``."""
    header = base_pb2.HeaderValueOption(
        header=base_pb2.HeaderValue(key=DESTINATION_HEADER, raw_value=endpoint.encode()),
        append_action=base_pb2.HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD,
    )
    mutation = ext.HeaderMutation(set_headers=[header])
    answer = ext.ProcessingResponse(
        request_headers=ext.HeadersResponse(response=ext.CommonResponse(header_mutation=mutation))
    )
    fields = answer.dynamic_metadata.fields[LB_NAMESPACE].struct_value.fields
    fields[DESTINATION_HEADER].string_value = endpoint
    return answer


def body_chunks(body: bytes, end: bool = True) -> Answers:
    """The request ``body`` streamed back in chunks of at most ``CHUNK_BYTES``, the last one ending the
    stream when ``end``; an empty body is one empty chunk (the end still has to be said)."""
    size = len(body)
    for start in range(0, size, CHUNK_BYTES) if size else range(1):
        streamed = ext.StreamedBodyResponse(
            body=body[start : start + CHUNK_BYTES], end_of_stream=end and start + CHUNK_BYTES >= size
        )
        common = ext.CommonResponse(body_mutation=ext.BodyMutation(streamed_response=streamed))
        yield ext.ProcessingResponse(request_body=ext.BodyResponse(response=common))


class FloorProcessor(ext_grpc.ExternalProcessorServicer):  # type: ignore[misc]
    """Every answer prebuilt but the request body's echo; one list of chunks per stream."""

    def __init__(self, endpoint: str) -> None:
        self.chosen = destination(endpoint)
        self.response_headers = ext.ProcessingResponse(
            response_headers=ext.HeadersResponse(response=ext.CommonResponse())
        )
        passed = ext.BodyResponse(response=ext.CommonResponse())  # a response body let through unchanged
        self.response_body = ext.ProcessingResponse(response_body=passed)
        self.request_trailers = ext.ProcessingResponse(request_trailers=ext.TrailersResponse())
        self.response_trailers = ext.ProcessingResponse(response_trailers=ext.TrailersResponse())

    async def Process(
        self, requests: AsyncIterator[ext.ProcessingRequest], context: Any
    ) -> AsyncIterator[ext.ProcessingResponse]:
        chunks: list[bytes] = []
        async for message in requests:
            for answer in self.answer(message, chunks):
                yield answer

    def answer(self, message: ext.ProcessingRequest, chunks: list[bytes]) -> Answers:
        kind = message.WhichOneof("request")
        if kind == "response_body":
            yield self.response_body
        elif kind == "request_body":
            chunks.append(message.request_body.body)
            if message.request_body.end_of_stream:
                yield self.chosen
                yield from body_chunks(b"".join(chunks))
        elif kind == "response_headers":
            yield self.response_headers
        elif kind == "request_headers" and message.request_headers.end_of_stream:
            yield self.chosen
        elif kind == "request_trailers":
            yield self.chosen
            yield from body_chunks(b"".join(chunks), end=False)
            yield self.request_trailers
        elif kind == "response_trailers":
            yield self.response_trailers


async def serve(host: str, port: int, endpoint: str) -> None:
    server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
    ext_grpc.add_ExternalProcessorServicer_to_server(FloorProcessor(endpoint), server)
    server.add_insecure_port(f"{host}:{port}")
    await server.start()
    await server.wait_for_termination()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--destination", required=True, help="the one engine's ip:port")
    args = p.parse_args()
    tune_gc()
    with asyncio.Runner(loop_factory=loop_factory("uvloop")) as runner:
        runner.run(serve(args.host, args.port, args.destination))


if __name__ == "__main__":
    main()
