"""Envoy's ext_proc messages as the endpoint picker receives them, built for tests, and a picker's shared
state (``Edge``) in front of three workers that never answer (every one reported healthy)."""

from __future__ import annotations

from typing import Any

import orjson
from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as ext
from google.protobuf import struct_pb2

from prefix_router.epp import Edge, EppSettings, create_control_app, extproc
from prefix_router.node.config import load_config
from prefix_router.node.state import STATE
from support.routers import QUIET

WORKERS = [
    {"name": "a", "url": "http://10.0.0.1:8000"},
    {"name": "b", "url": "http://10.0.0.2:8000"},
    {"name": "c", "url": "http://10.0.0.3:8000"},
]


def edge(fallbacks: int = 0, budget: int | None = None, **settings: Any) -> Edge:
    """A picker's shared state with ``settings`` as config overrides (``budget``: its body budget)."""
    config = load_config(env={}, overrides={**QUIET, "workers": WORKERS, **settings})
    state = create_control_app(config)[STATE]
    for worker in state.pool:
        state.pool.report(worker, True)
    return Edge(state, EppSettings(fallbacks=fallbacks, max_buffered_bytes=budget))


def headers_message(
    headers: dict[str, str], end: bool = False, metadata: dict[str, Any] | None = None
) -> ext.ProcessingRequest:
    values = [base_pb2.HeaderValue(key=k, raw_value=v.encode()) for k, v in headers.items()]
    message = ext.ProcessingRequest(
        request_headers=ext.HttpHeaders(headers=base_pb2.HeaderMap(headers=values), end_of_stream=end)
    )
    for namespace, fields in (metadata or {}).items():
        struct = struct_pb2.Struct()
        struct.update(fields)
        message.metadata_context.filter_metadata[namespace].CopyFrom(struct)
    return message


def body_message(data: bytes, end: bool) -> ext.ProcessingRequest:
    return ext.ProcessingRequest(request_body=ext.HttpBody(body=data, end_of_stream=end))


def response_headers(status: int, served: str | None = None) -> ext.ProcessingRequest:
    values = [
        base_pb2.HeaderValue(key=":status", raw_value=str(status).encode()),
        base_pb2.HeaderValue(key="content-type", raw_value=b"application/json"),
    ]
    message = ext.ProcessingRequest(
        response_headers=ext.HttpHeaders(headers=base_pb2.HeaderMap(headers=values))
    )
    if served is not None:
        struct = struct_pb2.Struct()
        struct.update({extproc.UPSTREAM_ADDRESS: served})
        message.attributes[extproc.EXT_PROC_ATTRIBUTES].CopyFrom(struct)
    return message


POST = {":method": "POST", ":path": "/v1/chat/completions", "content-type": "application/json"}
BODY = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "hello " * 50}]})


def destination_of(answer: ext.ProcessingResponse) -> tuple[str, str]:
    header = answer.request_headers.response.header_mutation.set_headers[0].header
    meta = answer.dynamic_metadata.fields[extproc.LB_NAMESPACE].struct_value.fields
    return header.raw_value.decode(), meta[extproc.DESTINATION_HEADER].string_value
