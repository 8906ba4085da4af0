"""OpenTelemetry traces of the endpoint picker: a span per ext_proc stream, a child of the client's
``traceparent``, with the decision, and the attempt's ``traceparent`` set on the request the gateway sends
to the engine (message by message, then through a real Envoy); exported to an OTLP receiver (gRPC)
started here."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import orjson
import pytest
from envoy.service.ext_proc.v3 import external_processor_pb2 as ext

from prefix_router.epp import PickerStream
from prefix_router.node import tracing_from_env
from support.extproc import BODY, POST, body_message, destination_of, edge, headers_message, response_headers
from support.gateway import Gateways
from support.otlp import CLIENT_KIND, SERVER_KIND, Receiver

CLIENT_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN = "00f067aa0ba902b7"
KEY = "sk-epp-tenant"


@pytest.fixture
async def receiver() -> AsyncIterator[Receiver]:
    started = await Receiver("grpc").start()
    try:
        yield started
    finally:
        await started.stop()


def set_headers(answer: ext.ProcessingResponse) -> dict[str, str]:
    mutation = answer.request_headers.response.header_mutation
    return {h.header.key: h.header.raw_value.decode() for h in mutation.set_headers}


async def test_a_stream_is_one_span_and_the_gateway_sends_its_attempts_traceparent(
    receiver: Receiver,
) -> None:
    shared = edge(**{"auth.api_keys": [KEY]})
    make = tracing_from_env(receiver.env)
    assert make is not None
    traced = shared.state.tracing = make()
    stream = PickerStream(shared)
    headers = {**POST, "traceparent": f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01", "authorization": f"Bearer {KEY}"}
    await stream.answer(headers_message(headers))
    answer = (await stream.answer(body_message(BODY, end=True)))[0]
    await stream.answer(response_headers(200))
    usage = {"usage": {"prompt_tokens": 80, "prompt_tokens_details": {"cached_tokens": 48}}}
    await stream.answer(
        ext.ProcessingRequest(response_body=ext.HttpBody(body=orjson.dumps(usage), end_of_stream=True))
    )
    stream.close()
    await traced.close()  # flushes
    [request] = await receiver.wait(1, "prefix_router.request")
    [attempt] = await receiver.wait(1, "prefix_router.upstream")
    assert request.kind == SERVER_KIND and attempt.kind == CLIENT_KIND
    assert (request.trace_id, request.parent) == (CLIENT_TRACE, CLIENT_SPAN)
    assert attempt.parent == request.span_id
    assert set_headers(answer)["traceparent"] == f"00-{CLIENT_TRACE}-{attempt.span_id}-01"
    assert [name for name, _ in request.events] == ["admitted", "keyed", "decided"]
    assert [name for name, _ in attempt.events] == ["first_byte", "stream_end"]
    worker = request.attributes["prefix_router.worker"]
    address, _ = destination_of(answer)
    assert worker in {"a", "b", "c"} and address not in str(request.attributes)
    assert request.attributes["prefix_router.cached_tokens"] == 48
    assert (
        request.attributes["http.response.status_code"] == 200
        and "prefix_router.tenant" in request.attributes
    )


async def test_through_a_real_envoy_the_engine_continues_the_pickers_trace(
    fake_engine: Any, gateways: Gateways, receiver: Receiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in receiver.env.items():
        monkeypatch.setenv(name, value)
    engine = await fake_engine("a", cached_tokens=16)
    gateway = await gateways.start(engine)
    headers = {"traceparent": f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01", "content-type": "application/json"}
    async with aiohttp.ClientSession() as http:
        resp = await http.post(gateway.url + "/v1/chat/completions", data=BODY, headers=headers)
        assert resp.status == 200, await resp.text()
    [request] = await receiver.wait(1, "prefix_router.request")
    [attempt] = await receiver.wait(1, "prefix_router.upstream")
    assert (request.trace_id, request.parent, attempt.parent) == (CLIENT_TRACE, CLIENT_SPAN, request.span_id)
    assert engine.headers[0]["traceparent"] == f"00-{CLIENT_TRACE}-{attempt.span_id}-01"
    assert (
        request.attributes["prefix_router.worker"] == "a"
        and request.attributes["prefix_router.cached_tokens"] == 16
    )
