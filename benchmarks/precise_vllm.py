"""Precise mode on real vLLM engines (the CPU build): predictions against the engines' cached tokens, and
hit rates of precise vs approximate routing, side by side in one run (issue 23's first target).

Starts ``--engines`` vLLM instances (the venv of ``make vllm``, SmolLM2-135M's model directory, one core
each, ``--blocks`` KV blocks of 128 tokens, KV events to a port the router binds, a replay endpoint) and,
for each mode, a router (``prefix-router serve``) with exact mode on SmolLM2's template: ``precise``
(workers with ``kv_events``), ``approximate`` (the same without) and ``render`` (precise without the
local template: the engine renders each request, ``--enable-scale-out``). Between modes the engines' prefix
caches are reset, and each reset published by one request of less than a block (``reset``; ``--no-flush``:
not). The workload (seeded): tenants with long system prompts, some with tools, some salted
(``cache_salt``), multi-turn conversations that carry the engine's own replies, sent one at a time with
the openai client. Per request: the router's prediction (``x-prefix-router-prefix-match``) and the
engine's ``usage.prompt_tokens_details.cached_tokens``. ``--repeats N`` runs the modes in turn N times on
the same engines, the router's random tie-breaks seeded ``--router-seed`` + the repeat (the config's
``seed``): within a repeat every mode starts from the same seed, so the paired difference is the mode's,
not a luckier draw of tie-breaks; each run's line, then per mode the mean, and the paired difference from
the first mode per repeat.
``moves``: a tenant's request sent to another engine than its previous one; ``cold repeats``: a
tenant's later request that found nothing cached.

    python benchmarks/precise_vllm.py --requests 48 --out benchmarks/results/precise_vllm.txt
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import yaml
from openai import OpenAI

from prefix_router.lab.launch.vllm import cpu_flags, resolved_dtype
from prefix_router.proxy import parent_death_signal

VENV = Path(os.environ.get("PREFIX_ROUTER_VLLM_VENV", Path.home() / ".cache/prefix-router/vllm-venv"))
MODEL_DIR = Path.home() / ".cache/prefix-router/vllm-model/smollm2-135m-real"
MODEL = "smollm2-135m"
BLOCK = 128
WORDS = [
    "parcel",
    "route",
    "depot",
    "invoice",
    "customs",
    "pallet",
    "freight",
    "courier",
    "tracking",
    "manifest",
    "label",
    "refund",
]


def start_engine(
    i: int, port: int, events: int, replay: int, blocks: int, log_dir: Path, max_len: int = 4096
) -> subprocess.Popen[bytes]:
    cfg = {
        "enable_kv_cache_events": True,
        "publisher": "zmq",
        "endpoint": f"tcp://127.0.0.1:{events}",
        "replay_endpoint": f"tcp://*:{replay}",
        "topic": "kv",
    }
    env = dict(
        os.environ,
        HF_HUB_OFFLINE="1",
        VLLM_CPU_KVCACHE_SPACE="1",
        VLLM_SERVER_DEV_MODE="1",
        VLLM_CPU_OMP_THREADS_BIND=str(i % (os.cpu_count() or 1)),
        VLLM_NO_USAGE_STATS="1",
    )
    argv = [
        str(VENV / "bin/python"),
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(MODEL_DIR),
        "--served-model-name",
        MODEL,
        "--port",
        str(port),
        "--host",
        "127.0.0.1",
        "--dtype",
        resolved_dtype("auto", cpu_flags()),  # float32 where the CPU has no native bfloat16 (launch.vllm)
        "--max-model-len",
        str(max_len),
        "--enable-prefix-caching",
        "--enable-prompt-tokens-details",
        "--num-gpu-blocks-override",
        str(blocks),
        "-O0",
        "--enable-auto-tool-choice",
        "--enable-scale-out",
        "--tool-call-parser",
        "hermes",
        "--kv-events-config",
        json.dumps(cfg),
    ]
    log = open(log_dir / f"vllm-{i}.log", "wb")  # noqa: SIM115
    return subprocess.Popen(
        argv,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        preexec_fn=parent_death_signal(),
    )


def wait_ok(url: str, timeout: float) -> None:
    end = time.time() + timeout
    while time.time() < end:
        try:
            urllib.request.urlopen(url, timeout=2)
            return
        except Exception:
            time.sleep(1)
    raise SystemExit(f"{url} not up within {timeout:.0f}s")


def reset(port: int, flush: bool) -> None:
    """Empty the engine's prefix cache between runs; ``flush``: then one request of less than a block, so
    that the engine's next scheduler step publishes the reset (vLLM sends ``AllBlocksCleared`` with its
    next step, not at the reset) into its replay buffer before the next run's router replays it; without
    it that router warms its view with the earlier run's blocks, and its first request is predicted on
    them."""
    urllib.request.urlopen(
        urllib.request.Request(f"http://127.0.0.1:{port}/reset_prefix_cache", method="POST"), timeout=60
    )
    if flush:
        body = json.dumps({"model": MODEL, "prompt": "Hi", "max_tokens": 1}).encode()
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}/v1/completions", body, {"Content-Type": "application/json"}
        )
        urllib.request.urlopen(request, timeout=120).read()


def stop(proc: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(30)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        os.killpg(proc.pid, signal.SIGKILL)


def workload(n: int, seed: int) -> list[dict[str, object]]:
    """Conversations: (tenant, turn) requests, interleaved; replies filled in as they come."""
    rng = random.Random(seed)
    tenants = []
    for t in range(6):
        system = f"Tenant {t}. " + " ".join(rng.choice(WORDS) for _ in range(rng.randrange(400, 1400)))
        tools = (
            [
                {
                    "type": "function",
                    "function": {
                        "name": f"lookup_{t}",
                        "description": "Find a parcel",
                        "parameters": {"type": "object", "properties": {"id": {"type": "string"}}},
                    },
                }
            ]
            if t % 3 == 0
            else None
        )
        tenants.append({"system": system, "tools": tools, "salt": f"tenant-{t}" if t % 2 else None})
    convs: list[dict[str, object]] = []
    plan = []
    for _ in range(n):
        if convs and rng.random() < 0.6:
            plan.append(rng.randrange(len(convs)))
        else:
            convs.append({"tenant": rng.randrange(len(tenants)), "turns": 0})
            plan.append(len(convs) - 1)
    return [{"conv": c, "tenants": tenants, "convs": convs} for c in plan]


def run_mode(
    mode: str, args: argparse.Namespace, ports: list[tuple[int, int, int]], tmp: Path, seed: int
) -> list[dict[str, float]]:
    workers = []
    for i, (port, events, replay) in enumerate(ports):
        worker: dict[str, object] = {"url": f"http://127.0.0.1:{port}", "name": f"vllm-{i}", "engine": "vllm"}
        if mode in ("precise", "render"):
            worker["kv_events"] = {
                "endpoint": f"tcp://127.0.0.1:{events}",
                "bind": True,
                "topic": "kv",
                "replay_endpoint": f"tcp://127.0.0.1:{replay}",
                "model": MODEL,
            }
        workers.append(worker)
    config = {
        "seed": seed,
        "workers": workers,
        "routing": {
            "policy": "prefix",
            "keys": {
                "mode": "events" if mode in ("precise", "render") else "template",
                "templates": {} if mode == "render" else {MODEL: str(MODEL_DIR)},
            },
            "events": {"block_tokens": BLOCK},
        },
    }
    path = tmp / f"{mode}.yaml"
    path.write_text(yaml.safe_dump(config))
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).parents[1] / "src"))
    router_log = (tmp / f"router-{mode}.log").open("wb")
    router = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "prefix_router.proxy",
            "serve",
            "--config",
            str(path),
            "--processes",
            "1",
            "--port",
            str(args.router_port),
        ],
        env=env,
        stdout=router_log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        preexec_fn=parent_death_signal(),  # a benchmark killed outright takes its router along
    )
    rows = []
    try:
        wait_ok(f"http://127.0.0.1:{args.router_port}/ready", 60)
        time.sleep(1.5)  # the subscriptions bind; the engines' PUB sockets reconnect
        client = OpenAI(
            base_url=f"http://127.0.0.1:{args.router_port}/v1", api_key="unused", max_retries=0, timeout=300
        )
        items = workload(args.requests, args.seed)
        histories: dict[int, list[dict[str, object]]] = {}
        for item in items:
            conv = item["convs"][item["conv"]]  # type: ignore[index]
            tenant = item["tenants"][conv["tenant"]]  # type: ignore[index]
            system = [{"role": "system", "content": tenant["system"]}]
            history = histories.setdefault(item["conv"], system)  # type: ignore[arg-type]
            parcel = random.Random(len(history)).randrange(10**6)
            history.append({"role": "user", "content": f"Question {len(history)}: where is parcel {parcel}?"})
            extra: dict[str, object] = {}
            if tenant["salt"]:
                extra["cache_salt"] = tenant["salt"]
            kwargs: dict[str, object] = {"tools": tenant["tools"]} if tenant["tools"] else {}
            t0 = time.perf_counter()
            raw = client.chat.completions.with_raw_response.create(
                model=MODEL,
                messages=history,
                max_tokens=args.max_tokens,
                temperature=0,
                extra_body=extra,
                **kwargs,
            )
            elapsed = time.perf_counter() - t0
            out = raw.parse()
            reply = out.choices[0].message.content or ""
            history.append({"role": "assistant", "content": reply})
            details = out.usage.prompt_tokens_details
            rows.append(
                {
                    "predicted": float(raw.headers.get("x-prefix-router-prefix-match", "0")),
                    "cached": float(
                        details.cached_tokens if details and details.cached_tokens is not None else -1
                    ),
                    "prompt": float(out.usage.prompt_tokens),
                    "worker": float(raw.headers.get("x-prefix-router-worker", "vllm-0").split("-")[-1]),
                    "seconds": elapsed,
                }
            )
        admin = None
        try:
            metrics = (
                urllib.request.urlopen(f"http://127.0.0.1:{args.router_port}/metrics", timeout=10)
                .read()
                .decode()
            )
            admin = [
                line
                for line in metrics.splitlines()
                if line.startswith(
                    (
                        "prefix_router_kv_events",
                        "prefix_router_precise",
                        "prefix_router_worker_blocks",
                        "prefix_router_render",
                    )
                )
            ]
        except Exception as exc:
            admin = [f"metrics unavailable: {exc}"]
        (tmp / f"metrics-{mode}.txt").write_text("\n".join(admin))
    finally:
        stop(router)
        router_log.close()
    return rows


def tenant_moves(rows: list[dict[str, float]], items: list[dict[str, object]]) -> tuple[int, int]:
    """(moves, cold repeats) of the tenants over ``rows`` (the requests of ``items``, in order)."""
    last: dict[int, float] = {}
    moves = cold = 0
    for item, row in zip(items, rows, strict=True):
        tenant = item["convs"][item["conv"]]["tenant"]  # type: ignore[index]
        if tenant in last:
            moves += last[tenant] != row["worker"]
            cold += row["cached"] == 0
        last[tenant] = row["worker"]
    return moves, cold


def hit_rate(rows: list[dict[str, float]]) -> float:
    return sum(r["cached"] for r in rows) / max(1, sum(r["prompt"] for r in rows))


def summarize(mode: str, rows: list[dict[str, float]], items: list[dict[str, object]]) -> str:
    n = len(rows)
    within = sum(abs(r["predicted"] - r["cached"]) <= BLOCK for r in rows)
    exact = sum(r["predicted"] == r["cached"] for r in rows)
    above_prompt = sum(r["predicted"] > r["prompt"] for r in rows)
    above = sum(r["predicted"] > r["cached"] for r in rows)
    hit = hit_rate(rows)
    moves, cold = tenant_moves(rows, items)
    spread = sum(r["worker"] for r in rows) / max(1, n)
    mean_s = sum(r["seconds"] for r in rows) / max(1, n)
    return (
        f"{mode:12s} requests {n:3d}  within one block {within}/{n} ({within / max(1, n):.1%})  "
        f"exact {exact}/{n}  above report {above}  above prompt {above_prompt}  hit rate {hit:.1%}  "
        f"moves {moves:2d}  cold repeats {cold:2d}  share on vllm-1 {spread:.2f}  mean latency {mean_s:.2f}s"
    )


def overall(modes: list[str], hits: dict[str, list[float]]) -> list[str]:
    """Per mode the mean hit rate over the repeats, and the paired difference from the first mode."""
    lines = []
    first = hits[modes[0]]
    for mode in modes:
        runs = hits[mode]
        mean = sum(runs) / len(runs)
        diffs = [a - b for a, b in zip(first, runs, strict=True)]
        paired = "" if mode == modes[0] else f"  {modes[0]} - {mode}: " + " ".join(f"{d:+.1%}" for d in diffs)
        lines.append(
            f"{mode:12s} mean of {len(runs)}: hit rate {mean:.1%} (runs "
            + " ".join(f"{h:.1%}" for h in runs)
            + f"){paired}"
        )
    return lines


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--engines", type=int, default=2)
    p.add_argument("--blocks", type=int, default=64)
    p.add_argument("--max-model-len", type=int, default=4096)  # at most blocks x 128
    p.add_argument("--requests", type=int, default=48)
    p.add_argument("--max-tokens", type=int, default=8)
    p.add_argument("--seed", type=int, default=23)
    p.add_argument("--port-base", type=int, default=19300)
    p.add_argument("--router-port", type=int, default=19390)
    p.add_argument("--modes", default="precise,approximate")
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument(
        "--router-seed", type=int, default=0, help="repeat r seeds every mode's router with this + r"
    )
    p.add_argument(
        "--no-flush",
        action="store_true",
        help="reset the caches between runs without the request that publishes it",
    )
    p.add_argument("--out", type=Path)
    args = p.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="precise-vllm-"))
    ports = [
        (args.port_base + i, args.port_base + 20 + i, args.port_base + 40 + i) for i in range(args.engines)
    ]
    engines = [start_engine(i, *ports[i], args.blocks, tmp, args.max_model_len) for i in range(args.engines)]
    lines = [
        f"real vLLM (vllm-cpu 0.32, SmolLM2-135M real weights, "
        f"{resolved_dtype('auto', cpu_flags())}), {args.engines} engines x {args.blocks} blocks of {BLOCK} "
        f"tokens, {args.requests} requests per mode, seed {args.seed}, "
        f"router seed {args.router_seed} + repeat; logs in {tmp}"
    ]
    try:
        for i, (port, _e, _r) in enumerate(ports):
            wait_ok(f"http://127.0.0.1:{port}/health", 600)
            print(f"engine {i} up", flush=True)
        modes = args.modes.split(",")
        hits: dict[str, list[float]] = {mode: [] for mode in modes}
        items = workload(args.requests, args.seed)
        for repeat in range(args.repeats):
            for mode in modes:
                for port, _e, _r in ports:
                    reset(port, flush=not args.no_flush)
                rows = run_mode(mode, args, ports, tmp, args.router_seed + repeat)
                suffix = "" if args.repeats == 1 else f"-{repeat}"
                (tmp / f"rows-{mode}{suffix}.json").write_text(json.dumps(rows))
                hits[mode].append(hit_rate(rows))
                lines.append(summarize(mode, rows, items))
                print(lines[-1], flush=True)
        if args.repeats > 1:
            lines += overall(modes, hits)
    finally:
        for engine in engines:
            stop(engine)
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
