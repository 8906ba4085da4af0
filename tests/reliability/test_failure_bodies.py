"""The 502 and 504 the router makes itself name the worker that failed and never its address (the failure
text of the upstream client, ``Cannot connect to host 127.0.0.1:PORT``, stays in the router's log): an
engine process killed after admission (its port refuses connections) and one frozen (SIGSTOP: it accepts
nothing more and answers nothing)."""

from __future__ import annotations

from typing import Any

import orjson

QUICK = {"timeouts.first_byte_s": 0.5, "timeouts.connect_s": 0.5, "health.fail_threshold": 10}


def assert_names_the_worker_only(body: bytes, engine: Any, code: str) -> None:
    error = orjson.loads(body)["error"]
    assert error["code"] == code and error["type"] == "upstream_error"
    assert "sim-a" in error["message"]
    for address in ("127.0.0.1", "localhost", str(engine.port), engine.url):
        assert address not in body.decode(), (address, body)


async def test_a_refused_port_gives_a_502_naming_the_worker(
    sim_process: Any, start_router: Any, kit: Any
) -> None:
    engine = await sim_process()
    router = await start_router({"url": engine.url, "name": "sim-a"}, settings=QUICK)
    assert router.state.pool.require("sim-a").health.healthy
    await engine.kill()
    status, _, body = await kit.post(router.url)
    assert status == 502
    assert_names_the_worker_only(body, engine, "upstream_unavailable")


async def test_a_hung_worker_gives_a_504_naming_the_worker(
    sim_process: Any, start_router: Any, kit: Any
) -> None:
    engine = await sim_process()
    router = await start_router({"url": engine.url, "name": "sim-a"}, settings=QUICK)
    engine.freeze()
    status, _, body = await kit.post(router.url)
    assert status == 504
    assert_names_the_worker_only(body, engine, "upstream_timeout")
    await kit.wait_until(lambda: kit.quiescent(router))
