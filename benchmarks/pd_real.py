"""Real prefill/decode benchmark (issue 42): on real vLLM CPU engines (SmolLM2-135M, its own weights), one
prefill and one decode engine of vLLM's shared-storage connector (``ExampleConnector``, started by the lab
launcher as ``prefix-router engines vllm --prefill 1 --decode 1`` starts them) behind prefix-router's P/D
(``disaggregation.flow: shared_storage``), vllm-router 0.1.17 (``--vllm-pd-disaggregation``) and SMG 1.13
(``smg launch --pd-disaggregation``, ``cache_aware`` prefill; decode ``power_of_two``, which SMG refuses
with one decode worker, so ``round_robin`` over the one), against the same
two engines' shape colocated (two ``both`` engines, prefix-router's ``prefix`` policy), over the same
requests from the same client.

    .venv/bin/python benchmarks/pd_real.py --out benchmarks/results/pd_real

Workload (``tenants``): ``--tenants`` system prompts of ``SYSTEM_WORDS`` words (about 620 SmolLM2 tokens:
four whole 128-token blocks, the unit the connector moves), each request one of them (in rotation) and a
question of its own, ``--output`` tokens streamed, ``--concurrency`` in flight (closed loop). Per router:
TTFT mean and p99 (the client's), the decode's inter-token latency p99 (the gaps between the stream's
content chunks after the first, pooled over the requests), the prefill pool's prefix-cache hit rate (the
prefill engine's ``vllm:prefix_cache_hits_total`` / ``queries_total`` over the run; colocated: both
engines'), and the tokens the answering engine reported cached (``usage.prompt_tokens_details``: for a
split request, what its decode engine loaded through the connector). Ratios: prefix-router P/D against the
best peer (lowest TTFT mean, lowest ITL p99) and against colocated. Every engine's prefix cache and the
connector's folder are emptied before each router's run; each router is started fresh.

Second part, the decider (``decider``): ``--conversations`` conversations of ``--turns`` turns each, sent
in rotation through prefix-router's P/D, each turn carrying its history (the engine's own replies): the
first turn of each is cold (the decider must never skip it), the later ones find their history on the
decode worker (held: skipped when at most ``skip_prefill_tokens`` of the prompt is uncached there). The
router's ``prefix_router_pd_requests_total{mode}`` is read after the first turns, then at the end.

Output: ``OUT/summary.md`` (the tables), ``OUT/runs.json``, engine and router logs under ``OUT/logs``.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import random
import re
import shutil
import statistics
import sys
import time
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
import peers  # benchmarks/peers.py: process helpers

from prefix_router.lab.launch.vllm import VllmFleet, VllmSettings
from prefix_router.lab.launch.vllm_cli import checked_config, serve_config

PR = str(Path(sys.executable).with_name("prefix-router"))
SYSTEM_WORDS = 600  # about 620 tokens: four whole 128-token blocks move through the connector
QUESTION_WORDS = 16
KV_CACHE_TOKENS = 48 * 128  # room for every tenant's prompt on one engine: hits measure routing, not eviction
VOCABULARY = (  # noqa: SIM905 (a list literal of 56 words is 56 lines)
    "river stone market winter garden signal copper lantern harbor meadow orbit pepper violin canyon "
    "ledger timber cobalt thistle beacon saddle quartz willow ember falcon marble tundra anchor prism "
    "walnut compass velvet glacier harvest summit cedar lagoon pixel fable mosaic nectar ribbon basalt "
    "cinder ferry juniper kettle lemon mango nickel oyster parcel quill raven sable tulip umber vapor"
).split()


def prose(seed: int, words: int) -> str:
    rng = random.Random(seed)
    return " ".join(rng.choice(VOCABULARY) for _ in range(words)) + "."


@dataclass
class Record:
    ttft_s: float
    gaps_s: list[float]
    prompt_tokens: int
    cached_tokens: int
    reply: str
    worker: str | None


@dataclass
class Run:
    label: str
    records: list[Record] = field(default_factory=list)
    prefill_hit_rate: float | None = None
    prefill_tokens: float = 0.0  # the prompt tokens the prefill pool looked up (its engines' queries)
    modes: dict[str, float] = field(default_factory=dict)  # prefix-router's prefix_router_pd_requests_total
    wall_s: float = 0.0
    errors: int = 0
    note: str = ""

    def summary(self) -> dict[str, Any]:
        ttfts = [r.ttft_s * 1000 for r in self.records]
        gaps = sorted(g * 1000 for r in self.records for g in r.gaps_s)
        prompt = sum(r.prompt_tokens for r in self.records)
        return {
            "router": self.label,
            "requests": len(self.records),
            "errors": self.errors,
            "ttft_mean_ms": statistics.fmean(ttfts) if ttfts else None,
            "ttft_p99_ms": quantile(sorted(ttfts), 0.99),
            "itl_p99_ms": quantile(gaps, 0.99),
            "itl_p50_ms": quantile(gaps, 0.5),
            "prefill_hit_rate": self.prefill_hit_rate,
            "prefill_tokens": self.prefill_tokens,
            "modes": self.modes,
            "answer_cached_share": sum(r.cached_tokens for r in self.records) / prompt if prompt else None,
            "wall_s": self.wall_s,
            "note": self.note,
        }


def quantile(values: Sequence[float], q: float) -> float | None:
    if not values:
        return None
    return values[min(len(values) - 1, int(q * len(values)))]


# ---------------------------------------------------------------- the client


def tenant_bodies(tenants: int, requests: int, output: int, seed: int, model: str) -> list[dict[str, Any]]:
    systems = [prose(seed * 1000 + t, SYSTEM_WORDS) for t in range(tenants)]
    bodies = []
    for i in range(requests):
        messages = [
            {"role": "system", "content": systems[i % tenants]},
            {"role": "user", "content": prose(seed * 1000 + 500 + i, QUESTION_WORDS)},
        ]
        bodies.append(chat_body(model, messages, output))
    return bodies


def chat_body(model: str, messages: list[dict[str, str]], output: int) -> dict[str, Any]:
    return {"model": model, "messages": messages, "max_tokens": output, "ignore_eos": True,
            "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}  # fmt: skip


async def send(http: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> Record:
    """One streamed request: its first content chunk's time, the gaps between the later ones, its usage."""
    started = time.perf_counter()
    stamps: list[float] = []
    usage: dict[str, Any] = {}
    text: list[str] = []
    async with http.post(url + "/v1/chat/completions", json=body) as response:
        if response.status != 200:
            raise RuntimeError(f"HTTP {response.status}: {(await response.text())[:300]}")
        worker = response.headers.get("x-prefix-router-worker")
        async for line in response.content:
            if not line.startswith(b"data: ") or line.startswith(b"data: [DONE]"):
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                usage = chunk["usage"]
            for choice in chunk.get("choices") or ():
                content = (choice.get("delta") or {}).get("content")
                if content:
                    stamps.append(time.perf_counter())
                    text.append(content)
    if not stamps:
        raise RuntimeError("no content streamed")
    details = usage.get("prompt_tokens_details") or {}
    return Record(stamps[0] - started, [b - a for a, b in itertools.pairwise(stamps)],
                  int(usage.get("prompt_tokens") or 0), int(details.get("cached_tokens") or 0),
                  "".join(text), worker)  # fmt: skip


async def drive(url: str, bodies: list[dict[str, Any]], concurrency: int, run: Run) -> None:
    queue = list(enumerate(bodies))
    timeout = aiohttp.ClientTimeout(total=600)
    async with aiohttp.ClientSession(timeout=timeout) as http:

        async def worker() -> None:
            while queue:
                _, body = queue.pop(0)
                try:
                    run.records.append(await send(http, url, body))
                except (RuntimeError, aiohttp.ClientError, TimeoutError) as exc:
                    run.errors += 1
                    print(f"# {run.label}: {exc}", file=sys.stderr)

        await asyncio.gather(*(worker() for _ in range(concurrency)))


# ---------------------------------------------------------------- engines and routers


def scrape(url: str) -> tuple[float, float]:
    """(prefix-cache hits, queries) of one engine's /metrics."""
    text = peers.fetch(url + "/metrics")
    hits = sum(float(v) for v in re.findall(r"^vllm:prefix_cache_hits_total\{[^}]*\} (\S+)", text, re.M))
    queries = sum(
        float(v) for v in re.findall(r"^vllm:prefix_cache_queries_total\{[^}]*\} (\S+)", text, re.M)
    )
    return hits, queries


def reset(fleet: VllmFleet) -> None:
    for url in fleet.urls:
        urllib.request.urlopen(urllib.request.Request(f"{url}/reset_prefix_cache", method="POST"), timeout=60)
    storage = fleet.settings.kv_storage_path
    if storage is not None and storage.exists():
        for child in storage.iterdir():
            shutil.rmtree(child) if child.is_dir() else child.unlink()


def fleet_settings(log_dir: Path, storage: Path | None) -> VllmSettings:
    knobs: dict[str, Any] = {"kv_cache_tokens": KV_CACHE_TOKENS, "max_model_len": 4096, "max_num_seqs": 8,
                             "log_dir": log_dir, "startup_timeout_s": 900.0}  # fmt: skip
    if storage is None:
        return VllmSettings(instances=2, **knobs)
    return VllmSettings.disaggregated(1, 1, kv_storage_path=storage, **knobs)


@contextmanager
def started(settings: VllmSettings) -> Iterator[VllmFleet]:
    fleet = VllmFleet(settings)
    fleet.start()
    try:
        yield fleet
    finally:
        fleet.stop()


def router_command(kind: str, fleet: VllmFleet, port: int, out: Path, peers_venv: Path) -> list[str]:
    urls = fleet.urls
    if kind == "prefix-router":
        config = serve_config(fleet)
        config["routing"] = {"policy": "prefix"}
        path = out / f"serve-{port}.yaml"
        path.write_text(yaml.safe_dump(checked_config(config), sort_keys=False))
        return [PR, "serve", "--config", str(path), "--port", str(port), "--set", "log_level=warning"]
    common = ["--host", "127.0.0.1", "--port", str(port), "--prometheus-host", "127.0.0.1",
              "--prometheus-port", str(port + 1)]  # fmt: skip
    if kind == "vllm-router":
        return [str(peers_venv / "bin" / "vllm-router"), *common, "--vllm-pd-disaggregation",
                "--prefill", urls[0], "--decode", urls[1], "--policy", "cache_aware",
                "--log-level", "warning"]  # fmt: skip
    # SMG refuses power_of_two with one decode worker ("requires at least 2"): it has nothing to choose
    decode_policy = "power_of_two" if len(urls) > 2 else "round_robin"
    return [str(peers_venv / "bin" / "smg"), "launch", *common, "--pd-disaggregation", "--prefill", urls[0],
            "--decode", urls[1], "--prefill-policy", "cache_aware", "--decode-policy", decode_policy,
            "--log-level", "warn"]  # fmt: skip


@contextmanager
def router(kind: str, fleet: VllmFleet, port: int, out: Path, peers_venv: Path) -> Iterator[str]:
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_ENDPOINT="http://127.0.0.1:9")  # never a model hub
    proc = peers.start(router_command(kind, fleet, port, out, peers_venv), out / f"{kind}-{port}.log", env)
    try:
        peers.wait_http(f"http://127.0.0.1:{port}/health", timeout_s=90)
        if kind == "smg":  # its workers are registered in the background, after /health answers
            wait_workers(f"http://127.0.0.1:{port}/workers", len(fleet.urls), timeout_s=120)
        yield f"http://127.0.0.1:{port}"
    finally:
        peers.stop(proc)


def wait_workers(url: str, count: int, timeout_s: float) -> None:
    """Until SMG's ``/workers`` lists ``count`` healthy workers (503s otherwise: "No prefill workers")."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            listed = json.loads(peers.fetch(url)).get("workers") or []
        except json.JSONDecodeError:
            listed = []
        if sum(1 for w in listed if w.get("is_healthy")) >= count:
            return
        time.sleep(0.5)
    raise RuntimeError(f"{url}: fewer than {count} healthy workers within {timeout_s:.0f} s")


def alive(url: str) -> bool:
    try:
        peers.wait_http(url + "/health", timeout_s=2)
    except RuntimeError:
        return False
    return True


def measure(label: str, kind: str, fleet: VllmFleet, bodies: list[dict[str, Any]], args: argparse.Namespace,
            port: int) -> Run:  # fmt: skip
    reset(fleet)
    run = Run(label)
    prefill_urls = fleet.urls[:1] if fleet.settings.roles else fleet.urls
    before = [scrape(u) for u in prefill_urls]
    try:
        with router(kind, fleet, port, args.out / "logs", args.peers_venv) as url:
            started_at = time.perf_counter()
            asyncio.run(drive(url, bodies, args.concurrency, run))
            run.wall_s = time.perf_counter() - started_at
            run.modes = pd_modes(url) if kind == "prefix-router" else {}
    except RuntimeError as exc:  # the router never came up
        run.note = f"did not run: {exc}"
        return run
    dead = [i.role for i in fleet.instances if not alive(i.url)]
    if dead:  # seen: SMG's concurrent full request on the producer crashed it in the connector's load
        run.note = f"engine died during the run: {', '.join(dead)}"
    if dead:
        print(f"# {label}: {json.dumps(run.summary())}", file=sys.stderr, flush=True)
        return run  # its engine's counters restarted: no hit rate
    after = [scrape(u) for u in prefill_urls]
    hits = sum(a[0] - b[0] for a, b in zip(after, before, strict=True))
    queries = sum(a[1] - b[1] for a, b in zip(after, before, strict=True))
    run.prefill_hit_rate = hits / queries if queries else None
    run.prefill_tokens = queries
    print(f"# {label}: {json.dumps(run.summary())}", file=sys.stderr, flush=True)
    return run


# ---------------------------------------------------------------- the decider on a multi-turn workload


def pd_modes(url: str) -> dict[str, float]:
    text = peers.fetch(url + "/metrics")
    found = re.findall(r'^prefix_router_pd_requests_total\{mode="([^"]+)"\} (\S+)', text, re.M)
    return {mode: float(value) for mode, value in found}


def decider(fleet: VllmFleet, args: argparse.Namespace, port: int, model: str) -> dict[str, Any]:
    reset(fleet)
    histories = [[{"role": "user", "content": prose(7000 + c, 120)}] for c in range(args.conversations)]
    result: dict[str, Any] = {"conversations": args.conversations, "turns": args.turns}
    with router("prefix-router", fleet, port, args.out / "logs", args.peers_venv) as url:
        for turn in range(args.turns):
            run = Run(f"turn {turn}")
            bodies = [chat_body(model, h, args.output) for h in histories]
            for body, history in zip(bodies, histories, strict=True):
                asyncio.run(drive(url, [body], 1, run))
                reply = run.records[-1].reply if run.records else "ok"
                follow_up = prose(8000 + turn * 100 + len(history), 40)
                history += [{"role": "assistant", "content": reply}, {"role": "user", "content": follow_up}]
            modes = pd_modes(url)
            result[f"after_turn_{turn}"] = modes
            print(f"# decider after turn {turn}: {modes}", file=sys.stderr, flush=True)
    first, last = result["after_turn_0"], result[f"after_turn_{args.turns - 1}"]
    held = args.conversations * (args.turns - 1)
    skipped = last.get("decode_holds_prefix", 0.0) - first.get("decode_holds_prefix", 0.0)
    result |= {"cold_turns": args.conversations, "cold_skipped": first.get("decode_holds_prefix", 0.0),
               "later_turns": held, "later_skipped": skipped,
               "later_skip_rate": skipped / held if held else None}  # fmt: skip
    return result


# ---------------------------------------------------------------- the report


def modes(counts: dict[str, float]) -> str:
    return ", ".join(f"{mode} {n:.0f}" for mode, n in sorted(counts.items()) if n)


def table(runs: list[Run]) -> list[str]:
    rows = [r.summary() for r in runs]
    ours = next((r for r in rows if r["router"].startswith("prefix-router P/D")), None)
    colo = next((r for r in rows if "colocated" in r["router"]), None)
    # a peer whose run failed (errors, a dead engine) is shown, not compared against
    peers_ = [r for r in rows if r["router"].split()[0] in ("vllm-router", "smg") and r["ttft_mean_ms"]
              and not r["errors"] and not r["note"]]  # fmt: skip
    best_ttft = min((r["ttft_mean_ms"] for r in peers_), default=None)
    best_itl = min((r["itl_p99_ms"] for r in peers_ if r["itl_p99_ms"]), default=None)

    def num(v: Any, fmt: str = ".0f") -> str:
        return "-" if v is None else format(v, fmt)

    lines = [
        "| router | requests (errors) | prefill-pool hit rate (tokens looked up) | answer's cached share "
        "| TTFT mean ms | TTFT p99 ms | ITL p50 ms | ITL p99 ms | wall s | P/D modes |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['router']} | {r['requests']} ({r['errors']}) | {num(r['prefill_hit_rate'], '.3f')} "
            f"({r['prefill_tokens']:.0f}) "
            f"| {num(r['answer_cached_share'], '.3f')} | {num(r['ttft_mean_ms'])} | {num(r['ttft_p99_ms'])} "
            f"| {num(r['itl_p50_ms'], '.1f')} | {num(r['itl_p99_ms'], '.1f')} | {num(r['wall_s'])} "
            f"| {modes(r['modes']) or r['note']} |"
        )
    if ours is not None and ours["ttft_mean_ms"]:
        lines.append("")
        colocated = (colo["ttft_mean_ms"], colo["itl_p99_ms"]) if colo else (None, None)
        for name, (ttft, itl) in (("best P/D peer", (best_ttft, best_itl)), ("colocated", colocated)):
            if ttft and itl and ours["itl_p99_ms"]:
                lines.append(
                    f"prefix-router P/D vs {name}: TTFT mean x{ours['ttft_mean_ms'] / ttft:.2f}, "
                    f"ITL p99 x{ours['itl_p99_ms'] / itl:.2f}"
                )
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=Path("benchmarks/results/pd_real"))
    p.add_argument("--tenants", type=int, default=4)
    p.add_argument("--requests", type=int, default=24)
    p.add_argument("--output", type=int, default=24, help="tokens per answer")
    p.add_argument("--concurrency", type=int, default=2)
    p.add_argument("--conversations", type=int, default=3)
    p.add_argument("--turns", type=int, default=4)
    p.add_argument("--routers", default="prefix-router,vllm-router,smg")
    p.add_argument("--peers-venv", type=Path, default=Path("/tmp/peers"))
    p.add_argument("--port-base", type=int, default=18600)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--render", action="store_true", help="only print OUT/runs.json's report again")
    args = p.parse_args(argv)
    if args.render:
        return render(args)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "logs").mkdir(exist_ok=True)
    storage = (args.out / "logs" / "kv").resolve()  # the engines run elsewhere
    began = time.perf_counter()
    runs: list[Run] = []
    result: dict[str, Any] = {}
    port = args.port_base
    load = [os.getloadavg()[0]]
    with started(fleet_settings(args.out / "logs", storage)) as fleet:
        model = fleet.settings.model_alias
        bodies = tenant_bodies(args.tenants, args.requests, args.output, args.seed, model)
        labels = {"prefix-router": "prefix-router P/D (shared_storage)",
                  "vllm-router": "vllm-router P/D (cache_aware)",
                  "smg": "smg P/D (cache_aware / round_robin: one decode worker)"}  # fmt: skip
        kinds = args.routers.split(",")
        for kind in (k for k in kinds if k != "smg"):
            port += 2
            runs.append(measure(labels[kind], kind, fleet, bodies, args, port))
        port += 2
        result["decider"] = decider(fleet, args, port, model)
        if "smg" in kinds:  # last on this fleet: its flow has crashed the prefill engine here
            port += 2
            runs.append(measure(labels["smg"], "smg", fleet, bodies, args, port))
    load.append(os.getloadavg()[0])
    with started(fleet_settings(args.out / "logs", None)) as fleet:
        port += 2
        runs.append(
            measure("prefix-router colocated (prefix, 2 x both)", "prefix-router", fleet, bodies, args, port)
        )
    load.append(os.getloadavg()[0])
    result["runs"] = [r.summary() for r in runs]
    result["footer"] = (
        f"(real engines; wall {time.perf_counter() - began:.0f} s; load average "
        f"{', '.join(f'{x:.1f}' for x in load)}; {' '.join(sys.argv[1:])})"
    )
    (args.out / "runs.json").write_text(
        json.dumps(result | {"records": {r.label: [asdict(x) for x in r.records] for r in runs}}, indent=1)
    )
    return write_report(runs, result, args)


def write_report(runs: list[Run], result: dict[str, Any], args: argparse.Namespace) -> int:
    d = result["decider"]
    lines = [
        f"## P/D on real vLLM CPU engines (SmolLM2-135M, 1 prefill + 1 decode, shared-storage connector; "
        f"{args.tenants} tenants' ~620-token prompts, {args.requests} requests, {args.output} tokens each, "
        f"{args.concurrency} in flight)",
        "",
        *table(runs),
        "",
        f"## The decider (prefix-router P/D, {d['conversations']} conversations x {d['turns']} turns, "
        "each turn with its history)",
        "",
        f"cold first turns: {d['cold_turns']}, skipped {d['cold_skipped']:.0f}; later turns: "
        f"{d['later_turns']}, skipped {d['later_skipped']:.0f} ({(d['later_skip_rate'] or 0) * 100:.0f} %); "
        f"modes at the end: {d[f'after_turn_{args.turns - 1}']}",
        "",
        result["footer"],
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    (args.out / "summary.md").write_text(text)
    return 0


def render(args: argparse.Namespace) -> int:
    """The report again from ``OUT/runs.json`` (its tables as this version computes them)."""
    result = json.loads((args.out / "runs.json").read_text())
    runs = []
    for row in result["runs"]:
        run = Run(row["router"], [Record(**r) for r in result["records"].get(row["router"], [])])
        run.prefill_hit_rate, run.prefill_tokens = row["prefill_hit_rate"], row.get("prefill_tokens", 0.0)
        run.modes, run.wall_s, run.errors, run.note = (
            row.get("modes", {}),
            row["wall_s"],
            row["errors"],
            row["note"],
        )
        if run.note:  # a dead engine's counters restarted (measure() now keeps no hit rate then)
            run.prefill_hit_rate, run.prefill_tokens = None, 0.0
        runs.append(run)
    if "footer" not in result:  # written before the footer was kept: the report's own last line
        result["footer"] = (args.out / "summary.md").read_text().strip().splitlines()[-1]
    return write_report(runs, result, args)


if __name__ == "__main__":
    sys.exit(main())
