"""One real vLLM engine killed and restarted, watched by two routers at once (the package's last module:
the restart is its slowest step, so both issues' checks share it):

- a router probing health every 0.5 s (no events): ejects the dead engine, sends everything to the one
  left, admits the restarted one again;
- a precise-mode router subscribed to the engine's events, probing too rarely to eject it: its one probe
  during the outage saw the engine down (what confirms the restart that the new process's sequence
  announces: docs/security.md, KV cache events); it routes on the old process's view until the new
  process's first event, and on nothing of the old view after it.
"""

from __future__ import annotations

import asyncio

import pytest

from prefix_router.lab.launch.vllm import VllmFleet
from support.routers import RouterFactory
from support.vllm import ask, chat, post_json, precise_router, prose, workers_config
from support.waiting import wait_until

pytestmark = pytest.mark.timeout(900)  # a restart: up to the fleet's start-up timeout


async def test_an_engine_restarted_mid_run_is_ejected_readmitted_and_its_old_view_dropped(
    vllm_fleet: VllmFleet, start_router: RouterFactory
) -> None:
    precise = await precise_router(start_router, vllm_fleet, 1)
    view = precise.state.router.precise
    conv = [{"role": "system", "content": prose(80, 300)}, {"role": "user", "content": "First?"}]
    await ask(precise, conv[:])
    held = view.held_blocks("vllm-1")
    assert held >= 2

    probes = {"health.interval_s": 0.5, "health.timeout_s": 1.0}
    probing = await start_router(*workers_config(vllm_fleet), settings=probes)
    probing.state.monitor.start()
    victim = probing.state.pool.require("vllm-1")
    await asyncio.to_thread(vllm_fleet.kill, 1)
    await wait_until(lambda: not victim.health.healthy, timeout_s=30)
    watched = precise.state.pool.require("vllm-1")
    assert not await precise.state.monitor.prober.probe(watched)  # the precise router's one probe: down
    assert watched.health.healthy and watched.health.failed_results == 1  # seen failing, not ejected
    client = probing.openai()
    for i in range(4):  # everything goes to the engine that is left
        raw = await client.chat.completions.with_raw_response.create(**chat(prose(900 + i, 20), "There?"))
        assert raw.headers["x-prefix-router-worker"] == "vllm-0"
    await asyncio.to_thread(vllm_fleet.restart, 1)
    await wait_until(lambda: victim.health.healthy, timeout_s=30)

    assert view.held_blocks("vllm-1") == held  # no event from the new process yet: the old view
    restarts = view.stats("vllm-1").restarts
    direct = await post_json(f"{vllm_fleet.urls[1]}/v1/chat/completions", chat(prose(81, 300), "Back?"))
    assert direct["usage"]["prompt_tokens"] > 300
    await wait_until(lambda: view.stats("vllm-1").restarts > restarts, 10.0)  # its first event
    assert view.held_blocks("vllm-1") <= direct["usage"]["prompt_tokens"] // 128 + 1  # the new blocks only
    _, predicted, cached, _ = await ask(precise, conv[:2])
    assert cached == 0 and predicted == 0  # the old process's blocks are gone from engine and view
