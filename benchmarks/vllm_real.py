"""Real vLLM benchmark: prefix-router's policies and the peers' cache_aware routers in front of the SAME
real vLLM engines (the CPU build, SmolLM2-135M with its own weights), driven by the SAME client.

    .venv/bin/python benchmarks/vllm_real.py                       # the default plan (~15 min on 2 cores)
    .venv/bin/python benchmarks/vllm_real.py --plan shared:random,prefix --requests 20
    .venv/bin/python benchmarks/vllm_real.py --instances 2 --kv-cache-tokens 4096 --plan shared:random,prefix

Engines: ``--instances`` (default 3, at most 4 on this 24 GB machine: about 3.8 GB each) started by
``prefix_router.lab.launch.vllm`` on ports from ``--port-base`` + 10, instance i pinned to core i mod the
CPU count (``VLLM_CPU_OMP_THREADS_BIND``: at one request in flight only one engine computes at a time, so
two engines sharing a core do not fight), float32 on a CPU without native bfloat16 (the launcher's
``dtype`` auto), ``--kv-cache-tokens`` each (default 3,584: 28 blocks of 128, room for 3 of the
shared-prefix workload's system prompts of about 800 tokens beside the request being computed). Started
once; their prefix caches are flushed before every run (``POST /reset_prefix_cache``, by ``bench``).

Routers, each its own process, started fresh per run: prefix-router ``serve --processes 1`` with
``random``, ``round_robin``, ``least_load``, ``prefix``, ``ttft``; sglang-router 0.3.2, SMG 1.13 (``smg
launch``) and vllm-router 0.1.17, each ``cache_aware`` with its defaults (installed into ``--peers-venv`` if
missing, never into the project's venv). Client: ``prefix-router bench --router URL`` (the ``openai`` client,
streaming), closed loop at each ``--concurrency`` (default 1), seeded; ``--rounds`` repeats each
concurrency with the routers' order rotated by one per round. prefix-router logs its access lines
(``log_level=info``): where its policy predicts the first-token time (``predicted_ttft_ms`` beside
``ttft_ms``), the run's median absolute percentage error after ``WARMUP_REQUESTS`` is reported, beside
the errors of the best fits in hindsight of what the engines did (``hindsight_error``, where the router
names the worker in its responses, as prefix-router does): on what a router knows when it routes (the
floor of a router's linear model) and with the requests that arrived during each wait too (how
predictable that run's first-token times were at all).

Issue 41's comparison (2 engines, 4 and 8 in flight, every router ``cache_aware``; ``OUT/summary.md``
pools the rounds: hit rate from the engines' usage, TTFT mean, both against the best peer's):

    .venv/bin/python benchmarks/vllm_real.py --instances 2 --plan shared:prefix,sglang,smg,vllm \
        --concurrency 4 8 --rounds 2 --requests 24

Cells (``cells(instances)``; ``--plan`` says which routers run in which cell):

- ``shared``: ``PROMPTS_PER_ENGINE`` x instances tenants' system prompts (``system_tokens=1200`` workload
  units, about 800 SmolLM2 tokens), uniform popularity, short questions. Each engine's cache holds 1/N of
  the prompts, so the fleet holds them all only if each engine keeps its own share: a prefix-aware router
  can reach the ideal (every prompt cached after its first visit), a prefix-blind one hits about 1/N.
- ``interleaved``: 13 ShareGPT conversations (of 6 to 8 user turns) live at once, their turns sent in
  rotation at one request in flight, each request carrying its canned history (the recorded replies cut
  to 128 tokens: ``multiturn``'s ``interleave``). The live histories together exceed one engine's cache and
  fit in the fleet's: a router that keeps each conversation on one engine and spreads conversations keeps
  them cached; one that piles them on one engine evicts each history before its next turn (LRU under a
  rotation). Needs the ShareGPT trace (``PREFIX_ROUTER_TRACES`` or ``../shared/traces``).
- ``multiturn`` (ShareGPT conversations one after the other, each turn carrying its generated history:
  about 150 tokens a request, so every router keeps them cached at one session in flight) and
  ``conversations`` (longer turns and replies, meant for ``--concurrency 3``): the earlier cells, kept to
  reproduce the figures quoted in docs/benchmarks.md.
- ``unique``: the negative control, no shared prefix.

Per run: TTFT p50/p90/p99/mean, the engines' own hit rate (``vllm:prefix_cache_hits_total`` /
``queries_total`` between the run's scrapes), the ideal hit rate (``ideal_hit_rate``: every shared prefix
cached after its first visit, in whole engine blocks), each engine's busy time (CPU seconds of its
processes over the run), the requests each engine preempted (``vllm:num_preemptions_total``: evicted from
its running batch when its KV cache ran out, to be recomputed; work the hit rate does not show) and the
router's CPU seconds; the machine's load average at start and end.
Results: ``OUT/runs.json``, ``OUT/table.md`` (the docs quote them) and per run ``OUT/CELL/ROUTER.json`` and
``.records.jsonl`` (one line per request).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

import numpy as np
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
import peers  # benchmarks/peers.py: process helpers

from prefix_router.lab.launch.vllm import VllmFleet, VllmSettings, cpu_flags, resolved_dtype

ROOT = Path(__file__).resolve().parents[1]
PR = str(Path(sys.executable).with_name("prefix-router"))
PEER_PINS = ("sglang-router==0.3.2", "smg==1.13.0", "vllm-router==0.1.17")


@dataclass(frozen=True, slots=True)
class Cell:
    name: str
    workload: str
    options: tuple[str, ...]
    requests: int

    def workload_options(self) -> dict[str, Any]:
        """``options`` as the workload's keyword arguments."""
        return dict(option.split("=", 1) for option in self.options)


PROMPTS_PER_ENGINE = 3  # shared: the system prompts one engine's default cache holds (28 blocks)
DEFAULT_KV_CACHE_TOKENS = 3584
CHAT = ("system_tokens=1200", "zipf_s=0", "question_tokens=16", "output_tokens=8")
TURNS = ("max_turns=5", "max_user_tokens=150", "min_output_tokens=16", "max_output_tokens=24",
         "synthetic_fallback=true")  # fmt: skip
TALKS = ("max_turns=8", "max_user_tokens=512", "min_output_tokens=32", "max_output_tokens=64",
         "synthetic_fallback=true")  # fmt: skip
WEAVE = ("interleave=13", "min_turns=6", "max_turns=8", "max_user_tokens=150", "history_reply_tokens=128",
         "min_output_tokens=8", "max_output_tokens=8")  # fmt: skip


def cells(instances: int, prompts_per_engine: int = PROMPTS_PER_ENGINE) -> dict[str, Cell]:
    """The cells for a fleet of ``instances`` engines (``shared`` has ``prompts_per_engine`` tenants per
    engine: as many as one engine's cache holds, so that the fleet holds them all only if each engine
    keeps its own share)."""
    tenants = f"tenants={prompts_per_engine * instances}"
    return {
        "shared": Cell("shared", "chatbots", (tenants, *CHAT), 90),
        "interleaved": Cell("interleaved", "multi-turn", WEAVE, 96),
        "multiturn": Cell("multiturn", "multi-turn", TURNS, 30),
        "conversations": Cell("conversations", "multi-turn", TALKS, 40),
        "unique": Cell("unique", "unique", ("prompt_tokens=600", "output_tokens=8"), 24),
    }


@dataclass(frozen=True, slots=True)
class Router:
    label: str
    kind: str  # prefix-router | sglang-router | smg | vllm-router
    policy: str


ROUTERS: dict[str, Router] = {
    "random": Router("prefix-router random", "prefix-router", "random"),
    "round_robin": Router("prefix-router round_robin", "prefix-router", "round_robin"),
    "least_load": Router("prefix-router least_load", "prefix-router", "least_load"),
    "prefix": Router("prefix-router prefix", "prefix-router", "prefix"),
    "ttft": Router("prefix-router ttft", "prefix-router", "ttft"),
    "sglang": Router("sglang-router cache_aware", "sglang-router", "cache_aware"),
    "smg": Router("smg cache_aware", "smg", "cache_aware"),
    "vllm": Router("vllm-router cache_aware", "vllm-router", "cache_aware"),
}


def ensure_peers(venv: Path) -> None:
    """The peers in their own venv (as benchmarks/peers.sh installs them)."""
    binaries = ("vllm-router", "smg")
    ok = (
        all((venv / "bin" / b).exists() for b in binaries)
        and subprocess.call(
            [str(venv / "bin" / "python"), "-c", "import sglang_router"], stderr=subprocess.DEVNULL
        )
        == 0
    )
    if not ok:
        subprocess.check_call(["python3", "-m", "venv", str(venv)])
        subprocess.check_call([str(venv / "bin" / "pip"), "install", "--quiet", *PEER_PINS])


def router_command(
    router: Router, workers: Sequence[str], port: int, metrics_port: int, venv: Path, access_log: bool = False
) -> list[str]:
    """The router's command line; ``access_log``: prefix-router logs at info, one access line a request
    (its ``ttft_ms`` and, where the policy makes one, ``predicted_ttft_ms``: see ``prediction_errors``)."""
    if router.kind == "prefix-router":
        flags = [arg for w in workers for arg in ("--worker", w)]
        level = "info" if access_log else "warning"
        return [PR, "serve", *flags, "--policy", router.policy, "--port", str(port), "--processes", "1",
                "--set", f"log_level={level}"]  # fmt: skip
    common = ["--host", "127.0.0.1", "--port", str(port), "--worker-urls", *workers,
              "--policy", router.policy,
              "--prometheus-host", "127.0.0.1", "--prometheus-port", str(metrics_port)]  # fmt: skip
    if router.kind == "sglang-router":
        return [
            str(venv / "bin" / "python"),
            "-m",
            "sglang_router.launch_router",
            *common,
            "--log-level",
            "warn",
        ]
    if router.kind == "smg":
        return [str(venv / "bin" / "smg"), "launch", *common, "--log-level", "warn"]
    return [str(venv / "bin" / "vllm-router"), *common, "--log-level", "warning"]


def router_env(router: Router) -> dict[str, str]:
    env = dict(os.environ)
    if router.kind in ("sglang-router", "smg"):  # never reach a model hub (../shared/peers.md)
        env.update(HF_HUB_OFFLINE="1", HF_ENDPOINT="http://127.0.0.1:9")
    return env


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process and its children (0 for one that is gone)."""
    try:
        proc = psutil.Process(pid)
        procs = [proc, *proc.children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0.0
    total = 0.0
    for p in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            times = p.cpu_times()
            total += times.user + times.system
    return total


@contextlib.contextmanager
def running_router(
    router: Router, workers: Sequence[str], port: int, log: Path, venv: Path, access_log: bool = False
) -> Iterator[int]:
    command = router_command(router, workers, port, port + 1, venv, access_log)
    proc = peers.start(command, log, router_env(router))
    try:
        peers.wait_http(f"http://127.0.0.1:{port}/health", timeout_s=60)
        yield proc.pid
    finally:
        peers.stop(proc)


def bench_command(cell: Cell, router: Router, workers: Sequence[str], port: int, out: Path,
                  args: argparse.Namespace, concurrency: int = 1) -> list[str]:  # fmt: skip
    """``prefix-router bench`` for one run: results to ``out``, per-request records beside it."""
    opts = [arg for o in cell.options for arg in ("--workload-opt", o)]
    return [PR, "bench", "--workers", *workers, "--router", f"http://127.0.0.1:{port}",
            "--label", router.label,
            "--workload", cell.workload, *opts, "--requests", str(args.requests or cell.requests),
            "--concurrency", str(concurrency), "--seed", str(args.seed), "--real", "--no-progress",
            "--timeout", "300", "--json", str(out), "--records", str(records_path(out))]  # fmt: skip


def records_path(out: Path) -> Path:
    return out.with_suffix(".records.jsonl")


@dataclass(frozen=True, slots=True)
class Groups:
    """Which requests share a prefix: ``of`` maps a session id to its group, the tenant (``chatbots``: one
    system prompt), the conversation (interleaved ``multi-turn``: ids ``CONVERSATION/turn-K``) or the
    session itself; ``tenants`` are the groups that are tenants. ``ideal_known``: False where sessions
    have several turns (their history holds the engine's own replies, which the engine caches too: no
    ideal is computed from the records then)."""

    of: dict[str, str]
    tenants: frozenset[str]
    ideal_known: bool = True


def prefix_groups(cell: Cell, requests: int, seed: int) -> Groups:
    """The groups of ``cell``'s workload (rebuilt from its options and seed, as ``bench`` builds it)."""
    from prefix_router.lab.workloads.registry import get_workload

    workload = get_workload(cell.workload, requests=requests, seed=seed, model="", **cell.workload_options())
    of = {s.session_id: s.tenant or s.session_id.partition("/turn-")[0] for s in workload.sessions}
    tenants = frozenset(s.tenant for s in workload.sessions if s.tenant)
    return Groups(of, tenants, all(len(s.turns) == 1 for s in workload.sessions))


def ideal_cached(records: Sequence[dict[str, Any]], groups: Groups, block: int,
                 cacheable: dict[str, int]) -> int:  # fmt: skip
    """Cached tokens if every prefix stayed cached after its first visit: a tenant's repeat visits hold
    ``cacheable[tenant]`` (the most any run's engine reported for it); a conversation's turn holds the
    whole blocks of its previous turn's prompt (its history is a prefix of this one's)."""
    total, last_prompt, seen = 0, dict[str, int](), set[str]()
    for r in sorted(records, key=lambda r: r["start_s"]):
        group, prompt = groups.of.get(r["session_id"], r["session_id"]), int(r["prompt_tokens"] or 0)
        if group in groups.tenants:
            total += cacheable.get(group, 0) if group in seen else 0
        else:
            total += min(prompt, last_prompt.get(group, 0) // block * block)
        seen.add(group)
        last_prompt[group] = prompt
    return total


def tenant_cacheable(runs: Sequence[Sequence[dict[str, Any]]], groups: Groups) -> dict[str, int]:
    """Per tenant, the most cached tokens any request of any run reported (its prompt's whole blocks)."""
    best: dict[str, int] = {}
    for records in runs:
        for r in records:
            group = groups.of.get(r["session_id"])
            if group in groups.tenants:
                best[group] = max(best.get(group, 0), int(r["cached_tokens"] or 0))
    return best


def run_one(
    fleet: VllmFleet,
    cell: Cell,
    router: Router,
    args: argparse.Namespace,
    concurrency: int = 1,
    round_: int = 0,
) -> dict[str, Any]:
    out_dir = args.out / cell.name
    out_dir.mkdir(parents=True, exist_ok=True)
    slug = router.label.replace(" ", "_") + (f".c{concurrency}.r{round_}" if args.rounds > 1 or
                                            len(args.concurrency) > 1 else "")  # fmt: skip
    port = args.port_base
    load_start = os.getloadavg()[0]
    engines_before = [cpu_seconds(i.process.pid) for i in fleet.instances]
    started = time.monotonic()
    router_log = out_dir / f"{slug}.router.log"
    with running_router(router, fleet.urls, port, router_log, args.peers_venv, args.predictions) as pid:
        router_before = cpu_seconds(pid)
        cmd = bench_command(cell, router, fleet.urls, port, out_dir / f"{slug}.json", args, concurrency)
        with (out_dir / f"{slug}.log").open("wb") as sink:
            rc = subprocess.call(cmd, stdout=sink, stderr=subprocess.STDOUT)
        router_cpu = cpu_seconds(pid) - router_before
    wall = time.monotonic() - started
    pairs = zip(fleet.instances, engines_before, strict=True)
    engines = [round(cpu_seconds(i.process.pid) - b, 1) for i, b in pairs]
    row: dict[str, Any] = {
        "cell": cell.name,
        "router": router.label,
        "kind": router.kind,
        "concurrency": concurrency,
        "round": round_,
        "rc": rc,
        "wall_s": round(wall, 1),
        "router_cpu_s": round(router_cpu, 2),
        "engine_cpu_s": engines,
        "load_avg_start": round(load_start, 2),
        "load_avg_end": round(os.getloadavg()[0], 2),
        "dtype": resolved_dtype(fleet.settings.dtype, cpu_flags()),
        "instances": len(fleet.instances),
        "kv_cache_tokens": fleet.settings.kv_cache_tokens,
        "predictions": prediction_errors(router_log) if router.kind == "prefix-router" else None,
    }
    try:
        document = json.loads((out_dir / f"{slug}.json").read_text())
    except (OSError, ValueError):
        return row
    summary = next(iter(document["policies"].values()))
    row.update(
        records=str(records_path(out_dir / f"{slug}.json")),
        prompt_tokens=summary["prompt_tokens"],
        cached_tokens=summary["cached_tokens"],
        requests=summary["requests"],
        errors=summary["errors"],
        ttft_ms=summary["ttft_ms"],
        engine_hit_rate=summary.get("engine_metrics_hit_rate"),
        response_hit_rate=summary["hit_rate"],
        requests_per_worker=summary["requests_per_worker"],
        preemptions_per_worker=summary.get("preemptions_per_worker"),
        bench_wall_s=summary["wall_s"],
    )
    with_hindsight(row)
    return row


def with_hindsight(row: dict[str, Any]) -> None:
    """Set ``row``'s hindsight errors from its records (``hindsight_error``): ``hindsight_mdape`` with the
    later arrivals, ``hindsight_known_mdape`` on what a router knows when it routes."""
    records = read_records(row.get("records"))
    row["hindsight_mdape"] = hindsight_error(records)
    row["hindsight_known_mdape"] = hindsight_error(records, later=False)


WARMUP_REQUESTS = 8  # a run's first requests, left out of the prediction error (the model learns online)
_FIELD = re.compile(r"\b(predicted_ttft_ms|ttft_ms)=([0-9.]+)")


def prediction_errors(log: Path, warmup: int = WARMUP_REQUESTS) -> dict[str, Any] | None:
    """The median absolute percentage error of the router's predicted first-token time against the one it
    observed, from its access lines (``predicted_ttft_ms=`` beside ``ttft_ms=``), after ``warmup`` requests;
    None where the router logs no prediction (a policy without one, or a build before it)."""
    try:
        lines = log.read_text(errors="replace").splitlines()
    except OSError:
        return None
    pairs = []
    for line in lines:
        fields = dict(_FIELD.findall(line))
        if "predicted_ttft_ms" in fields and "ttft_ms" in fields and float(fields["ttft_ms"]) > 0:
            pairs.append((float(fields["predicted_ttft_ms"]), float(fields["ttft_ms"])))
    kept = pairs[warmup:]
    if not kept:
        return None
    errors = sorted(abs(p - o) / o for p, o in kept)
    return {"requests": len(kept), "warmup": min(warmup, len(pairs)), "mdape": statistics.median(errors)}


_HINDSIGHT_UNKNOWNS = 6  # an overhead and one rate per feature (5 without the later arrivals)


def hindsight_error(
    records: Sequence[dict[str, Any]], warmup: int = WARMUP_REQUESTS, later: bool = True
) -> float | None:
    """How predictable a run's first-token times were at all: the median relative error of the best
    linear fit, in hindsight, of each request's first-token time (relative errors squared, fitted to the
    run itself) on what its engine did, from the client's records alone: its own uncached prompt tokens
    (engine-reported), the uncached tokens and the requests ahead of it there (sent earlier, not past
    their first token when it was sent), the requests decoding there, and with ``later`` the uncached
    tokens sent there after it but before its first token (known to no router: they join its step). A
    router's own predictions, made before the facts, cannot be expected below the fit without ``later``
    (what a router can know when it routes, fitted with hindsight). None with fewer than 3 requests per
    unknown after ``warmup``."""
    timed = [r for r in records if r.get("ok") and r.get("ttft_s") and r.get("worker")]
    rows = sorted((r for r in timed if r.get("prompt_tokens")), key=lambda r: float(r["start_s"]))
    features: list[list[float]] = []
    seconds: list[float] = []
    for r in rows:
        start, first = float(r["start_s"]), _first(r)
        same = [q for q in rows if q["worker"] == r["worker"] and q is not r]
        ahead = [q for q in same if float(q["start_s"]) <= start < _first(q)]
        decoding = [q for q in same if _first(q) <= start < float(q["start_s"]) + float(q["e2e_s"])]
        row = [1.0, _own(r), sum(map(_own, ahead)), len(ahead), len(decoding)]
        if later:
            row.append(sum(_own(q) for q in same if start < float(q["start_s"]) < first))
        features.append(row)
        seconds.append(float(r["ttft_s"]))
    if len(seconds) - warmup < 3 * (_HINDSIGHT_UNKNOWNS - (not later)):
        return None
    x, y = np.array(features[warmup:]), np.array(seconds[warmup:])
    w = 1.0 / y
    coef, *_ = np.linalg.lstsq(x * w[:, None], y * w, rcond=None)
    return float(np.median(np.abs(x @ coef - y) / y))


def _own(record: dict[str, Any]) -> float:
    return float(record["prompt_tokens"]) - float(record.get("cached_tokens") or 0)


def _first(record: dict[str, Any]) -> float:
    return float(record["start_s"]) + float(record["ttft_s"])


def pooled_rows(rows: Sequence[dict[str, Any]]) -> dict[tuple[str, int], dict[str, dict[str, Any]]]:
    """Per (cell, concurrency) and router, its rounds pooled: hit rate (cached / prompt tokens, summed
    over the requests' usage), TTFT mean weighted by requests, prediction errors' median of medians."""
    out: dict[tuple[str, int], dict[str, dict[str, Any]]] = {}
    for r in rows:
        if not r.get("requests"):
            continue
        key = (r["cell"], int(r.get("concurrency", 1)))
        acc = out.setdefault(key, {}).setdefault(
            r["router"], {"kind": r.get("kind", ""), "prompt": 0, "cached": 0, "requests": 0, "ttft_sum": 0.0,
                          "rounds": 0, "mdape": [], "hindsight": [], "known": []},
        )  # fmt: skip
        acc["prompt"] += r["prompt_tokens"]
        acc["cached"] += r["cached_tokens"]
        acc["requests"] += r["requests"]
        acc["ttft_sum"] += r["ttft_ms"]["mean"] * r["requests"]
        acc["rounds"] += 1
        if r.get("predictions"):
            acc["mdape"].append(r["predictions"]["mdape"])
        if r.get("hindsight_mdape") is not None:
            acc["hindsight"].append(r["hindsight_mdape"])
        if r.get("hindsight_known_mdape") is not None:
            acc["known"].append(r["hindsight_known_mdape"])
    return out


def peer_summary(rows: Sequence[dict[str, Any]]) -> str:
    """Per cell and concurrency: each router's hit rate and TTFT mean, against the best peer's (the highest
    hit rate and the lowest TTFT mean among the routers that are not prefix-router)."""
    lines = [
        "| cell | in flight | router | rounds | hit rate | hit - best peer's | TTFT mean ms "
        "| TTFT / best peer's | predicted TTFT MdAPE | hindsight fit's MdAPE: on what a router knows "
        "| with later arrivals |",
        "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for (cell, concurrency), routers in pooled_rows(rows).items():
        stats = {
            name: (a["cached"] / a["prompt"] if a["prompt"] else 0.0, a["ttft_sum"] / a["requests"])
            for name, a in routers.items()
        }
        peers_ = [name for name, a in routers.items() if a["kind"] != "prefix-router"]
        best_hit = max((stats[p][0] for p in peers_), default=None)
        best_ttft = min((stats[p][1] for p in peers_), default=None)
        for name, a in routers.items():
            hit, ttft = stats[name]
            dhit = "n/a" if best_hit is None else f"{(hit - best_hit) * 100:+.1f} pt"
            ratio = "n/a" if not best_ttft else f"{ttft / best_ttft:.2f}x"
            lines.append(f"| {cell} | {concurrency} | {name} | {a['rounds']} | {hit * 100:.1f} % | {dhit} "
                         f"| {ttft:,.0f} | {ratio} | {_median_pct(a['mdape'])} | {_median_pct(a['known'])} "
                         f"| {_median_pct(a['hindsight'])} |")  # fmt: skip
    return "\n".join(lines) + "\n"


def _median_pct(values: Sequence[float]) -> str:
    return f"{statistics.median(values) * 100:.0f} %" if values else "n/a"


def rotated(routers: Sequence[Router], round_: int) -> list[Router]:
    """The routers' order in round ``round_``: rotated by one each round, so none always runs first."""
    k = round_ % len(routers) if routers else 0
    return [*routers[k:], *routers[:k]]


def read_records(path: str | None) -> list[dict[str, Any]]:
    if not path or not Path(path).is_file():
        return []
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def with_ideal(rows: list[dict[str, Any]], cell: Cell, groups: Groups, block: int) -> None:
    """Set ``ideal_hit_rate`` on ``cell``'s rows (tenants' cacheable prefixes from all of its runs)."""
    mine = [r for r in rows if r["cell"] == cell.name]
    if not groups.ideal_known:
        return
    runs = [read_records(r.get("records")) for r in mine]
    cacheable = tenant_cacheable(runs, groups)
    for row, records in zip(mine, runs, strict=True):
        prompt = sum(int(r["prompt_tokens"] or 0) for r in records)
        if prompt:
            row["ideal_hit_rate"] = round(ideal_cached(records, groups, block, cacheable) / prompt, 4)


def percent(value: float | None) -> str:
    return "n/a" if value is None else f"{value * 100:.1f} %"


def ms(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.0f}"


def preempted(row: dict[str, Any]) -> str:
    """Requests each engine preempted during the run (vLLM's ``num_preemptions``), or n/a."""
    per = row.get("preemptions_per_worker")
    return "n/a" if per is None else " + ".join(str(v) for v in per.values())


def table(rows: Sequence[dict[str, Any]]) -> str:
    head = ("| cell | router | TTFT p50 | p90 | p99 | mean (ms) | engine hit rate | ideal "
            "| engine busy (CPU s) | router CPU (s) | requests per worker | preempted "
            "| load avg |")  # fmt: skip
    lines = [head, "|" + "---|" * 13]
    for r in rows:
        t = r.get("ttft_ms") or {}
        per = r.get("requests_per_worker") or {}
        busy = " + ".join(str(e) for e in r["engine_cpu_s"])
        label = r["router"] + (f" @{r['concurrency']} r{r['round']}" if "round" in r else "")
        lines.append(
            f"| {r['cell']} | {label} | {ms(t.get('p50'))} | {ms(t.get('p90'))} | {ms(t.get('p99'))} "
            f"| {ms(t.get('mean'))} | {percent(r.get('engine_hit_rate'))} "
            f"| {percent(r.get('ideal_hit_rate'))} "
            f"| {busy} | {r['router_cpu_s']} | {' / '.join(str(v) for v in per.values())} "
            f"| {preempted(r)} | {r['load_avg_start']} -> {r['load_avg_end']} |"
        )
    return "\n".join(lines) + "\n"


DEFAULT_PLAN = (
    "shared:random,round_robin,least_load,prefix,sglang,vllm;interleaved:random,prefix,sglang,vllm;"
    "unique:random,prefix"
)


def interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=Path("/tmp/prefix-router-vllm-real"))
    p.add_argument("--plan", default=DEFAULT_PLAN, help="CELL:ROUTER,ROUTER;CELL:... (default: %(default)s)")
    p.add_argument("--instances", type=int, default=3, help="vLLM engines (default 3; about 3.8 GB each)")
    p.add_argument("--prompts-per-engine", type=int, default=PROMPTS_PER_ENGINE,
                   help="shared: tenants per engine (default %(default)s: the default cache)")  # fmt: skip
    p.add_argument("--requests", type=int, help="requests per run (default: the cell's)")
    p.add_argument("--concurrency", type=int, nargs="+", default=[1], help="sessions in flight (default 1)")
    p.add_argument("--rounds", type=int, default=1, help="rounds per concurrency, routers' order rotated")
    p.add_argument("--no-predictions", dest="predictions", action="store_false",
                   help="prefix-router logs at warning: no access line, no prediction error")  # fmt: skip
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--kv-cache-tokens", type=int, default=DEFAULT_KV_CACHE_TOKENS,
                   help="per engine (default %(default)s: 28 blocks of 128)")  # fmt: skip
    p.add_argument("--optimization-level", type=int, default=0, help="vLLM's -O (0: eager, fast start-up)")
    p.add_argument("--dtype", choices=("auto", "bfloat16", "float32"), default="auto",
                   help="engine compute type (auto: bfloat16 where the CPU has it natively)")  # fmt: skip
    p.add_argument("--port-base", type=int, default=18700, help="router port (engines from base+10)")
    p.add_argument("--peers-venv", type=Path, default=Path("/tmp/peers"))
    p.add_argument("--retable", action="store_true",
                   help="start nothing: redo ideal hit rates and table.md from OUT/runs.json")  # fmt: skip
    return p.parse_args(argv)


def parse_plan(
    text: str, instances: int, prompts_per_engine: int = PROMPTS_PER_ENGINE
) -> list[tuple[Cell, list[Router]]]:
    """``CELL:ROUTER,ROUTER;CELL:...`` -> the cells (for ``instances`` engines) and their routers."""
    known = cells(instances, prompts_per_engine)
    return [(known[cell], [ROUTERS[r] for r in names.split(",")])
            for cell, _, names in (item.partition(":") for item in text.split(";"))]  # fmt: skip


def fleet_settings(args: argparse.Namespace) -> VllmSettings:
    """The engines: ``--instances`` on ports from ``--port-base`` + 10, instance i on core i mod the CPUs."""
    return VllmSettings(instances=args.instances, port_base=args.port_base + 10,
                        kv_cache_tokens=args.kv_cache_tokens, max_num_seqs=8, dtype=args.dtype,
                        optimization_level=args.optimization_level, log_dir=args.out / "engines")  # fmt: skip


def retable(args: argparse.Namespace) -> list[dict[str, Any]]:
    """The rows of ``OUT/runs.json`` with their ideal hit rates (cells as in ``--plan``) and hindsight
    errors recomputed from their records."""
    rows: list[dict[str, Any]] = json.loads((args.out / "runs.json").read_text())
    for row in rows:
        if row.get("records"):
            with_hindsight(row)
    for cell, _ in parse_plan(args.plan, args.instances, args.prompts_per_engine):
        groups = prefix_groups(cell, args.requests or cell.requests, args.seed)
        with_ideal(rows, cell, groups, fleet_settings(args).block_size)
    return rows


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.retable:
        rows = retable(args)
        (args.out / "runs.json").write_text(json.dumps(rows, indent=1) + "\n")
        (args.out / "table.md").write_text(table(rows))
        print(table(rows))
        print(peer_summary(rows))
        return 0
    plan = parse_plan(args.plan, args.instances, args.prompts_per_engine)
    if any(r.kind != "prefix-router" for _, routers in plan for r in routers):
        ensure_peers(args.peers_venv)
    args.out.mkdir(parents=True, exist_ok=True)
    settings = fleet_settings(args)
    rows: list[dict[str, Any]] = []
    signal.signal(signal.SIGTERM, interrupt)  # the engines are stopped on the way out
    with VllmFleet(settings) as fleet:
        for cell, routers in plan:
            groups = prefix_groups(cell, args.requests or cell.requests, args.seed)
            for concurrency in args.concurrency:
                for round_ in range(args.rounds):
                    for router in rotated(routers, round_):
                        print(f"{cell.name} @{concurrency} round {round_}: {router.label}", flush=True)
                        rows.append(run_one(fleet, cell, router, args, concurrency, round_))
                        with_ideal(rows, cell, groups, settings.block_size)
                        print(table(rows[-1:]).splitlines()[-1], flush=True)
                        (args.out / "runs.json").write_text(json.dumps(rows, indent=1) + "\n")
    (args.out / "table.md").write_text(table(rows))
    (args.out / "summary.md").write_text(peer_summary(rows))
    print(table(rows))
    print(peer_summary(rows))
    return 0 if all(r["rc"] == 0 for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
