"""Routing policies A/B on real llama.cpp instances: same request sequence, engine-side cache reuse and TTFT.

Run as a benchmark (prints the table for docs/benchmarks.md (Real engines)):
    .venv/bin/python tests/e2e/llama_ab.py --instances 3 --prompts 6 --rounds 4 --seeds 3

The engines are llama-cpp-python 0.3.36 servers with SmolLM2-135M-Instruct Q4_1 (``prefix-router engines
llama-cpp``), one CPU thread each, each with a RAM prompt cache of about ``cache_states`` prompt states.
The workload interleaves ``prompts`` system prompts of ~225 tokens: a burst of each prompt's first request
at once, then ``rounds`` sequential rounds in the same cyclic order, streamed through the router with the
official ``openai`` client. The prompts together do not fit in one instance's cache but do fit in the
fleet's: prefix routing keeps each prompt on the instance that holds it, random routing makes every
instance cycle through all of them. Between policies every engine cache is emptied
(``POST /reset_prefix_cache``) and a fresh router is started; the router's random generator is seeded, so
a run is reproducible. Reuse is the engines' own count: prompt tokens whose KV state was reused over all
prompt tokens (``llamacpp:prompt_tokens_cached_total`` / (that + ``llamacpp:prompt_tokens_total``)).
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from openai import AsyncOpenAI
from openai.types.chat import ChatCompletionMessageParam

from prefix_router.lab.launch.llama_cpp import LlamaCppFleet, LlamaCppSettings
from prefix_router.node.config import load_config
from prefix_router.node.life.server import start
from prefix_router.pool.engines import get_adapter
from prefix_router.proxy.run.app import create_app

# Every word is one SmolLM2 token after a space, so a prompt's length in tokens is known exactly.
WORD_TEXT = (
    "the river mountain code system network cache token router prefix engine memory packet cloud data "
    "model server queue thread block page value city light water stone green blue small large quick slow "
    "north south east west paper table window garden music story market travel energy signal"
)
WORDS = tuple(WORD_TEXT.split())
KV_BYTES_PER_TOKEN = 23_040  # SmolLM2-135M: 30 layers x (K + V) x 192 dims x 2 bytes (f16)
STATE_TOKENS = 235  # one saved state: ~225 prompt tokens + up to 8 generated
MODEL = "smollm2-135m"


@dataclass(frozen=True, slots=True)
class Workload:
    prompts: int = 6
    rounds: int = 2
    prompt_words: int = 190
    max_tokens: int = 8

    def sequence(self) -> list[tuple[int, int]]:
        """(prompt, question) pairs in order; the first ``prompts`` form the opening burst."""
        total = self.prompts * (self.rounds + 1)
        return [(k % self.prompts, k) for k in range(total)]


def system_prompt(index: int, words: int) -> str:
    pick = random.Random(index)
    return f"You are assistant {index} of a test shop. Context:" + "".join(
        " " + pick.choice(WORDS) for _ in range(words)
    )


def messages(workload: Workload, prompt: int, question: int) -> list[ChatCompletionMessageParam]:
    return [
        {"role": "system", "content": system_prompt(prompt, workload.prompt_words)},
        {"role": "user", "content": f"Question {question}: reply with one word."},
    ]


def fleet_settings(instances: int, cache_states: float = 3.9) -> LlamaCppSettings:
    cache_bytes = int(cache_states * STATE_TOKENS * KV_BYTES_PER_TOKEN)
    return LlamaCppSettings(
        instances=instances, threads=1, n_ctx=1024, cache_bytes=cache_bytes, model_alias=MODEL
    )


@dataclass(slots=True)
class PolicyResult:
    policy: str
    ttfts: list[float] = field(default_factory=list)
    evaluated: float = 0.0
    cached: float = 0.0
    wall_s: float = 0.0

    @property
    def reuse(self) -> float:
        total = self.evaluated + self.cached
        return self.cached / total if total else 0.0

    def percentile(self, q: float) -> float:
        ordered = sorted(self.ttfts)
        return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]

    @property
    def p50(self) -> float:
        return statistics.median(self.ttfts)


async def counters(session: aiohttp.ClientSession, urls: Sequence[str]) -> tuple[float, float]:
    """(evaluated, cached) prompt tokens summed over the engines, read with the engine adapter."""
    adapter = get_adapter("llama_cpp_python")
    evaluated = cached = 0.0
    for url in urls:
        async with session.get(f"{url}/metrics") as response:
            load = adapter.parse_metrics(await response.text())
        cached += load.prefix_cache_hits or 0.0
        evaluated += (load.prefix_cache_queries or 0.0) - (load.prefix_cache_hits or 0.0)
    return evaluated, cached


async def flush(session: aiohttp.ClientSession, urls: Sequence[str]) -> None:
    flush_call = get_adapter("llama_cpp_python").flush_request()
    assert flush_call is not None
    for url in urls:
        async with session.request(flush_call.method, f"{url}{flush_call.path}") as response:
            response.raise_for_status()


async def stream_ttft(client: AsyncOpenAI, chat: list[ChatCompletionMessageParam], max_tokens: int) -> float:
    """Seconds from sending to the first content token of a streamed chat completion."""
    started = time.perf_counter()
    ttft: float | None = None
    stream = await client.chat.completions.create(
        model=MODEL,
        messages=chat,
        max_tokens=max_tokens,
        temperature=0,
        stream=True,
    )
    async for chunk in stream:
        if ttft is None and chunk.choices and chunk.choices[0].delta.content:
            ttft = time.perf_counter() - started
    return ttft if ttft is not None else time.perf_counter() - started


async def warm_up(urls: Sequence[str], workload: Workload) -> None:
    """One request per engine straight to it (the first request of a process pays page faults)."""
    for url in urls:
        client = AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=300)
        await stream_ttft(client, messages(workload, 10_000, 0), 2)
        await client.close()


def router_overrides(policy: str, urls: Sequence[str]) -> dict[str, Any]:
    workers = [{"url": url, "name": f"llama-{i}", "models": [MODEL]} for i, url in enumerate(urls)]
    return {
        "workers": workers,
        "routing.policy": policy,
        "health.interval_s": 0.5,
        "health.models_interval_s": 3600,
        "scrape.interval_s": 0.5,
    }


async def wait_ready(session: aiohttp.ClientSession, url: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        async with session.get(f"{url}/ready") as response:
            if response.status == 200:
                return
        await asyncio.sleep(0.1)
    raise TimeoutError(f"router at {url} not ready")


async def drive(router_url: str, workload: Workload) -> list[float]:
    """The burst at once, then the rest one at a time; TTFTs in sequence order."""
    client = AsyncOpenAI(base_url=f"{router_url}/v1", api_key="unused", max_retries=0, timeout=300)
    order = workload.sequence()
    burst = order[: workload.prompts]
    try:
        ttfts = list(
            await asyncio.gather(
                *(stream_ttft(client, messages(workload, p, q), workload.max_tokens) for p, q in burst)
            )
        )
        for p, q in order[workload.prompts :]:
            ttfts.append(await stream_ttft(client, messages(workload, p, q), workload.max_tokens))
    finally:
        await client.close()
    return ttfts


async def run_policy(policy: str, urls: Sequence[str], workload: Workload, seed: int) -> PolicyResult:
    result = PolicyResult(policy)
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
        await flush(session, urls)
        app = create_app(
            load_config(env={}, overrides=router_overrides(policy, urls)), rng=random.Random(seed)
        )
        running = await start(app, shutdown_timeout=1.0)
        try:
            await wait_ready(session, running.url)
            before = await counters(session, urls)
            started = time.perf_counter()
            result.ttfts = await drive(running.url, workload)
            result.wall_s = time.perf_counter() - started
            after = await counters(session, urls)
        finally:
            await running.stop()
    result.evaluated, result.cached = after[0] - before[0], after[1] - before[1]
    return result


async def compare(
    urls: Sequence[str], workload: Workload, seed: int, policies: Sequence[str] = ("random", "prefix")
) -> dict[str, PolicyResult]:
    return {policy: await run_policy(policy, urls, workload, seed) for policy in policies}


def table(results: Sequence[PolicyResult]) -> str:
    rows = [
        "| policy | requests | TTFT p50 (s) | TTFT p90 (s) | engine cache reuse | wall (s) |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for r in results:
        cells = [r.policy, str(len(r.ttfts)), f"{r.p50:.2f}", f"{r.percentile(0.9):.2f}", f"{r.reuse:.1%}"]
        rows.append("| " + " | ".join([*cells, f"{r.wall_s:.1f}"]) + " |")
    return "\n".join(rows)


def merge(results: Sequence[PolicyResult]) -> PolicyResult:
    merged = PolicyResult(results[0].policy)
    for r in results:
        merged.ttfts += r.ttfts
        merged.evaluated += r.evaluated
        merged.cached += r.cached
        merged.wall_s += r.wall_s
    return merged


async def benchmark(args: argparse.Namespace) -> None:
    workload = Workload(prompts=args.prompts, rounds=args.rounds)
    per_policy: dict[str, list[PolicyResult]] = {"random": [], "prefix": []}
    with LlamaCppFleet(fleet_settings(args.instances, args.cache_states)) as fleet:
        await warm_up(fleet.urls, workload)
        for seed in range(args.seeds):
            for policy, result in (await compare(fleet.urls, workload, seed)).items():
                per_policy[policy].append(result)
                print(f"seed {seed} {policy}: p50 {result.p50:.2f}s reuse {result.reuse:.1%}", flush=True)
    print(table([merge(results) for results in per_policy.values()]))


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--instances", type=int, default=3)
    parser.add_argument("--prompts", type=int, default=6)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--seeds", type=int, default=3, help="router seeds (random draws) to run and pool")
    parser.add_argument("--cache-states", type=float, default=3.9, help="RAM cache per instance, in states")
    asyncio.run(benchmark(parser.parse_args(argv)))


if __name__ == "__main__":
    main()
