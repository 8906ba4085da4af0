"""Client input the router must refuse or must not echo, under both connection handlers (``http_server``):
a generation request in a ``Content-Encoding`` the router does not decode gets 415 (never read as
identity); a huge model name is quoted cut short in the 404; a request that comes back to the router
through a worker that points at it (a loop) is refused with 508 at once, not looped until the in-flight
cap."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from prefix_router.pool.settings import WorkerSettings
from support.kits import SecurityKit

SERVERS = ["lean", "aiohttp"]
BODY = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]})


@pytest.fixture(params=SERVERS)
def server(request: Any) -> str:
    return str(request.param)


@pytest.fixture
async def router(server: str, echo_engine: Any, start_router: Any) -> Any:
    engine = await echo_engine("w")
    handle = await start_router(engine, settings={"http_server": server})
    handle.engine = engine
    return handle


@pytest.mark.parametrize("encoding", ["compress", "x-custom", "gzip, br"])
async def test_an_encoding_the_router_does_not_decode_gets_415(router: Any, encoding: str) -> None:
    headers = {"Content-Type": "application/json", "Content-Encoding": encoding}
    status, _, body = await SecurityKit.post(router.url, BODY, headers=headers)
    assert status == 415, body
    assert SecurityKit.openai_error(body)["code"] == "unsupported_encoding"
    assert encoding.encode() not in body and not router.engine.seen


async def test_identity_is_no_encoding(router: Any) -> None:
    headers = {"Content-Type": "application/json", "Content-Encoding": "identity"}
    status, _, _ = await SecurityKit.post(router.url, BODY, headers=headers)
    assert status == 200


async def test_a_huge_model_name_is_quoted_cut_short(router: Any) -> None:
    name = "m" * 1_000_000
    status, _, body = await SecurityKit.post(
        router.url, {"model": name, "messages": [{"role": "user", "content": "hi"}]}
    )
    assert status == 404
    assert len(body) < 2048 and SecurityKit.openai_error(body)["code"] == "model_not_found"


async def test_a_worker_pointing_back_at_the_router_is_a_508(router: Any) -> None:
    pool = router.state.pool
    pool.remove("w")
    pool.add(WorkerSettings(url=router.url, name="self", models=["m"]))
    router.admit("self")
    status, _, body = await SecurityKit.post(router.url, BODY)
    assert status == 508, body
    assert SecurityKit.openai_error(body)["code"] == "loop_detected"
    assert pool.total_in_flight() == 0
