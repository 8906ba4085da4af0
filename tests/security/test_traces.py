"""What an OpenTelemetry span may carry: names, counts and hashes. Exported to an OTLP receiver started
here, a traced exchange (a client key, a worker key, a failed attempt on a worker gone, then an answer)
leaves no prompt text, reply text, client or worker key, tenant id or upstream address in any span."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import orjson
import pytest

from prefix_router.node.request.auth import tenant_of, tenant_salt
from prefix_router.protocol import POLICY_HEADER
from support.otlp import Receiver

CLIENT_KEY = "sk-client-very-secret-0001"
WORKER_KEY = "wk-worker-very-secret-0002"
PROMPT = "the launch code is swordfish-7741"
REPLY = "a reply nobody else may read"


@pytest.fixture
async def receiver(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Receiver]:
    started = await Receiver("http/protobuf").start()
    for name, value in started.env.items():
        monkeypatch.setenv(name, value)
    try:
        yield started
    finally:
        await started.stop()


async def test_no_secret_text_or_address_in_any_span(
    receiver: Receiver, fake_engine: Any, start_router: Any, kit: Any
) -> None:
    gone, engine = await fake_engine("a-gone"), await fake_engine("b", reply=REPLY, cached_tokens=8)
    workers = [{"url": e.url, "name": e.name, "models": ["m"], "api_key": WORKER_KEY} for e in (gone, engine)]
    settings = {"auth.api_keys": [CLIENT_KEY], "retries.max_attempts": 2, "tenants.cache_salt": True}
    router = await start_router(*workers, settings=settings)
    assert gone.running is not None
    await gone.running.stop()  # its next request fails to connect: retried on b
    body = {"model": "m", "messages": [{"role": "user", "content": PROMPT}]}
    headers = {"Authorization": f"Bearer {CLIENT_KEY}", POLICY_HEADER: "round_robin"}
    status, _, raw = await kit.post(router.url, body, headers=headers)
    assert status == 200 and REPLY.encode() in raw
    attempts = await receiver.wait(2, "prefix_router.upstream")
    await receiver.wait(1, "prefix_router.request")
    assert {a.attributes["prefix_router.worker"] for a in attempts} == {"a-gone", "b"}  # the failure traced
    exported = b"".join(receiver.raw)
    shown = exported + orjson.dumps([s.__dict__ for s in receiver.spans])
    headers_ = {"Authorization": f"Bearer {CLIENT_KEY}"}
    never = [PROMPT, "swordfish", REPLY, CLIENT_KEY, WORKER_KEY, tenant_of(headers_), tenant_salt(headers_)]
    never += [e.url for e in (gone, engine)] + [e.url.removeprefix("http://") for e in (gone, engine)]
    for text in never:
        assert text is not None and text.encode() not in shown, text
