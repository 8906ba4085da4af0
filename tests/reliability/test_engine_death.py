"""An engine process killed mid-run (simulated engines, real processes, SIGKILL):

- requests that had not started streaming are retried on another worker and succeed;
- streams already running on it end with a clean SSE error event (a well-formed body, no retry);
- the worker is ejected by the health checks, and the prefix index forgets what it held;
- it is re-admitted when an engine comes back on its address, and serves again;
- nothing stays in flight.
"""

from __future__ import annotations

import asyncio
import gc
import logging
from typing import Any

import orjson
import pytest

from prefix_router.protocol import WORKER_HEADER
from support.bodies import ask

SETTINGS = {
    "health.interval_s": 0.1,
    "health.timeout_s": 0.5,
    "health.fail_threshold": 2,
    "health.success_threshold": 2,
}
SYSTEM = "You are the assistant of a team that tests routers by killing engines. " * 12


def chat(i: int, stream: bool, max_tokens: int = 300) -> dict[str, Any]:
    return ask(f"request {i}", SYSTEM, max_tokens=max_tokens, stream=stream)


def outcome(status: int, headers: Any, raw: bytes, stream: bool, kit: Any) -> str:
    """``ok``, ``cut`` (a stream ended by a clean error event) or what went wrong."""
    if status != 200:
        return f"HTTP {status}"
    if not stream:
        return "ok" if orjson.loads(raw)["choices"] else "empty"
    last = kit.events(raw)[-1]
    if last == b"[DONE]":
        return "ok"
    return "cut" if orjson.loads(last)["error"]["code"] == "upstream_io" else f"bad end {last[:80]!r}"


async def batch(router: Any, kit: Any, n: int, offset: int, max_tokens: int = 300) -> list[tuple[str, str]]:
    """``n`` concurrent requests, half streamed, round robin: (worker, outcome) each."""

    async def one(i: int) -> tuple[str, str]:
        stream = i % 2 == 1
        status, headers, raw = await kit.post(
            router.url, body=chat(offset + i, stream, max_tokens), headers=kit.RR
        )
        return headers.get(WORKER_HEADER, "?"), outcome(status, headers, raw, stream, kit)

    return list(await asyncio.gather(*(one(i) for i in range(n))))


def streaming_on(router: Any, worker: str) -> bool:
    """Whether a request on ``worker`` is past its first byte (a stream: a non-streamed answer's first
    byte is its end), so that the kill cuts a running stream, whatever the machine's load."""
    requests = router.state.router.load._requests.values()
    return any(r.worker == worker and not r.prefilling for r in requests)


async def test_engine_killed_mid_run(
    sim_process: Any, start_router: Any, kit: Any, caplog: pytest.LogCaptureFixture
) -> None:
    engines = list(await asyncio.gather(*(sim_process() for _ in range(3))))
    workers = [{"url": e.url, "name": f"sim{i}", "models": ["m"]} for i, e in enumerate(engines)]
    router = await start_router(*workers, settings=SETTINGS)
    victim, index = engines[0], router.state.router.index
    await batch(router, kit, 6, 0, max_tokens=4)  # every worker now holds the system prompt
    assert index.blocks_of("sim0") > 0

    running = asyncio.ensure_future(batch(router, kit, 24, 100))  # ~2 s of generation each
    await kit.wait_until(lambda: streaming_on(router, "sim0"), timeout_s=20.0)  # a stream has begun there
    await victim.kill()
    after = await batch(router, kit, 6, 200, max_tokens=8)  # sent before the ejection is noticed
    during = await running

    assert {o for _, o in after} == {"ok"}  # connect failures retried elsewhere
    assert all(o == "ok" for w, o in during if w != "sim0")
    on_victim = [o for w, o in during if w == "sim0"]
    assert on_victim and set(on_victim) <= {"cut"}  # every answer sim0 had started, streamed: cut cleanly
    assert all(o in ("ok", "cut") for _, o in during)  # non-streamed ones were all retried: ok
    assert sum(o == "ok" for _, o in during) == 24 - len(on_victim)

    await kit.wait_until(lambda: not router.state.pool.require("sim0").health.healthy)
    assert index.blocks_of("sim0") == 0  # the index forgot what the dead engine held
    assert router.state.router.summary()["workers"]["sim0"]["indexed_tokens"] == 0  # type: ignore[index]
    assert index.blocks_of("sim1") > 0
    await kit.wait_until(lambda: kit.quiescent(router))

    await sim_process(port=victim.port)  # the engine comes back on its address
    await kit.wait_until(lambda: router.state.pool.require("sim0").health.healthy)
    back = await batch(router, kit, 6, 300, max_tokens=4)
    assert {o for _, o in back} == {"ok"} and "sim0" in {w for w, _ in back}
    await kit.wait_until(lambda: kit.quiescent(router))
    gc.collect()  # an exception nobody retrieved would be reported now
    assert not [r for r in caplog.records if r.name == "asyncio" and r.levelno >= logging.ERROR]
