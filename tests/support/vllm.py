"""Real vLLM engines for the end-to-end tests (``tests/e2e/vllm/``): one fleet for that whole package
(its ``vllm_fleet`` fixture), stopped as soon as the package's tests are done.

Two instances of the CPU build (``make vllm``), one core each, small caches (``CACHE_TOKENS``: 24 blocks
of 128 tokens, so that a test fills one with a few prompts) and KV cache events on, with a replay socket
each (so the precise-mode tests subscribe to the same engines; the config a router needs is
``workers_config``). SmolLM2-135M with its own weights (dequantized from the GGUF). A missing venv fails
the tests that need it: ``make test`` installs it.

The helpers below are what the package's modules share: prompts (``prose``, ``chat``), plain HTTP
(``post_json``, ``reset_caches``), and a precise-mode router with its per-request readings
(``precise_router``, ``ask``). Prompts stay at a few hundred tokens: on the CPU build a cold prompt
costs its whole prefill (about 1,000 tokens/s on an idle core; 10-15 tokens/s seen on a core shared
with un-niced engines, where a 1,000-token prompt took 76-98 s).
"""

from __future__ import annotations

import dataclasses
import os
import random
import urllib.request
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from prefix_router.lab.launch.vllm import VllmFleet, VllmSettings, model_dir, unavailable_reason
from support import bodies, needs
from support.routers import RouterFactory, RouterHandle
from support.waiting import wait_until

INSTANCES = 2
BLOCK = 128  # the CPU backend's KV block
CACHE_TOKENS = 24 * BLOCK
MODEL = "smollm2-135m"
VOCABULARY = (
    "the river of light carries old stones past a quiet town where bakers wake before dawn and "
    "children count boats on the water while a clock tower keeps the hours for farmers merchants "
    "teachers and travellers who stop at the bridge to read the notices about markets weather and "
    "trains that leave for the coast every morning at seven"
)
WORDS = VOCABULARY.split()


def fleet_settings(log_dir: Path) -> VllmSettings:
    return VllmSettings(
        instances=INSTANCES,
        kv_cache_tokens=CACHE_TOKENS,
        max_model_len=4096,
        max_num_seqs=8,
        kv_events=True,
        log_dir=log_dir,
        startup_timeout_s=600.0,  # seen past 7 minutes on 2 cores shared with un-niced engines
    )


def pd_fleet_settings(log_dir: Path, prefill: int = 1, decode: int = 1) -> VllmSettings:
    """A disaggregated fleet (``prefill`` producers, ``decode`` consumers of the shared-storage
    connector, their KV folder made on start and removed on stop), sized as ``fleet_settings``."""
    return VllmSettings.disaggregated(
        prefill,
        decode,
        kv_cache_tokens=CACHE_TOKENS,
        max_model_len=4096,
        max_num_seqs=8,
        log_dir=log_dir,
        startup_timeout_s=600.0,
    )


def require_vllm_venv() -> None:
    needs.require("engine")
    reason = unavailable_reason()
    if reason is not None:  # make test installs it (make vllm): missing is a failure, never a skip
        pytest.fail(reason)


def start_fleet(log_dir: Path, settings: VllmSettings | None = None) -> VllmFleet:
    """The fleet of ``settings`` (default ``fleet_settings``; ``pd_fleet_settings`` for P/D), started."""
    require_vllm_venv()
    fleet = VllmFleet(settings or fleet_settings(log_dir))
    fleet.start()
    return fleet


def workers_config(fleet: VllmFleet, events: bool = False) -> list[dict[str, Any]]:
    """``workers:`` entries for a router in front of the fleet (``events``: with ``kv_events``, the
    engine's replay socket included, the model named)."""
    workers = []
    for instance in fleet.instances:
        worker: dict[str, Any] = {"url": instance.url, "name": f"vllm-{instance.index}", "engine": "vllm"}
        if fleet.settings.roles:
            worker["role"] = instance.role
        if events and instance.events_endpoint is not None:
            worker["kv_events"] = {
                "endpoint": instance.events_endpoint,
                "bind": True,
                "topic": "kv",
                "replay_endpoint": instance.replay_endpoint,
                "model": MODEL,
            }
        workers.append(worker)
    return workers


def log_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where the engines' logs go (``PREFIX_ROUTER_VLLM_TEST_LOGS`` keeps them somewhere known)."""
    given = os.environ.get("PREFIX_ROUTER_VLLM_TEST_LOGS")
    return Path(given) if given else tmp_path_factory.mktemp("vllm-logs")


def start_pd_fleet(log_dir: Path, storage: Path | None = None) -> VllmFleet:
    """A disaggregated pair, started: instance 0 a ``kv_producer`` and instance 1 a ``kv_consumer`` of
    vLLM's shared-storage connector (``ExampleConnector``; ../shared/pd-disaggregation.md) on ``storage``
    (None: a temporary folder the fleet removes on stop), without KV events: ``pd_fleet_settings``, as
    ``prefix-router engines vllm --prefill 1 --decode 1`` starts them."""
    require_vllm_venv()
    fleet = VllmFleet(dataclasses.replace(pd_fleet_settings(log_dir), kv_storage_path=storage))
    fleet.start()
    return fleet


# ---------------------------------------------------------------- prompts and plain HTTP


def prose(seed: int, words: int) -> str:
    """``words`` words of the vocabulary, a text of its own per seed (about 1.02 SmolLM2 tokens a word)."""
    rng = random.Random(seed)
    return " ".join(rng.choice(WORDS) for _ in range(words)) + "."


def chat(system: str, question: str, **extra: Any) -> dict[str, Any]:
    return bodies.ask(question, system, MODEL, **({"max_tokens": 4, "temperature": 0} | extra))


async def post_json(url: str, body: dict[str, Any], headers: dict[str, str] | None = None) -> Any:
    async with aiohttp.ClientSession() as http, http.post(url, json=body, headers=headers) as response:
        assert response.status == 200, await response.text()
        return await response.json()


def reset_caches(fleet: VllmFleet) -> None:
    """Empty every engine's prefix cache (``POST /reset_prefix_cache``): a test starts from nothing."""
    for url in fleet.urls:
        urllib.request.urlopen(urllib.request.Request(f"{url}/reset_prefix_cache", method="POST"), timeout=60)


# ---------------------------------------------------------------- precise mode


async def precise_router(
    start_router: RouterFactory, fleet: VllmFleet, *only: int, **settings: Any
) -> RouterHandle:
    """A router in precise mode (SmolLM2's template and tokenizer, the engines' 128-token blocks) in
    front of the fleet's instances ``only`` (default all), subscribed to their events and heard from
    (``hear_from``); every engine's cache is then emptied (the clearing is published with its next step)."""
    workers = workers_config(fleet, events=True)
    chosen = [workers[i] for i in only] if only else workers
    precise = {
        "routing.policy": "prefix",
        "routing.keys.mode": "events",
        "routing.keys.templates": {MODEL: str(model_dir(fleet.settings))},
        "routing.events.block_tokens": BLOCK,
    }
    router = await start_router(*chosen, settings=precise | settings)
    subscribers = router.state.events.subscribers if router.state.events is not None else {}
    assert len(subscribers) == len(chosen) and all(s.running for s in subscribers.values())
    for index in only or range(len(workers)):
        await hear_from(router, fleet, index)
    reset_caches(fleet)
    return router


async def hear_from(router: RouterHandle, fleet: VllmFleet, index: int, tries: int = 20) -> None:
    """Send instance ``index`` prompts of a block or more of their own, straight to it, until the router
    has applied one of its event messages: its subscription has reached the engine. (A PUB drops what it
    publishes before a new subscriber's subscription arrives; the router catches up from the replay
    buffer at the next message, but a test's first request must not be the one lost.)"""
    subscriber = router.state.events.subscribers[f"vllm-{index}"] if router.state.events else None
    assert subscriber is not None
    url = f"{fleet.urls[index]}/v1/chat/completions"
    for attempt in range(tries):
        before = subscriber.stats.applied
        await post_json(url, chat(prose(10_000 + 100 * index + attempt, 2 * BLOCK), "Listening?"))
        try:
            await wait_until(lambda heard=before: subscriber.stats.applied > heard, 2.0)
            return
        except AssertionError:
            continue
    raise AssertionError(f"no kv event of vllm-{index} reached the router in {tries} prompts")


async def ask(router: RouterHandle, messages: list[dict[str, Any]], **more: Any) -> tuple[str, int, int, int]:
    """(worker, predicted, cached, prompt) of one chat request; the reply is appended to ``messages``.
    When the engine had new full blocks of the prompt to cache, returns once their event has arrived
    (vLLM publishes them from the step that computed them, before the answer)."""
    before = event_messages(router)
    raw = await router.openai().chat.completions.with_raw_response.create(
        model=MODEL, messages=messages, max_tokens=4, temperature=0, **more
    )
    answer = raw.parse()
    assert answer.usage is not None and answer.usage.prompt_tokens_details is not None
    cached = answer.usage.prompt_tokens_details.cached_tokens or 0
    prompt = answer.usage.prompt_tokens
    messages.append({"role": "assistant", "content": answer.choices[0].message.content or ""})
    if prompt // BLOCK > cached // BLOCK:
        await wait_until(lambda: event_messages(router) > before, 10.0)
    return (
        raw.headers["x-prefix-router-worker"],
        int(raw.headers["x-prefix-router-prefix-match"]),
        cached,
        prompt,
    )


def event_messages(router: RouterHandle) -> int:
    """Event messages the router has applied to its views (after the replays they asked for), all
    workers."""
    subscribers = router.state.events.subscribers if router.state.events is not None else {}
    return sum(sub.stats.applied for sub in subscribers.values())
