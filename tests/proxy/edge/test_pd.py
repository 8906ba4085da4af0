"""Prefill/decode disaggregation through the router (``proxy/edge/pd.py``): the three flows' bodies as
each engine family documents them, the client's one answer, and the faults, against fake engines."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import orjson
import pytest

from prefix_router.protocol import REQUEST_ID_HEADER, WORKER_HEADER

LONG = "the shared system prompt of every turn " * 40
CHAT: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": LONG + "first question"}]}
REMOTE = {"do_remote_decode": False, "do_remote_prefill": True, "remote_engine_id": "p-engine",
          "remote_block_ids": [1, 2, 3], "remote_host": "10.0.0.7", "remote_port": 5600}  # fmt: skip


def chat(i: int) -> dict[str, Any]:
    """A prompt of its own: a decode worker holds none of it (the decider never skips its prefill)."""
    return {"model": "m", "messages": [{"role": "user", "content": f"{i} " + LONG}]}


def role(engine: Any, name: str, **extra: Any) -> dict[str, Any]:
    return {"url": engine.url, "name": engine.name, "role": name, **extra}


async def post(url: str, body: Any = CHAT, headers: dict[str, str] | None = None) -> tuple[int, Any, bytes]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=20)) as http:
        resp = await http.post(url + "/v1/chat/completions", data=orjson.dumps(body), headers=headers)
        return resp.status, resp.headers, await resp.read()


async def fleet(fake_engine: Any, start_router: Any, flow: str, settings: dict[str, Any] | None = None,
                prefill: int = 1, **behaviour: Any) -> tuple[Any, list[Any], Any]:  # fmt: skip
    prefills = [await fake_engine(f"p{i}", **behaviour) for i in range(prefill)]
    decode = await fake_engine("d")
    entries = [role(p, "prefill", bootstrap_port=9000 + i) for i, p in enumerate(prefills)]
    router = await start_router(
        *entries, role(decode, "decode"), settings={"disaggregation.flow": flow, **(settings or {})}
    )
    return router, prefills, decode


async def test_shared_storage_prefills_one_token_then_sends_the_request_to_decode(
    fake_engine: Any, start_router: Any
) -> None:
    router, (p,), d = await fleet(fake_engine, start_router, "shared_storage")
    body = {**CHAT, "max_completion_tokens": 50, "stream": True, "stream_options": {"include_usage": True}}
    status, headers, raw = await post(router.url, body, {REQUEST_ID_HEADER: "client-rid-1"})
    assert status == 200 and headers[REQUEST_ID_HEADER] == "client-rid-1"
    (prefill,), (decode,) = p.bodies, d.bodies
    expected = {k: v for k, v in body.items() if k != "stream_options"}
    assert prefill == expected | {"max_tokens": 1, "max_completion_tokens": 1, "stream": False}
    assert decode == body  # the client's request as it came
    assert d.generations[0].body == orjson.dumps(body)  # byte for byte
    ids = [{k.lower(): v for k, v in e.headers[0].items()}[REQUEST_ID_HEADER] for e in (p, d)]
    assert ids == ["client-rid-1", "client-rid-1"]
    assert b"data: [DONE]" in raw and b"hello" in raw  # the decode's stream, relayed
    metrics = router.state.metrics
    assert metrics.pd_requests.get(("split",)) == 1 and metrics.pd_prefill.count == 1
    assert metrics.pd_decode_ttft.count == 1


async def test_kv_transfer_params_go_from_the_prefill_answer_to_the_decode(
    fake_engine: Any, start_router: Any
) -> None:
    router, (p,), d = await fleet(fake_engine, start_router, "kv_transfer_params", kv_transfer_params=REMOTE)
    body = {**CHAT, "max_tokens": 30, "n": 2, "tools": [{"type": "function", "function": {"name": "f"}}]}
    status, headers, raw = await post(router.url, body)
    assert status == 200 and headers[WORKER_HEADER] == "d"
    (prefill,), (decode,) = p.bodies, d.bodies
    assert prefill == body | {"max_tokens": 1, "stream": False, "kv_transfer_params": {
        "do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
        "remote_block_ids": None, "remote_host": None, "remote_port": None}}  # fmt: skip
    assert decode == body | {"kv_transfer_params": REMOTE}
    answer = orjson.loads(raw)
    assert answer["choices"][0]["message"]["content"] == "hello from the fake engine"


async def test_sglang_sends_both_stages_at_once_with_one_bootstrap_room(
    fake_engine: Any, start_router: Any
) -> None:
    router, (p,), d = await fleet(fake_engine, start_router, "sglang_bootstrap", delay_s=0.3)
    status, _, raw = await post(router.url, {**CHAT, "stream": True})
    assert status == 200 and b"data: [DONE]" in raw
    (prefill,), (decode,) = p.bodies, d.bodies
    assert prefill == decode  # one body for both
    assert decode["bootstrap_host"] == "127.0.0.1" and decode["bootstrap_port"] == 9000
    room = decode["bootstrap_room"]
    assert isinstance(room, int) and 0 <= room < 2**63
    assert {k: v for k, v in decode.items() if not k.startswith("bootstrap_")} == {**CHAT, "stream": True}
    # concurrent: the client had the decode's answer while the prefill (0.3 s) still ran (then cancelled)
    assert len(p.generations) == 1 and p.answered == 0


async def test_the_decider_skips_the_prefill_when_the_decode_worker_holds_the_prompt(
    fake_engine: Any, start_router: Any
) -> None:
    router, (p,), d = await fleet(fake_engine, start_router, "shared_storage")
    assert (await post(router.url))[0] == 200
    again = {**CHAT, "messages": [{"role": "user", "content": LONG + "first question!"}]}
    assert (await post(router.url, again))[0] == 200
    assert len(p.generations) == 1 and len(d.generations) == 2  # the second went straight to decode
    assert router.state.metrics.pd_requests.get(("decode_holds_prefix",)) == 1
    cold = {**CHAT, "messages": [{"role": "user", "content": "x"}]}  # short, but never seen: prefilled
    assert (await post(router.url, cold))[0] == 200
    assert len(p.generations) == 2


async def test_a_failed_prefill_is_retried_on_another_prefill_worker(
    fake_engine: Any, start_router: Any
) -> None:
    bad = await fake_engine("bad", fail_next=100)
    good = await fake_engine("good")
    d = await fake_engine("d")
    router = await start_router(
        role(bad, "prefill"), role(good, "prefill"), role(d, "decode"),
        settings={"routing.policy": "round_robin", "health.fail_threshold": 100},
    )  # fmt: skip
    for i in range(2):  # round robin: at least one of them starts on "bad"
        assert (await post(router.url, chat(i)))[0] == 200
    assert len(bad.generations) >= 1 and len(good.generations) == 2 and len(d.generations) == 2
    assert router.state.metrics.pd_requests.get(("split",)) == 2


async def test_every_prefill_failing_serves_the_request_colocated_on_decode(
    fake_engine: Any, start_router: Any
) -> None:
    router, (_p,), d = await fleet(fake_engine, start_router, "kv_transfer_params", fail_next=100)
    status, headers, _ = await post(router.url)
    assert status == 200 and headers[WORKER_HEADER] == "d"
    assert d.bodies == [CHAT]  # colocated: the client's body, no transfer parameters
    assert router.state.metrics.pd_requests.get(("prefill_failed",)) == 1


async def test_a_hung_prefill_leaves_time_for_the_colocated_decode(
    fake_engine: Any, start_router: Any
) -> None:
    router, (_p,), d = await fleet(
        fake_engine, start_router, "shared_storage", {"timeouts.first_byte_s": 1.0}, hang=True
    )
    status, _, _ = await post(router.url)
    assert status == 200 and len(d.generations) == 1
    assert router.state.metrics.pd_requests.get(("prefill_failed",)) == 1
    assert router.state.pool.total_in_flight() == 0


async def test_a_decode_failure_before_the_first_byte_is_retried_on_another_decode_worker(
    fake_engine: Any, start_router: Any
) -> None:
    p = await fake_engine("p", kv_transfer_params=REMOTE)
    bad = await fake_engine("bad", fail_next=100)
    good = await fake_engine("good")
    router = await start_router(
        role(p, "prefill"), role(bad, "decode"), role(good, "decode"),
        settings={"disaggregation.flow": "kv_transfer_params", "routing.policy": "round_robin",
                  "health.fail_threshold": 100},
    )  # fmt: skip
    for i in range(2):
        status, headers, _ = await post(router.url, chat(i))
        assert status == 200 and headers[WORKER_HEADER] == "good"
    assert all(b.get("kv_transfer_params") == REMOTE for b in good.bodies)
    assert len(p.generations) == 2  # the retry reuses the prefill's handoff


async def test_without_a_healthy_prefill_worker_it_runs_colocated(
    fake_engine: Any, start_router: Any
) -> None:
    router, (p,), d = await fleet(fake_engine, start_router, "shared_storage")
    router.state.pool.report(router.state.pool.require("p0"), False)
    for _ in range(3):
        router.state.pool.report(router.state.pool.require("p0"), False)
    assert (await post(router.url))[0] == 200
    assert len(p.generations) == 0 and d.bodies == [CHAT]
    assert router.state.metrics.pd_requests.get(("no_prefill_worker",)) == 1


async def test_a_client_leaving_during_the_prefill_cancels_it(fake_engine: Any, start_router: Any) -> None:
    router, (_p,), d = await fleet(fake_engine, start_router, "shared_storage", hang=True)
    with pytest.raises(asyncio.TimeoutError):
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=0.5)) as http:
            await http.post(router.url + "/v1/chat/completions", data=orjson.dumps(CHAT))
    for _ in range(50):
        if router.state.pool.total_in_flight() == 0:
            break
        await asyncio.sleep(0.05)
    assert router.state.pool.total_in_flight() == 0 and len(d.generations) == 0


async def test_a_mixed_fleet_without_prefill_workers_is_colocated(
    fake_engine: Any, start_router: Any
) -> None:
    a = await fake_engine("a")
    router = await start_router(role(a, "both"))
    assert (await post(router.url))[0] == 200
    assert a.bodies == [CHAT] and router.state.metrics.pd_requests.get(("split",)) == 0


async def test_the_access_line_names_both_workers(
    fake_engine: Any, start_router: Any, caplog: pytest.LogCaptureFixture
) -> None:
    router, _, _ = await fleet(fake_engine, start_router, "shared_storage", {"access_log": True})
    with caplog.at_level("INFO", logger="prefix_router.access"):
        assert (await post(router.url))[0] == 200
    line = next(r.getMessage() for r in caplog.records if r.name == "prefix_router.access")
    assert " worker=d " in line and " pd=split prefill_worker=p0 prefill_ms=" in line


async def test_a_prefill_worker_added_through_the_admin_api_splits_the_next_requests(
    fake_engine: Any, start_router: Any
) -> None:
    p = await fake_engine("p")
    d = await fake_engine("d")
    token = "admin-token-for-roles"
    router = await start_router(role(d, "decode"), settings={"auth.admin_token": token})
    assert (await post(router.url, chat(1)))[0] == 200 and not p.generations  # no prefill worker yet
    async with aiohttp.ClientSession() as http:
        resp = await http.post(
            router.url + "/admin/workers",
            json={"url": p.url, "name": "p", "role": "prefill"},
            headers={"Authorization": f"Bearer {token}"},
        )
        assert resp.status == 201 and (await resp.json())["worker"]["role"] == "prefill"
        refused = await http.post(
            router.url + "/admin/workers",
            json={"url": "http://10.9.9.9:1", "role": "sideways"},
            headers={"Authorization": f"Bearer {token}"},
        )
        assert refused.status == 400 and "role" in (await refused.json())["error"]["message"]
    assert (await post(router.url, chat(2)))[0] == 200
    assert len(p.generations) == 1 and p.bodies[0]["max_tokens"] == 1


async def test_sglang_a_decode_retried_is_paired_again_with_a_fresh_room(
    fake_engine: Any, start_router: Any
) -> None:
    p = await fake_engine("p")
    bad = await fake_engine("bad", fail_next=100)
    good = await fake_engine("good")
    router = await start_router(
        role(p, "prefill"), role(bad, "decode"), role(good, "decode"),
        settings={"disaggregation.flow": "sglang_bootstrap", "routing.policy": "round_robin",
                  "health.fail_threshold": 100},
    )  # fmt: skip
    for i in range(2):
        status, headers, _ = await post(router.url, chat(i))
        assert status == 200 and headers[WORKER_HEADER] == "good"
    rooms = [b["bootstrap_room"] for b in p.bodies]
    assert len(rooms) == len(set(rooms)) == len(bad.generations) + len(good.generations)
    assert {b["bootstrap_room"] for b in bad.bodies + good.bodies} == set(
        rooms
    )  # each decode has its prefill
    assert router.state.metrics.pd_requests.get(("split",)) == 2


# ---------------------------------------------------------------- the decode charged at the choice


async def wait_for(check: Any) -> None:
    for _ in range(100):
        if check():
            return
        await asyncio.sleep(0.02)
    raise AssertionError("never happened")


async def test_the_decode_worker_is_charged_while_the_prefill_runs_so_decodes_spread(
    fake_engine: Any, start_router: Any
) -> None:
    p = await fake_engine("p", delay_s=0.6)
    d1, d2 = await fake_engine("d1"), await fake_engine("d2")
    router = await start_router(role(p, "prefill"), role(d1, "decode"), role(d2, "decode"))
    pool = router.state.pool
    first = asyncio.ensure_future(post(router.url, chat(1)))
    await wait_for(lambda: pool.total_in_flight() == 2)  # the prefill and its reserved decode
    reserved = [n for n in ("d1", "d2") if pool.in_flight(n) == 1]
    assert len(reserved) == 1 and not d1.generations and not d2.generations  # charged, not sent
    second = asyncio.ensure_future(post(router.url, chat(2)))
    (s1, h1, _), (s2, h2, _) = await asyncio.gather(first, second)
    assert s1 == s2 == 200 and h1[WORKER_HEADER] == reserved[0]
    assert {h1[WORKER_HEADER], h2[WORKER_HEADER]} == {"d1", "d2"}  # the second saw the first coming
    assert len(d1.generations) == len(d2.generations) == 1
    assert pool.total_in_flight() == 0 and router.state.router.load.in_flight(reserved[0]) == 0


async def test_a_failed_prefill_moves_the_reservation_to_a_colocated_decode(
    fake_engine: Any, start_router: Any
) -> None:
    router, (p,), d = await fleet(fake_engine, start_router, "shared_storage", fail_next=100)
    p.b.delay_s = 0.5  # the prefill fails, slowly
    task = asyncio.ensure_future(post(router.url))
    load = router.state.router.load
    await wait_for(lambda: load.in_flight("d") == 1)  # the decode reserved at the choice, nothing sent yet
    assert not d.generations
    status, headers, _ = await task
    assert status == 200 and headers[WORKER_HEADER] == "d" and d.bodies == [CHAT]
    assert router.state.metrics.pd_requests.get(("prefill_failed",)) == 1
    # the reservation (its prompt predicted handed over) released, the decode charged anew with its own
    # prefill: the request's decision (the feed, by its route id) predicts nothing cached
    (entry,) = router.state.decisions.last(10)
    assert entry.worker == "d" and entry.predicted_tokens == 0 and load.in_flight("d") == 0
    assert router.state.pool.total_in_flight() == 0


async def test_every_fault_path_leaves_nothing_in_flight(fake_engine: Any, start_router: Any) -> None:
    # the prefill hangs past its share of the budget, the decode worker answers 500: nothing opens
    p = await fake_engine("p", hang=True)
    d = await fake_engine("d", fail_next=100)
    router = await start_router(
        role(p, "prefill"), role(d, "decode"),
        settings={"timeouts.first_byte_s": 0.6, "health.fail_threshold": 100},
    )  # fmt: skip
    assert (await post(router.url))[0] == 500  # the decode worker's answer, relayed
    assert router.state.pool.total_in_flight() == 0
    # the prefill answers, the decode fails: the reservation was taken by the failed attempt
    p.b.hang = False
    assert (await post(router.url, chat(3)))[0] == 500
    assert router.state.pool.total_in_flight() == 0
    # the decode worker removed while the prefill ran: the reservation is released
    p.b.delay_s = 0.5
    d.b.fail_next = 0
    task = asyncio.ensure_future(post(router.url, chat(4)))
    await wait_for(lambda: router.state.pool.total_in_flight() == 2)
    router.state.pool.remove("d")
    status, _, _ = await task
    assert status in (429, 503) and router.state.pool.total_in_flight() == 0  # no decode worker left
    assert router.state.router.load.in_flight("d") == 0


async def test_a_role_changed_in_place_through_the_admin_api(fake_engine: Any, start_router: Any) -> None:
    p, d = await fake_engine("p"), await fake_engine("d")
    token = "admin-token-for-roles"
    router = await start_router(role(p, "both"), role(d, "decode"), settings={"auth.admin_token": token})
    auth = {"Authorization": f"Bearer {token}"}
    async with aiohttp.ClientSession() as http:

        async def patch(name: str, body: Any) -> tuple[int, Any]:
            resp = await http.patch(f"{router.url}/admin/workers/{name}", json=body, headers=auth)
            return resp.status, await resp.json()

        status, answer = await patch("p", {"role": "prefill"})
        assert status == 200 and answer["worker"]["role"] == "prefill"
        assert (await post(router.url, chat(1)))[0] == 200
        assert p.bodies[-1]["max_tokens"] == 1 and len(d.generations) == 1  # split
        assert (await patch("p", {"role": "sideways"}))[0] == 400
        assert (await patch("p", {"role": "both", "url": "http://x:1"}))[0] == 400  # the role only
        assert (await patch("nobody", {"role": "both"}))[0] == 404
        unauthorized = await http.patch(f"{router.url}/admin/workers/p", json={"role": "both"})
        assert unauthorized.status == 401
        assert (await patch("p", {"role": "both"}))[0] == 200
    assert (await post(router.url, chat(2)))[0] == 200
    assert router.state.metrics.pd_requests.get(("split",)) == 1 and not router.state.pool.disaggregated
    assert len(p.generations) + len(d.generations) == 3  # colocated on one of them
