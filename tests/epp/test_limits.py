"""The picker's bounds over real gRPC streams on loopback (no gateway: the messages are Envoy's, built here):
each phase's deadline (``timeouts.*``), the body budget across streams, and the stream cap, beyond which
the gRPC health service still answers."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import grpc
import orjson
import pytest
import yaml
from envoy.service.ext_proc.v3 import external_processor_pb2 as ext
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as ext_grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client import generate_latest

from prefix_router.epp import EppSettings, PickerStream, RunningEpp, create_control_app, start_epp
from prefix_router.epp.service import LIVENESS
from prefix_router.epp.settings import BUFFERED_BODIES, GRPC_PORT
from prefix_router.node.config import load_config
from support.extproc import BODY, POST, WORKERS, body_message, edge, headers_message, response_headers
from support.routers import QUIET
from support.waiting import wait_until

WAIT_S = 30.0  # the most any test waits for a state it polls for, or for an answer
MANIFEST = Path(__file__).parents[2] / "deploy" / "kubernetes" / "epp" / "epp.yaml"


@asynccontextmanager
async def picker(settings: EppSettings | None = None, **overrides: Any) -> AsyncIterator[RunningEpp]:
    """A picker on loopback with every worker healthy and ``overrides`` on its config."""
    config = load_config(env={}, overrides={**QUIET, "workers": WORKERS, "port": 0, **overrides})
    running = await start_epp(create_control_app(config), settings or EppSettings(grpc_port=0))
    state = running.edge.state
    for worker in state.pool:
        state.pool.report(worker, True)
    try:
        yield running
    finally:
        await running.stop()


async def read(call: Any) -> Any:
    return await asyncio.wait_for(call.read(), WAIT_S)


def stub(channel: grpc.aio.Channel) -> ext_grpc.ExternalProcessorStub:
    return ext_grpc.ExternalProcessorStub(channel)


def error_code(answer: ext.ProcessingResponse) -> tuple[int, str]:
    immediate = answer.immediate_response
    return immediate.status.code, orjson.loads(immediate.body)["error"]["code"]


async def test_headers_not_sent_in_time_are_answered_408() -> None:
    async with picker(**{"timeouts.client_header_s": 0.2}) as running:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{running.grpc_port}") as channel:
            call = stub(channel).Process()
            answer = await read(call)
            assert error_code(answer) == (408, "request_timeout")
            assert await read(call) is grpc.aio.EOF
        edge = running.edge
        await wait_until(lambda: edge.streams == 0)
        assert edge.cut["header_timeout"] == 1


async def test_a_body_trickling_past_its_deadline_is_answered_408_and_its_bytes_given_back() -> None:
    async with picker(**{"timeouts.client_body_s": 0.3}) as running:
        edge = running.edge
        async with grpc.aio.insecure_channel(f"127.0.0.1:{running.grpc_port}") as channel:
            call = stub(channel).Process()
            await call.write(headers_message(POST))
            await call.write(body_message(BODY[:10], end=False))
            await wait_until(lambda: edge.buffered == 10)
            answer = await read(call)
            assert error_code(answer) == (408, "request_timeout")
            assert b"body" in answer.immediate_response.body
        await wait_until(lambda: edge.streams == 0)
        assert edge.cut["body_timeout"] == 1 and edge.buffered == 0


async def test_a_body_still_being_read_when_the_drain_ends_is_answered_503_shutting_down() -> None:
    async with picker() as running:
        edge = running.edge
        async with grpc.aio.insecure_channel(f"127.0.0.1:{running.grpc_port}") as channel:
            call = stub(channel).Process()
            await call.write(headers_message(POST))
            await call.write(body_message(BODY[:10], end=False))
            await wait_until(lambda: edge.buffered == 10)
            edge.state.deadlines.stop(asyncio.get_running_loop().time())
            assert error_code(await read(call)) == (503, "shutting_down")
        await wait_until(lambda: edge.streams == 0)


async def decided(call: Any) -> ext.ProcessingResponse:
    """Send a whole request; returns the destination answer (the body chunks after it read too)."""
    await call.write(headers_message(POST))
    await call.write(body_message(BODY, end=True))
    first = await read(call)
    assert first.HasField("request_headers")
    chunk = await read(call)
    assert chunk.request_body.response.body_mutation.streamed_response.end_of_stream
    return first  # type: ignore[no-any-return]


async def ended_late(call: Any) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as ended:
        await read(call)
    assert ended.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED


async def test_a_response_that_never_begins_frees_its_in_flight_slot() -> None:
    async with picker(**{"timeouts.first_byte_s": 0.3}) as running:
        state = running.edge.state
        async with grpc.aio.insecure_channel(f"127.0.0.1:{running.grpc_port}") as channel:
            call = stub(channel).Process()
            await decided(call)
            assert state.pool.total_in_flight() == 1
            await ended_late(call)
        assert state.pool.total_in_flight() == 0 and running.edge.cut["response_timeout"] == 1
        await wait_until(lambda: running.edge.streams == 0)


async def test_a_response_stalled_between_messages_frees_its_in_flight_slot() -> None:
    async with picker(**{"timeouts.stream_idle_s": 0.3}) as running:
        state = running.edge.state
        async with grpc.aio.insecure_channel(f"127.0.0.1:{running.grpc_port}") as channel:
            call = stub(channel).Process()
            await decided(call)
            await call.write(response_headers(200))
            assert (await read(call)).HasField("response_headers")
            await ended_late(call)
        assert state.pool.total_in_flight() == 0 and running.edge.cut["response_timeout"] == 1


async def test_health_answers_with_every_stream_taken_and_one_more_stream_is_refused() -> None:
    async with picker(EppSettings(grpc_port=0, max_streams=2)) as running:
        edge = running.edge
        async with grpc.aio.insecure_channel(f"127.0.0.1:{running.grpc_port}") as channel:
            held = [stub(channel).Process() for _ in range(2)]
            for call in held:
                await call.write(headers_message(POST))
            await wait_until(lambda: edge.streams == 2)
            health = health_pb2_grpc.HealthStub(channel)
            for service in LIVENESS:
                reply = await asyncio.wait_for(
                    health.Check(health_pb2.HealthCheckRequest(service=service)), WAIT_S
                )
                assert reply.status == health_pb2.HealthCheckResponse.SERVING
            extra = stub(channel).Process()
            await extra.write(headers_message(POST))
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await read(extra)
            assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert edge.cut["stream_cap"] == 1 and edge.streams == 2
            exposed = generate_latest(edge.state.metrics.registry).decode()
            assert 'prefix_router_epp_streams_cut_total{reason="stream_cap"} 1.0' in exposed
            assert "prefix_router_epp_streams 2.0" in exposed
            for call in held:
                call.cancel()
        await wait_until(lambda: edge.streams == 0)


def test_the_shipped_liveness_probe_asks_the_health_service() -> None:
    deployment = next(d for d in yaml.safe_load_all(MANIFEST.read_text()) if d["kind"] == "Deployment")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    probe = container["livenessProbe"]["grpc"]
    assert probe["service"] in LIVENESS and probe["port"] == GRPC_PORT


async def test_request_bodies_beyond_the_budget_across_streams_are_answered_503() -> None:
    shared = edge(budget=len(BODY) + 100)
    first, second = PickerStream(shared), PickerStream(shared)
    for stream in (first, second):
        assert await stream.answer(headers_message(POST)) == []
    assert await first.answer(body_message(BODY[:-1], end=False)) == []
    (refused,) = await second.answer(body_message(BODY[:102], end=False))  # one byte over
    assert error_code(refused) == (503, "body_buffer_full") and refused.immediate_response.headers
    assert shared.buffered == len(BODY) - 1 and shared.cut["body_budget"] == 1
    assert shared.state.metrics.rejected.get(("503",)) == 1
    answers = await first.answer(body_message(BODY[-1:], end=True))
    assert answers[0].HasField("request_headers") and shared.buffered == 0
    first.close()
    second.close()
    assert shared.buffered == 0 and shared.state.pool.total_in_flight() == 0


async def test_a_stream_gone_mid_body_gives_its_bytes_back() -> None:
    shared = edge(budget=len(BODY))
    stream = PickerStream(shared)
    await stream.answer(headers_message(POST))
    await stream.answer(body_message(BODY[:50], end=False))
    assert shared.buffered == 50
    stream.close()
    assert shared.buffered == 0


def test_the_default_budget_is_a_few_bodies() -> None:
    shared = edge(**{"limits.max_body_bytes": 1000})
    assert shared.budget == BUFFERED_BODIES * 1000


async def learned(held: int) -> int:
    """A whole 2xx response (usage, in two messages of 20 bytes and the rest) through a picker whose budget
    is the request body's size, while another stream holds ``held`` bytes of its own request's body: how
    many usage reports its worker learned."""
    shared = edge(budget=len(BODY), **{"tenants.decision_headers": True})
    stream, other = PickerStream(shared), PickerStream(shared)
    await stream.answer(headers_message(POST))
    await stream.answer(body_message(BODY, end=True))
    await other.answer(headers_message(POST))
    assert await other.answer(body_message(BODY[:held], end=False)) == []
    await stream.answer(response_headers(200))
    usage = orjson.dumps({"usage": {"prompt_tokens": 80, "prompt_tokens_details": {"cached_tokens": 16}}})
    for part, end in ((usage[:20], False), (usage[20:], True)):
        message = ext.ProcessingRequest(response_body=ext.HttpBody(body=part, end_of_stream=end))
        (echo,) = await stream.answer(message)
        assert echo.HasField("response_body")
    assert shared.buffered == held and shared.state.pool.total_in_flight() == 0
    stream.close()
    other.close()
    return sum(f.reports for f in shared.state.router.feedback.values())


async def test_a_response_beyond_the_budget_is_passed_on_but_not_learned_from() -> None:
    assert await learned(held=len(BODY) - 200) == 1
    assert await learned(held=len(BODY) - 30) == 0  # its first 20 bytes fit, the rest does not
