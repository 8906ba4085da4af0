"""OpenTelemetry traces of ``serve``, exported to an OTLP receiver started here (gRPC and HTTP): one server
span per request, a child of the client's ``traceparent``, with its stages and decision, one client span
per upstream attempt whose own ``traceparent`` the engine receives; and nothing of the kind when off."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

from prefix_router.protocol import POLICY_HEADER
from support.otlp import CLIENT_KIND, ERROR_STATUS, SERVER_KIND, Receiver

ROOT = Path(__file__).resolve().parents[2]
CLIENT_TRACE = "0af7651916cd43dd8448eb211c80319c"
CLIENT_SPAN = "b7ad6b7169203331"
KEY = "sk-tenant-one-key"
CHAT = {
    "model": "m",
    "messages": [{"role": "system", "content": "s" * 600}, {"role": "user", "content": "a secret prompt"}],
}
SETTINGS = {"auth.api_keys": [KEY]}
STREAM = {"stream": True, "stream_options": {"include_usage": True}}


def client_headers(**extra: str) -> dict[str, str]:
    return {"traceparent": f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01", "Authorization": f"Bearer {KEY}", **extra}


@pytest.fixture(params=["grpc", "http/protobuf"])
async def receiver(request: Any, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Receiver]:
    """A receiver of either protocol, and the environment that points the next router at it."""
    started = await Receiver(request.param).start()
    for name, value in started.env.items():
        monkeypatch.setenv(name, value)
    try:
        yield started
    finally:
        await started.stop()


async def post(url: str, body: Any, headers: dict[str, str]) -> tuple[int, bytes]:
    async with aiohttp.ClientSession() as http:
        resp = await http.post(url + "/v1/chat/completions", data=orjson.dumps(body), headers=headers)
        return resp.status, await resp.read()


async def test_a_streamed_request_is_one_span_with_its_stages_and_the_engine_continues_it(
    receiver: Receiver, fake_engine: Any, start_router: Any
) -> None:
    engine = await fake_engine("a", cached_tokens=32)
    router = await start_router(engine, settings=SETTINGS)
    status, _ = await post(router.url, {**CHAT, **STREAM}, client_headers())
    assert status == 200
    [request] = await receiver.wait(1, "prefix_router.request")
    [attempt] = await receiver.wait(1, "prefix_router.upstream")
    assert request.kind == SERVER_KIND and attempt.kind == CLIENT_KIND
    assert request.trace_id == attempt.trace_id == CLIENT_TRACE
    assert request.parent == CLIENT_SPAN and attempt.parent == request.span_id
    # the engine's request carries the attempt's span as its parent, in the client's trace
    assert engine.headers[0]["traceparent"] == f"00-{CLIENT_TRACE}-{attempt.span_id}-01"
    assert [name for name, _ in request.events] == ["admitted", "keyed", "decided"]
    attrs = request.attributes
    for decided in (attrs, attempt.attributes):  # the decision: the attempt's, and the request's last
        assert decided["prefix_router.worker"] == "a" and decided["prefix_router.policy"] == "prefix"
        assert decided["prefix_router.branch"] == "load_balance"
    assert attrs["prefix_router.cached_tokens"] == 32 and attrs["http.response.status_code"] == 200
    assert attrs["prefix_router.predicted_tokens"] == 0 and attrs["prefix_router.model"] == "m"
    assert len(attrs["prefix_router.tenant"]) == 16 and attrs["prefix_router.key_tokens"] > 0
    assert [name for name, _ in attempt.events] == ["first_byte", "stream_end"]
    assert attempt.attributes["prefix_router.worker"] == "a"
    assert attempt.attributes["prefix_router.attempt"] == 1
    assert request.service == "prefix-router"


async def test_a_retried_request_has_a_span_per_attempt_and_a_tenant_keeps_its_hash(
    receiver: Receiver, fake_engine: Any, start_router: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OTEL_SERVICE_NAME", "router-east")
    failing, healthy = await fake_engine("a", fail_next=10), await fake_engine("b")
    router = await start_router(failing, healthy, settings={**SETTINGS, "retries.max_attempts": 2})
    for _ in range(2):  # round robin: the first starts on the failing engine
        status, _ = await post(router.url, CHAT, client_headers(**{POLICY_HEADER: "round_robin"}))
        assert status == 200
    requests = await receiver.wait(2, "prefix_router.request")
    attempts = await receiver.wait(3, "prefix_router.upstream")
    first = next(r for r in requests if r.attributes["prefix_router.attempts"] == 2)
    tried = [a for a in attempts if a.parent == first.span_id]
    tried.sort(key=lambda a: a.attributes["prefix_router.attempt"])
    assert [a.attributes["prefix_router.worker"] for a in tried] == ["a", "b"]
    assert [a.attributes["prefix_router.branch"] for a in tried] == ["round_robin"] * 2
    assert tried[0].status == ERROR_STATUS and tried[0].attributes["http.response.status_code"] == 500
    assert tried[1].status != ERROR_STATUS and first.attributes["prefix_router.worker"] == "b"
    assert [h["traceparent"].split("-")[2] for h in failing.headers] == [tried[0].span_id]
    assert len({r.attributes["prefix_router.tenant"] for r in requests}) == 1  # one key, one tenant
    assert {r.service for r in requests} == {"router-east"}


async def test_without_a_client_traceparent_the_request_starts_a_trace(
    receiver: Receiver, fake_engine: Any, start_router: Any
) -> None:
    engine = await fake_engine("a")
    router = await start_router(engine)
    assert (await post(router.url, CHAT, {}))[0] == 200
    [request] = await receiver.wait(1, "prefix_router.request")
    [attempt] = await receiver.wait(1, "prefix_router.upstream")
    assert request.parent == "" and request.trace_id != CLIENT_TRACE
    assert "prefix_router.tenant" not in request.attributes  # no key, no tenant
    version, trace, parent, flags = engine.headers[0]["traceparent"].split("-")
    assert (version, trace, parent) == ("00", request.trace_id, attempt.span_id) and int(flags, 16) & 1


async def test_a_sampler_that_drops_exports_nothing_and_still_propagates(
    receiver: Receiver, fake_engine: Any, start_router: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", "always_off")
    engine = await fake_engine("a")
    router = await start_router(engine)
    assert (await post(router.url, CHAT, client_headers()))[0] == 200
    await router.running.stop()  # flushes whatever was queued
    assert receiver.spans == []
    _, trace, parent, flags = engine.headers[0]["traceparent"].split("-")
    assert trace == CLIENT_TRACE and not int(flags, 16) & 1  # the trace goes on, not sampled
    assert parent not in (CLIENT_SPAN, "0" * 16)  # through the router's own span, unrecorded


async def test_off_the_client_traceparent_passes_through_and_nothing_is_traced(
    fake_engine: Any, start_router: Any
) -> None:
    engine = await fake_engine("a")
    router = await start_router(engine)
    assert router.state.tracing is None
    assert (await post(router.url, CHAT, client_headers()))[0] == 200
    assert engine.headers[0]["traceparent"] == f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"


OFF_PATH = """
import asyncio, sys
from aiohttp import web
OURS = "prefix_router.node.telemetry.otel"
from prefix_router.node.config import load_config
from prefix_router.proxy.run.app import create_app
from prefix_router.node.life.server import start
import aiohttp

async def engine(request):
    await request.read()
    return web.json_response({"choices": [{"message": {"content": "hi"}}], "usage": {"prompt_tokens": 3}})

async def main():
    app = web.Application()
    app.router.add_post("/v1/chat/completions", engine)
    app.router.add_get("/v1/models", lambda r: web.json_response({"data": [{"id": "m"}]}))
    app.router.add_get("/health", lambda r: web.Response())
    up = await start(app)
    config = load_config(env={}, overrides={"workers": [{"name": "a", "url": up.url, "models": ["m"]}]})
    router = await start(create_app(config))
    async with aiohttp.ClientSession() as http:
        for _ in range(20):
            resp = await http.post(router.url + "/v1/chat/completions", json={"model": "m", "messages": [
                {"role": "user", "content": "hi"}]}, headers={"traceparent": PARENT})
            assert resp.status == 200, resp.status
    await router.stop(); await up.stop()
    # redis imports OpenTelemetry's API (for its own metrics) when it is installed: not its SDK's tracing
    print(sorted(m for m in sys.modules if m.startswith(("opentelemetry.sdk.trace", OURS))))

asyncio.run(main())
""".replace("PARENT", repr(f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"))


@pytest.mark.parametrize("on", [False, True])
def test_off_the_request_path_makes_no_span(on: bool, free_port: Any) -> None:
    """Tracing off (no endpoint): requests served, with a client traceparent, and neither the SDK's tracing
    nor the router's OpenTelemetry module imported, so not one span object made (on, to a receiver that is
    not there: both imported, which shows the check sees them)."""
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": f"{ROOT / 'src'}"}
    if on:
        env |= {
            "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{free_port()}",
            "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
            "OTEL_EXPORTER_OTLP_TIMEOUT": "1",
        }
    proc = subprocess.run(
        [sys.executable, "-c", OFF_PATH], capture_output=True, text=True, timeout=120, env=env, check=False
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    modules = proc.stdout.strip().splitlines()[-1]
    if on:
        assert "'prefix_router.node.telemetry.otel'" in modules and "'opentelemetry.sdk.trace'" in modules
    else:
        assert modules == "[]"
