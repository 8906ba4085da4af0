"""The picker's side of the ext_proc exchange, message by message (what Envoy sends, built here): the order
and shape of the answers, chunking, trailers, fallbacks, the served-endpoint report, the gRPC health."""

from __future__ import annotations

from typing import Any

import grpc
import orjson
from envoy.service.ext_proc.v3 import external_processor_pb2 as ext
from google.protobuf import struct_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc

from prefix_router.epp import (
    EXT_PROC_SERVICE,
    EppSettings,
    PickerStream,
    create_control_app,
    extproc,
    start_epp,
)
from prefix_router.node.config import load_config
from support.extproc import (
    BODY,
    POST,
    WORKERS,
    body_message,
    destination_of,
    edge,
    headers_message,
    response_headers,
)
from support.routers import QUIET


async def test_headers_wait_for_the_body_then_destination_then_chunks() -> None:
    stream = PickerStream(edge())
    assert await stream.answer(headers_message(POST)) == []
    big = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "x" * 200_000}]})
    assert await stream.answer(body_message(big[:100_000], end=False)) == []
    answers = await stream.answer(body_message(big[100_000:], end=True))
    header, meta = destination_of(answers[0])
    assert header == meta and header in {"10.0.0.1:8000", "10.0.0.2:8000", "10.0.0.3:8000"}
    chunks = [a.request_body.response.body_mutation.streamed_response for a in answers[1:]]
    assert b"".join(c.body for c in chunks) == big
    assert all(len(c.body) <= extproc.CHUNK_BYTES for c in chunks) and len(chunks) == 4
    assert [c.end_of_stream for c in chunks] == [False, False, False, True]


async def test_fallbacks_follow_the_choice_least_loaded_first() -> None:
    shared = edge(fallbacks=2)
    stream = PickerStream(shared)
    await stream.answer(headers_message(POST))
    header, meta = destination_of((await stream.answer(body_message(BODY, end=True)))[0])
    endpoints = header.split(",")
    assert header == meta and len(endpoints) == 3 and len(set(endpoints)) == 3


async def test_a_request_without_body_gets_the_headers_answer_alone() -> None:
    stream = PickerStream(edge())
    answers = await stream.answer(headers_message({":method": "GET", ":path": "/v1/models"}, end=True))
    assert len(answers) == 1 and answers[0].HasField("request_headers")


async def test_trailers_end_the_body() -> None:
    stream = PickerStream(edge())
    await stream.answer(headers_message(POST))
    await stream.answer(body_message(BODY, end=False))
    trailers = ext.ProcessingRequest(request_trailers=ext.HttpTrailers())
    answers = await stream.answer(trailers)
    assert answers[0].HasField("request_headers") and answers[-1].HasField("request_trailers")
    chunk = answers[1].request_body.response.body_mutation.streamed_response
    assert chunk.body == BODY and not chunk.end_of_stream


async def test_subset_hint_restricts_the_choice() -> None:
    for _ in range(5):
        stream = PickerStream(edge())
        hint = {extproc.SUBSET_KEY: ["10.0.0.3:8000"]}
        await stream.answer(headers_message(POST, metadata={extproc.SUBSET_NAMESPACE: hint}))
        header, _ = destination_of((await stream.answer(body_message(BODY, end=True)))[0])
        assert header == "10.0.0.3:8000"


async def test_empty_subset_is_an_immediate_503() -> None:
    stream = PickerStream(edge())
    await stream.answer(headers_message(POST, metadata={extproc.SUBSET_NAMESPACE: {extproc.SUBSET_KEY: []}}))
    (answer,) = await stream.answer(body_message(BODY, end=True))
    assert answer.immediate_response.status.code == 503
    assert orjson.loads(answer.immediate_response.body)["error"]["code"] == "no_healthy_worker"


async def test_served_elsewhere_moves_the_flight() -> None:
    shared = edge(fallbacks=1)
    stream = PickerStream(shared)
    await stream.answer(headers_message(POST))
    header, _ = destination_of((await stream.answer(body_message(BODY, end=True)))[0])
    chosen, fallback = header.split(",")
    load = shared.state.router.load
    names = {w.url.removeprefix("http://"): w.name for w in shared.state.pool}
    assert load.in_flight(names[chosen]) == 1
    await stream.answer(response_headers(200, served=fallback))
    assert load.in_flight(names[chosen]) == 0 and load.in_flight(names[fallback]) == 1
    usage = {"usage": {"prompt_tokens": 80, "prompt_tokens_details": {"cached_tokens": 0}}}
    body = ext.ProcessingRequest(response_body=ext.HttpBody(body=orjson.dumps(usage), end_of_stream=True))
    (echo,) = await stream.answer(body)
    assert echo.HasField("response_body") and not echo.response_body.response.HasField("body_mutation")
    assert load.in_flight(names[fallback]) == 0
    assert shared.state.router.feedback[names[fallback]].reports == 1
    stream.close()


async def test_stream_cut_before_the_response_ends_the_flight() -> None:
    shared = edge()
    stream = PickerStream(shared)
    await stream.answer(headers_message(POST))
    await stream.answer(body_message(BODY, end=True))
    assert shared.state.pool.total_in_flight() == 1
    stream.close()
    assert shared.state.pool.total_in_flight() == 0


async def test_grpc_health_liveness_and_readiness() -> None:
    config = load_config(env={}, overrides={**QUIET, "workers": WORKERS[:1], "port": 0})
    running = await start_epp(create_control_app(config), EppSettings(grpc_port=0))
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{running.grpc_port}") as channel:
            health = health_pb2_grpc.HealthStub(channel)

            async def status(service: str) -> int:
                reply = await health.Check(health_pb2.HealthCheckRequest(service=service))
                return int(reply.status)

            serving, not_serving = (
                health_pb2.HealthCheckResponse.SERVING,
                health_pb2.HealthCheckResponse.NOT_SERVING,
            )
            assert await status("liveness") == serving
            # the worker at 10.0.0.1 never answers its probe: not ready
            assert await status("readiness") == not_serving and await status(EXT_PROC_SERVICE) == not_serving
            state = running.edge.state
            state.pool.report(state.pool.require("a"), True)
            await running.health.update()
            assert await status("readiness") == serving and await status(EXT_PROC_SERVICE) == serving
    finally:
        await running.stop()


def body_response(payload: dict[str, Any], attributes: dict[str, Any]) -> ext.ProcessingRequest:
    """A response body message as Envoy sends it when the response headers are skipped: the response
    attributes ride on it."""
    message = ext.ProcessingRequest(
        response_body=ext.HttpBody(body=orjson.dumps(payload), end_of_stream=True)
    )
    struct = struct_pb2.Struct()
    struct.update(attributes)
    message.attributes[extproc.EXT_PROC_ATTRIBUTES].CopyFrom(struct)
    return message


async def test_response_headers_are_skipped_unless_the_picker_adds_to_them() -> None:
    mode = type(extproc.RESPONSE_MODES[False])
    for decision_headers in (False, True):
        picker = PickerStream(edge(**{"tenants.decision_headers": decision_headers}))
        await picker.answer(headers_message(POST))
        answer = (await picker.answer(body_message(BODY, end=True)))[0]
        override = answer.mode_override
        assert override.response_header_mode == (mode.SEND if decision_headers else mode.SKIP)
        assert override.response_body_mode == mode.STREAMED and override.response_trailer_mode == mode.SEND
        assert override.request_body_mode == mode.NONE  # the request body was already sent
        picker.close()


async def test_a_buffered_request_body_keeps_its_mode_in_the_override() -> None:
    picker = PickerStream(edge(**{"tenants.decision_headers": False}))
    message = headers_message(POST)
    message.protocol_config.request_body_mode = extproc.BUFFERED  # type: ignore[assignment]
    (answer,) = await picker.answer(message)
    mode = answer.mode_override
    assert answer.HasField("request_headers") and mode.request_body_mode == extproc.BUFFERED
    assert mode.response_header_mode == mode.SKIP and mode.response_body_mode == mode.STREAMED
    (chosen,) = await picker.answer(body_message(BODY, end=True))
    assert chosen.HasField("request_body") and not chosen.HasField("mode_override")
    picker.close()


async def test_without_headers_the_body_attributes_give_status_and_endpoint() -> None:
    shared = edge(fallbacks=1, **{"tenants.decision_headers": False})
    picker = PickerStream(shared)
    await picker.answer(headers_message(POST))
    header, _ = destination_of((await picker.answer(body_message(BODY, end=True)))[0])
    chosen, fallback = header.split(",")
    names = {w.url.removeprefix("http://"): w.name for w in shared.state.pool}
    usage = {"usage": {"prompt_tokens": 80, "prompt_tokens_details": {"cached_tokens": 16}}}
    attributes = {extproc.RESPONSE_CODE: 200, extproc.UPSTREAM_ADDRESS: fallback, extproc.RESPONSE_FLAGS: 0}
    (echo,) = await picker.answer(body_response(usage, attributes))
    assert echo.HasField("response_body") and not echo.response_body.response.HasField("body_mutation")
    assert shared.state.router.feedback[names[fallback]].reports == 1
    assert shared.state.router.feedback[names[chosen]].reports == 0
    assert shared.state.pool.total_in_flight() == 0 and picker.final_status == 200
    assert shared.messages["response_body"] == 1 and shared.messages["response_headers"] == 0
    picker.close()


async def test_without_headers_a_connect_failure_is_a_passive_health_failure() -> None:
    shared = edge(**{"tenants.decision_headers": False, "health.fail_threshold": 1})
    picker = PickerStream(shared)
    await picker.answer(headers_message(POST))
    header, _ = destination_of((await picker.answer(body_message(BODY, end=True)))[0])
    name = {w.url.removeprefix("http://"): w.name for w in shared.state.pool}[header]
    flags = {extproc.RESPONSE_CODE: 503, extproc.RESPONSE_FLAGS: extproc.UPSTREAM_CONNECTION_FAILURE}
    await picker.answer(body_response({"error": "upstream connect error"}, flags))
    assert picker.final_status == 503 and not shared.state.pool.require(name).available
    picker.close()
