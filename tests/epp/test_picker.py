"""The picker's side of the ext_proc exchange, message by message (what Envoy sends, built here): the order
and shape of the answers, chunking, trailers, fallbacks, the served-endpoint report, the gRPC health."""

from __future__ import annotations

from typing import Any

import grpc
import orjson
from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as ext
from google.protobuf import struct_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc

from prefix_router.epp import (
    EXT_PROC_SERVICE,
    Edge,
    EppSettings,
    PickerStream,
    create_control_app,
    extproc,
    start_epp,
)
from prefix_router.node import CLIENT_GONE
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


def configured(message: ext.ProcessingRequest, request: int = 0, response: int = 0) -> ext.ProcessingRequest:
    """``message`` (the stream's first) with the gateway's body modes in its ``protocol_config``."""
    message.protocol_config.request_body_mode = request  # type: ignore[assignment]
    message.protocol_config.response_body_mode = response  # type: ignore[assignment]
    return message


async def test_the_override_asks_for_the_response_headers_and_a_streamed_body() -> None:
    """The headers carry the status (the ``response.code`` attribute may not come), the body STREAMED is
    read as it passes; under a FULL_DUPLEX_STREAMED response Envoy ignores an override: none is sent."""
    mode = type(extproc.RESPONSE_MODE)
    for decision_headers in (False, True):
        picker = PickerStream(edge(**{"tenants.decision_headers": decision_headers}))
        await picker.answer(configured(headers_message(POST), mode.FULL_DUPLEX_STREAMED, mode.NONE))
        answer = (await picker.answer(body_message(BODY, end=True)))[0]
        override = answer.mode_override
        assert answer.HasField("mode_override") and override.response_header_mode == mode.SEND
        assert override.response_body_mode == mode.STREAMED and override.response_trailer_mode == mode.SEND
        assert override.request_body_mode == mode.NONE  # the request body was already sent
        picker.close()
    duplex = PickerStream(edge())
    message = configured(headers_message(POST), mode.BUFFERED, mode.FULL_DUPLEX_STREAMED)
    (answer,) = await duplex.answer(message)
    assert answer.HasField("request_headers") and not answer.HasField("mode_override")
    duplex.close()


async def test_a_buffered_request_body_keeps_its_mode_in_the_override() -> None:
    picker = PickerStream(edge(**{"tenants.decision_headers": False}))
    (answer,) = await picker.answer(configured(headers_message(POST), extproc.BUFFERED))
    mode = answer.mode_override
    assert answer.HasField("request_headers") and mode.request_body_mode == extproc.BUFFERED
    assert mode.response_header_mode == mode.SEND and mode.response_body_mode == mode.STREAMED
    (chosen,) = await picker.answer(body_message(BODY, end=True))
    assert chosen.HasField("request_body") and not chosen.HasField("mode_override")
    picker.close()


def response_chunk(data: bytes, end: bool) -> ext.ProcessingRequest:
    return ext.ProcessingRequest(response_body=ext.HttpBody(body=data, end_of_stream=end))


async def test_a_full_duplex_response_is_sent_back_chunk_by_chunk() -> None:
    """FULL_DUPLEX_STREAMED (the reference gateways'): each chunk goes back as a streamed body, a bare
    continue being out of protocol (Envoy: "Spurious response message"); the trailers are answered."""
    shared = edge()
    picker = PickerStream(shared)
    duplex = extproc.DUPLEX
    await picker.answer(configured(headers_message(POST), duplex, duplex))
    await picker.answer(body_message(BODY, end=True))
    await picker.answer(response_headers(200))
    usage = orjson.dumps({"usage": {"prompt_tokens": 80, "prompt_tokens_details": {"cached_tokens": 16}}})
    big = usage[:-1] + b', "pad": "' + b"x" * 70_000 + b'"}'
    answers = [
        *await picker.answer(response_chunk(big[:10], False)),
        *await picker.answer(response_chunk(big[10:], False)),
    ]
    streamed = [a.response_body.response.body_mutation.streamed_response for a in answers]
    assert b"".join(s.body for s in streamed) == big and len(streamed) == 3  # 70 KB: two chunks back
    assert not any(s.end_of_stream for s in streamed)
    (last,) = await picker.answer(response_chunk(b"", True))
    assert last.response_body.response.body_mutation.streamed_response.end_of_stream
    assert shared.state.pool.total_in_flight() == 0 and picker.final_status == 200
    assert (
        shared.state.router.feedback["a"].reports
        + shared.state.router.feedback["b"].reports
        + shared.state.router.feedback["c"].reports
        == 1
    )
    trailers = await picker.answer(ext.ProcessingRequest(response_trailers=ext.HttpTrailers()))
    assert [a.WhichOneof("response") for a in trailers] == ["response_trailers"]
    picker.close()


async def test_without_a_response_body_the_headers_settle_the_request() -> None:
    """Response body NONE (the override not applied): the stream ends after the response headers, and
    the request is over with their status, not a client gone."""
    shared = edge()
    picker = PickerStream(shared)
    await picker.answer(configured(headers_message(POST), extproc.DUPLEX, extproc.NO_BODY))
    await picker.answer(body_message(BODY, end=True))
    await picker.answer(response_headers(200))
    assert shared.state.pool.total_in_flight() == 1
    picker.close()
    assert shared.state.pool.total_in_flight() == 0 and picker.final_status == 200
    gone = PickerStream(shared)  # a body was to come: the stream cut before it is a client gone
    await gone.answer(configured(headers_message(POST), extproc.DUPLEX, extproc.DUPLEX))
    await gone.answer(body_message(BODY, end=True))
    await gone.answer(response_headers(200))
    gone.close()
    assert gone.final_status == CLIENT_GONE


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


async def test_a_streamed_body_of_the_limit_passes_and_one_byte_more_is_413() -> None:
    shared = edge(**{"limits.max_body_bytes": len(BODY)})
    at_limit = PickerStream(shared)
    await at_limit.answer(headers_message(POST))
    assert await at_limit.answer(body_message(BODY[:100], end=False)) == []
    assert (await at_limit.answer(body_message(BODY[100:], end=True)))[0].HasField("request_headers")
    over = PickerStream(shared)
    await over.answer(headers_message(POST))
    assert await over.answer(body_message(BODY[:100], end=False)) == []
    (refused,) = await over.answer(body_message(BODY[100:] + b" ", end=False))
    assert refused.immediate_response.status.code == 413
    declared = PickerStream(shared)
    (early,) = await declared.answer(headers_message({**POST, "content-length": str(len(BODY) + 1)}))
    assert early.immediate_response.status.code == 413
    at_limit.close()
    over.close()


async def pinned(shared: Edge, address: str) -> PickerStream:
    """A request decided within the subset ``[address]``: one more in flight there."""
    stream = PickerStream(shared)
    hint = {extproc.SUBSET_NAMESPACE: {extproc.SUBSET_KEY: [address]}}
    await stream.answer(headers_message(POST, metadata=hint))
    header, _ = destination_of((await stream.answer(body_message(BODY, end=True)))[0])
    assert header == address
    return stream


async def test_the_fallbacks_are_ordered_least_loaded_first() -> None:
    shared = edge(fallbacks=2)
    held = [await pinned(shared, a) for a in ("10.0.0.2:8000", "10.0.0.2:8000", "10.0.0.3:8000")]
    stream = PickerStream(shared)
    await stream.answer(headers_message(POST))
    header, _ = destination_of((await stream.answer(body_message(BODY, end=True)))[0])
    chosen, *fallbacks = header.split(",")
    names = {w.url.removeprefix("http://"): w.name for w in shared.state.pool}
    loads = {"10.0.0.1:8000": 0, "10.0.0.2:8000": 2, "10.0.0.3:8000": 1}  # before this request
    assert fallbacks == sorted((a for a in loads if a != chosen), key=loads.__getitem__)
    assert [shared.state.pool.in_flight(names[a]) for a in fallbacks] == sorted(loads[a] for a in fallbacks)
    for picker in (*held, stream):
        picker.close()


async def whole_response(cap: int) -> int:
    """A whole 2xx answer of usage (two messages) with ``limits.max_response_buffer_bytes`` = ``cap``: the
    usage reports learned."""
    shared = edge(**{"limits.max_response_buffer_bytes": cap, "tenants.decision_headers": True})
    stream = PickerStream(shared)
    await stream.answer(headers_message(POST))
    await stream.answer(body_message(BODY, end=True))
    await stream.answer(response_headers(200))
    usage = orjson.dumps({"usage": {"prompt_tokens": 80, "prompt_tokens_details": {"cached_tokens": 16}}})
    for part, end in ((usage[:20], False), (usage[20:], True)):
        await stream.answer(ext.ProcessingRequest(response_body=ext.HttpBody(body=part, end_of_stream=end)))
    assert shared.state.pool.total_in_flight() == 0 and stream.final_status == 200
    stream.close()
    return sum(f.reports for f in shared.state.router.feedback.values())


async def test_nothing_is_learned_from_a_response_over_the_buffer_cap() -> None:
    assert await whole_response(cap=1024) == 1
    assert await whole_response(cap=20) == 0  # the first message fills the cap, the second goes over it


async def test_a_response_over_the_buffer_cap_is_no_longer_kept() -> None:
    shared = edge(**{"limits.max_response_buffer_bytes": 20, "tenants.decision_headers": True})
    stream = PickerStream(shared)
    await stream.answer(headers_message(POST))
    await stream.answer(body_message(BODY, end=True))
    await stream.answer(response_headers(200))
    held = []
    for _ in range(3):  # 15 bytes each: the second goes over the cap, the third is not kept
        await stream.answer(ext.ProcessingRequest(response_body=ext.HttpBody(body=b"x" * 15)))
        held.append(shared.buffered)
    assert held[0] == 15 and held[2] == held[1] <= 30
    stream.close()
    assert shared.buffered == 0


async def test_nothing_is_processed_after_an_immediate_response() -> None:
    shared = edge(**{"limits.max_body_bytes": 10})
    stream = PickerStream(shared)
    (refused,) = await stream.answer(headers_message({**POST, "content-length": "11"}))
    assert refused.immediate_response.status.code == 413
    assert await stream.answer(body_message(BODY, end=True)) == []
    assert await stream.answer(ext.ProcessingRequest(request_trailers=ext.HttpTrailers())) == []
    assert stream.pick is None and shared.state.pool.total_in_flight() == 0 and shared.buffered == 0
    assert shared.messages["request_body"] == 1  # counted, not processed
    stream.close()


async def test_a_subset_of_unhealthy_workers_is_503_and_one_at_its_cap_is_429() -> None:
    shared = edge(**{"health.fail_threshold": 1, "limits.max_in_flight_per_worker": 1})
    hint = {extproc.SUBSET_NAMESPACE: {extproc.SUBSET_KEY: ["10.0.0.3:8000"]}}
    held = await pinned(shared, "10.0.0.3:8000")  # c at its cap
    at_cap = PickerStream(shared)
    await at_cap.answer(headers_message(POST, metadata=hint))
    (busy,) = await at_cap.answer(body_message(BODY, end=True))
    assert busy.immediate_response.status.code == 429
    shared.state.pool.report(shared.state.pool.require("c"), False, "probe failed")
    held.close()
    unhealthy = PickerStream(shared)
    await unhealthy.answer(headers_message(POST, metadata=hint))
    (answer,) = await unhealthy.answer(body_message(BODY, end=True))
    assert answer.immediate_response.status.code == 503
    assert orjson.loads(answer.immediate_response.body)["error"]["code"] == "no_healthy_worker"


def test_a_repeated_header_keeps_every_value_joined() -> None:
    values = [
        base_pb2.HeaderValue(key="X-Tag", raw_value=b"one"),
        base_pb2.HeaderValue(key="x-tag", value="two"),
        base_pb2.HeaderValue(key="x-other", raw_value=b"three"),
    ]
    headers = extproc.header_map(ext.HttpHeaders(headers=base_pb2.HeaderMap(headers=values)))
    assert headers == {"x-tag": "one,two", "x-other": "three"}


async def test_the_gateways_served_endpoint_report_moves_the_flight() -> None:
    shared = edge(fallbacks=1, **{"tenants.decision_headers": True})
    stream = PickerStream(shared)
    await stream.answer(headers_message(POST))
    header, _ = destination_of((await stream.answer(body_message(BODY, end=True)))[0])
    chosen, fallback = header.split(",")
    names = {w.url.removeprefix("http://"): w.name for w in shared.state.pool}
    message = response_headers(200, served=chosen)  # the attribute says the choice, the report wins
    served = {extproc.SERVED_KEY: fallback}
    message.metadata_context.filter_metadata[extproc.LB_NAMESPACE].CopyFrom(struct_pb2.Struct())
    message.metadata_context.filter_metadata[extproc.LB_NAMESPACE].update(served)
    await stream.answer(message)
    load = shared.state.router.load
    assert load.in_flight(names[chosen]) == 0 and load.in_flight(names[fallback]) == 1
    stream.close()


async def test_an_empty_body_still_ends_the_stream() -> None:
    (only,) = extproc.body_chunks(b"")
    streamed = only.request_body.response.body_mutation.streamed_response
    assert streamed.body == b"" and streamed.end_of_stream
    stream = PickerStream(edge())
    assert await stream.answer(headers_message({":method": "GET", ":path": "/v1/models"})) == []
    destination, chunk = await stream.answer(body_message(b"", end=True))
    assert destination.HasField("request_headers")
    streamed = chunk.request_body.response.body_mutation.streamed_response
    assert streamed.body == b"" and streamed.end_of_stream
    stream.close()
