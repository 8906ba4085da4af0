"""Token units on a real engine: predicted vs cached prompt tokens, character keys, learned vs fixed.

    .venv/bin/python benchmarks/units_llama.py [--warmup 10] [--pairs 6] [--json OUT]

One llama-cpp-python instance (``prefix-router engines llama-cpp``: SmolLM2-135M-Instruct, its own chat
template) behind the router (default key, character blocks), driven twice over the same request sequence
with the engine's cache emptied in between: ``routing.units.learn`` off (4 characters per token, fixed) and
on (learned from the engine's ``usage.prompt_tokens``). The sequence: ``warmup`` chats with distinct system
prompts of English-like prose (2,500 to 7,000 characters), then for ``pairs`` fresh system prompts: the
first request, an identical repeat, and the next turn (the reply and a new question appended). The truth
of each repeat and next turn is the engine's own count of prompt tokens served from its cache: the rise of
``llamacpp:prompt_tokens_cached_total`` over the request (llama-cpp-python reports no cached tokens in its
responses). The prediction is the router's ``x-prefix-router-prefix-match``.

From the first run (the nominal prediction and the engine's usage of every request) the script also scores
other estimators of the token value offline, fitted on the same warm-up reports: the plain average of the
reports (no margin), and the slope of a least-squares line (prompt tokens = a x nominal + b).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from prefix_router.lab.bench.fidelity.corpus import prose
from prefix_router.lab.launch.llama_cpp import LlamaCppFleet, LlamaCppSettings
from prefix_router.node import load_config
from prefix_router.pool import get_adapter
from prefix_router.protocol import MATCH_HEADER
from prefix_router.proxy import create_app, start
from prefix_router.routing import KeyBuilder, KeySettings

MODEL = "smollm2-135m"
ADMIN = "units-benchmark"


@dataclass(slots=True)
class Measured:
    kind: str  # warmup, first, repeat, next
    nominal: int  # the router's nominal prompt tokens (characters / 4)
    engine_prompt: int  # usage.prompt_tokens
    predicted: int  # x-prefix-router-prefix-match
    cached: int  # the engine's count: prompt tokens served from its cache


@dataclass(slots=True)
class Run:
    learn: bool
    rows: list[Measured] = field(default_factory=list)
    units: dict[str, Any] = field(default_factory=dict)


def chat(index: int, turns: list[dict[str, str]] | None = None) -> dict[str, Any]:
    rng = random.Random(f"units-{index}")
    system = {"role": "system", "content": prose(rng, rng.randint(2_500, 7_000))}
    first = {"role": "user", "content": f"Question {index}: what is the main topic? One word."}
    return {"model": MODEL, "messages": [system, first, *(turns or [])], "max_tokens": 4, "temperature": 0}


async def cached_total(http: aiohttp.ClientSession, url: str) -> float:
    async with http.get(url + "/metrics") as resp:
        load = get_adapter("llama_cpp_python").parse_metrics(await resp.text())
    return load.prefix_cache_hits or 0.0


async def send(
    http: aiohttp.ClientSession, router: str, engine: str, body: dict[str, Any]
) -> tuple[int, int, int, str]:
    """(predicted, engine prompt tokens, engine cached tokens, reply) of one request."""
    before = await cached_total(http, engine)
    async with http.post(router + "/v1/chat/completions", json=body) as resp:
        assert resp.status == 200, await resp.text()
        data = await resp.json()
        predicted = int(resp.headers[MATCH_HEADER])
    after = await cached_total(http, engine)
    reply = str(data["choices"][0]["message"]["content"] or "")
    return predicted, int(data["usage"]["prompt_tokens"]), int(after - before), reply


async def drive(engine: str, learn: bool, warmup: int, pairs: int) -> Run:
    run = Run(learn)
    keys = KeyBuilder(KeySettings())
    overrides = {
        "workers": [{"url": engine, "name": "llama-0", "models": [MODEL]}],
        "routing.units.learn": learn,
        "auth.admin_token": ADMIN,
        "health.models_interval_s": 3600,
        "scrape.interval_s": 3600,
    }
    app = create_app(load_config(env={}, overrides=overrides), rng=random.Random(0))
    running = await start(app, shutdown_timeout=1.0)
    timeout = aiohttp.ClientTimeout(total=600)
    try:
        async with aiohttp.ClientSession(timeout=timeout) as http:
            flush = get_adapter("llama_cpp_python").flush_request()
            assert flush is not None
            async with http.request(flush.method, engine + flush.path) as resp:
                resp.raise_for_status()

            async def measure(kind: str, body: dict[str, Any]) -> str:
                predicted, prompt, cached, reply = await send(http, running.url, engine, body)
                nominal = keys.build("chat", body, route_id="x").prompt_tokens
                run.rows.append(Measured(kind, nominal, prompt, predicted, cached))
                print(f"{'learn' if learn else 'fixed'} {kind:6s} nominal {nominal:5d} engine {prompt:5d} "
                      f"predicted {predicted:5d} cached {cached:5d}", flush=True)  # fmt: skip
                return reply

            for i in range(warmup):
                await measure("warmup", chat(i))
            for i in range(1000, 1000 + pairs):
                reply = await measure("first", chat(i))
                await measure("repeat", chat(i))
                turn = [{"role": "assistant", "content": reply}, {"role": "user", "content": "Why? Briefly."}]
                await measure("next", chat(i, turn))
            async with http.get(
                running.url + "/admin/routing", headers={"Authorization": f"Bearer {ADMIN}"}
            ) as resp:
                run.units = (await resp.json())["summary"]["units"]
    finally:
        await running.stop()
    return run


def score(name: str, rows: Sequence[Measured], tokens_of: Any) -> str:
    """Over-predictions beyond one 16-token block and predicted / cached over the repeats and next turns."""
    pairs = [r for r in rows if r.kind in ("repeat", "next")]
    predicted = [tokens_of(r) for r in pairs]
    over = sum(p > r.cached + 16 for p, r in zip(predicted, pairs, strict=True))
    above = sum(p > r.cached for p, r in zip(predicted, pairs, strict=True))
    ratio = sum(predicted) / max(1, sum(r.cached for r in pairs))
    return f"| {name} | {len(pairs)} | {above} | {over} | {ratio:.3f} |"


def offline(fixed: Run) -> list[str]:
    """Other estimators of the scale, fitted on the warm-up reports of the fixed run."""
    warm = [r for r in fixed.rows if r.kind == "warmup"]
    samples = [r.engine_prompt / r.nominal for r in warm]
    mean, sd = statistics.fmean(samples), statistics.pstdev(samples)
    xs, ys = [r.nominal for r in warm], [r.engine_prompt for r in warm]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum((x - mx) ** 2 for x in xs)
    print(f"warm-up reports: scale mean {mean:.4f} sd {sd:.4f} (chars/token {4 / mean:.3f}); "
          f"slope {slope:.4f} (chars/token {4 / slope:.3f}), intercept {my - slope * mx:.1f}")  # fmt: skip
    return [
        score("fixed 4 chars/token (router, learning off)", fixed.rows, lambda r: r.predicted),
        score(
            "average of reports, no margin (offline)", fixed.rows, lambda r: math.floor(r.predicted * mean)
        ),
        score("average - 1 deviation (offline)", fixed.rows, lambda r: math.floor(r.predicted * (mean - sd))),
        score("least-squares slope (offline)", fixed.rows, lambda r: math.floor(r.predicted * slope)),
    ]


async def main_async(args: argparse.Namespace) -> None:
    settings = LlamaCppSettings(instances=1, threads=1, n_ctx=4096, model_alias=MODEL)
    with LlamaCppFleet(settings) as fleet:
        engine = fleet.urls[0]
        fixed = await drive(engine, False, args.warmup, args.pairs)
        learned = await drive(engine, True, args.warmup, args.pairs)
    lines = [
        "| prediction | pairs | above cached | over by > 16 | predicted / cached |",
        "|---|---:|---:|---:|---:|",
    ]
    lines += offline(fixed)
    lines.append(
        score("learned, average - 1 deviation (router, learning on)", learned.rows, lambda r: r.predicted)
    )
    print("\n".join(lines))
    print("learned:", json.dumps(learned.units))
    if args.json is not None:
        args.json.write_text(json.dumps({"fixed": asdict(fixed), "learned": asdict(learned)}, indent=1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--pairs", type=int, default=6)
    parser.add_argument("--json", type=Path)
    asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    main()
