"""engine-sim as either side of prefill/decode disaggregation, in its three flows (simulated engines over
real HTTP, in-process): vLLM's ``kv_transfer_params``, shared storage, SGLang's bootstrap."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from prefix_router.lab.launch.engine_sim import running_engines, start_engines
from prefix_router.lab.sim.kv_store import KvStore

MODEL = "sim-demo"
SYSTEM = {"role": "system", "content": "You answer questions about the simulated fleet. " * 30}
NIXL_KEYS = {"do_remote_prefill", "do_remote_decode", "remote_block_ids", "remote_engine_id",
             "remote_request_id", "remote_host", "remote_port", "tp_size"}  # fmt: skip


def body(question: str, **extra: Any) -> dict[str, Any]:
    return {
        "model": MODEL,
        "messages": [SYSTEM, {"role": "user", "content": question}],
        "max_tokens": 8,
    } | extra


async def post(url: str, payload: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    async with aiohttp.ClientSession() as http, http.post(f"{url}/v1/chat/completions", json=payload) as resp:
        return resp.status, await resp.json()


async def reset(url: str) -> None:
    async with aiohttp.ClientSession() as http, http.post(f"{url}/reset_prefix_cache") as resp:
        assert resp.status == 200


def cached(answer: dict[str, Any]) -> int:
    return int(answer["usage"]["prompt_tokens_details"]["cached_tokens"])


@pytest.fixture
async def pd() -> AsyncIterator[list[str]]:
    async with running_engines(2, roles=("prefill", "decode"), profile="cpu-demo", time_scale=0.05) as urls:
        yield urls


COLD = {"model": MODEL, "messages": [{"role": "user", "content": "never prefilled anywhere " * 40}]}


async def test_kv_transfer_params_flow_hands_the_prompt_to_the_decode() -> None:
    async with running_engines(2, profile="cpu-demo", time_scale=0.05) as urls:  # no store: the params only
        await check_kv_transfer_params_flow(*urls)


async def check_kv_transfer_params_flow(prefill_url: str, decode_url: str) -> None:
    asked = {"do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
             "remote_block_ids": None, "remote_host": None, "remote_port": None}  # fmt: skip
    status, first = await post(prefill_url, body("q1", max_tokens=1, stream=False, kv_transfer_params=asked))
    assert status == 200 and first["choices"][0]["finish_reason"] == "length"
    params = first["kv_transfer_params"]
    assert set(params) == NIXL_KEYS
    assert params["do_remote_prefill"] is True and params["do_remote_decode"] is False
    assert params["remote_request_id"] == first["id"] and params["remote_host"] == "127.0.0.1"
    blocks = first["usage"]["prompt_tokens"] // 16  # the cpu-demo profile's 16-token blocks
    assert params["remote_block_ids"] == list(range(blocks)) and isinstance(params["remote_engine_id"], str)
    status, control = await post(decode_url, body("q1"))  # the same prompt without the params: cold
    assert status == 200 and cached(control) == 0
    await reset(decode_url)
    status, answer = await post(decode_url, body("q1", kv_transfer_params=params))
    assert status == 200 and "kv_transfer_params" not in answer
    assert cached(answer) == blocks * 16 and answer["usage"]["completion_tokens"] == 8


async def test_a_prefill_without_remote_decode_returns_no_transfer_params(pd: list[str]) -> None:
    status, answer = await post(pd[0], body("plain", max_tokens=1))
    assert status == 200 and "kv_transfer_params" not in answer
    status, done = await post(
        pd[0], body("plain", max_tokens=2, kv_transfer_params={"do_remote_decode": False})
    )
    assert status == 200 and "kv_transfer_params" not in done


async def test_shared_storage_flow_loads_what_the_prefill_saved(pd: list[str]) -> None:
    prefill_url, decode_url = pd
    status, first = await post(prefill_url, body("q2", max_tokens=1))
    assert status == 200 and cached(first) == 0
    status, answer = await post(decode_url, body("q2"))
    assert status == 200 and cached(answer) == first["usage"]["prompt_tokens"] // 16 * 16
    status, cold = await post(decode_url, COLD)
    assert status == 200 and cached(cold) == 0


async def test_sglang_bootstrap_runs_both_stages_at_once(pd: list[str]) -> None:
    prefill_url, decode_url = pd
    fields = {"bootstrap_host": "127.0.0.1", "bootstrap_port": 8998, "bootstrap_room": 2**62 + 7}
    (p_status, prefilled), (d_status, answer) = await asyncio.gather(
        post(prefill_url, body("q3", **fields)), post(decode_url, body("q3", **fields))
    )
    assert (p_status, d_status) == (200, 200)
    assert prefilled["usage"]["completion_tokens"] == 1  # the prefill engine computes the prompt only
    assert answer["usage"]["completion_tokens"] == 8
    assert cached(answer) == answer["usage"]["prompt_tokens"] // 16 * 16


async def test_a_decode_whose_room_never_comes_fails_in_openai_format() -> None:
    async with running_engines(1, roles=("decode",), profile="cpu-demo", time_scale=0.005) as (url,):
        fields = {"bootstrap_host": "127.0.0.1", "bootstrap_room": 1}
        status, answer = await post(url, body("q4", **fields))
    assert status == 500 and "bootstrap_room 1" in answer["error"]["message"]


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"kv_transfer_params": [1]}, "kv_transfer_params"),
        ({"kv_transfer_params": {"do_remote_prefill": True, "remote_block_ids": "x"}}, "kv_transfer_params"),
        ({"bootstrap_room": -1, "bootstrap_host": "h"}, "bootstrap_room"),
        ({"bootstrap_room": 5}, "bootstrap_host"),
        ({"bootstrap_room": 5, "bootstrap_host": "h", "bootstrap_port": 70_000}, "bootstrap_port"),
    ],
)
async def test_malformed_handoff_fields_are_refused(pd: list[str], extra: dict[str, Any], param: str) -> None:
    status, answer = await post(pd[1], body("bad", **extra))
    assert status == 400 and answer["error"]["param"] == param


async def test_a_colocated_engine_neither_saves_nor_loads(tmp_path: Path) -> None:
    async with running_engines(2, profile="cpu-demo", time_scale=0.05, kv_store=str(tmp_path)) as urls:
        await post(urls[0], body("q5", max_tokens=1))
        status, answer = await post(urls[1], body("q5"))
    assert status == 200 and cached(answer) == 0 and KvStore(tmp_path).files() == 0


def test_engine_processes_share_their_store() -> None:
    with start_engines(2, roles=("prefill", "decode"), profile="cpu-demo", time_scale=0.05) as urls:
        _, first = asyncio.run(post(urls[0], body("q6", max_tokens=1)))
        _, answer = asyncio.run(post(urls[1], body("q6")))
    assert cached(answer) == first["usage"]["prompt_tokens"] // 16 * 16 > 0


def test_the_store_is_bounded(tmp_path: Path) -> None:
    store = KvStore(tmp_path, capacity=3)
    store.save([1, 2, 3, 4, 5])
    assert store.files() == 3
    for room in range(5):
        store.publish(room, room + 10)
    assert store.files() == 6 and store.room(4) == 14 and store.room(99) is None
    store.save([7, 8])
    assert store.match([7, 8, 9]) == 2
