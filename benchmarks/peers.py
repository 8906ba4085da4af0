"""Fair peer run: prefix-router, sglang-router and vllm-router as their users run them (SIMULATED engines).

Every router is its own process on loopback, started fresh for each run (so no router carries a tree or
counters from the previous run) in front of the SAME simulated engines (``prefix-router engine-sim``,
vLLM-compatible, including vLLM's render and ``/tokenize`` endpoints that vllm-router's ``cache_aware``
calls), whose prefix caches are flushed before each run by the client. The client is the same for all:
``prefix-router bench --router URL`` (the official ``openai`` client, streaming, keep-alive).

Matrix: workloads x load levels (``CELLS``); per cell, every router in ``--routers``. The peers run
``cache_aware`` with their defaults: sglang-router twice, ``stock`` (as shipped) and ``+nodelay`` (with
``nodelay_shim.so`` preloaded, which sets TCP_NODELAY on accepted connections: sglang-router 0.3.2
does not, which delays a keep-alive client's first streamed token by ~30 ms; a transport artefact, not
routing); vllm-router stock only by default (it sets TCP_NODELAY itself). prefix-router as shipped
(one serving process per core) and with one process. Results: ``OUT/<workload>-<load>/<router>.json``
(+ ``.log``, the router's ``.metrics.txt``), merged by ``peers_table.py`` into ``OUT/peers.md``,
``OUT/peers.json`` and ``OUT/peers.png``.

Run it through ``benchmarks/peers.sh`` (installs the peers into their own venv and builds the shim).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PR = str(ROOT / ".venv" / "bin" / "prefix-router")


@dataclass(frozen=True, slots=True)
class Workload:
    name: str  # the bench workload
    options: tuple[str, ...]  # --workload-opt values
    rates: dict[str, float]  # load level -> Poisson arrival rate (sessions/s)
    requests: int


# Rates were calibrated on 4 engines (llama-3.1-8b-h100 profile, 20,480 KV tokens each, real time) with
# prefix-router's `prefix` policy: "cold" keeps the fleet about 25-35 % busy, "hot" about 75-90 % (each
# run's measured busy fraction is in its JSON and the table). Requests are turns (sessions have several).
CELLS: tuple[Workload, ...] = (
    Workload(
        "mixed",  # the demo's: 32 chatbot tenants (2,048-token system prompts) + ShareGPT conversations
        ("tenants=32", "system_tokens=2048", "zipf_s=0.6", "output_tokens=16", "max_output_tokens=32"),
        {"cold": 5.0, "hot": 17.0},
        300,
    ),
    Workload("agents", (), {"cold": 1.5, "hot": 4.2}, 300),  # tool-call loops, growing tool outputs
    # the Mooncake conversation trace's first rows, 64 tokens of text per 512-token hash block
    Workload("mooncake", ("block_tokens=64", "start_row=0"), {"cold": 4.0, "hot": 11.0}, 300),
)


@dataclass(frozen=True, slots=True)
class RouterSpec:
    label: str
    kind: str  # prefix-router | sglang-router | vllm-router
    policy: str
    nodelay_shim: bool = False
    processes: int | None = None  # prefix-router only: serve --processes (0: one per usable core)


# Both peers serve from one process with a tokio runtime of one worker thread per core (2 here, counted in
# /proc/PID/task), so prefix-router's like-for-like row is `serve` as shipped: --processes 0, one serving
# process per usable core. Its single-process row (--processes 1) is reported beside it.
ROUTERS: dict[str, RouterSpec] = {
    "prefix": RouterSpec("prefix-router prefix", "prefix-router", "prefix", processes=0),
    "prefix-1p": RouterSpec("prefix-router prefix 1 process", "prefix-router", "prefix", processes=1),
    "random": RouterSpec("prefix-router random", "prefix-router", "random"),
    "least_load": RouterSpec("prefix-router least_load", "prefix-router", "least_load"),
    # prefix-router's in-process emulation of SGLang's cache_aware, beside the real one (a fidelity check)
    "sglang-emulation": RouterSpec("prefix-router sglang_cache_aware", "prefix-router", "sglang_cache_aware"),
    "sglang": RouterSpec("sglang-router cache_aware stock", "sglang-router", "cache_aware"),
    "sglang-nodelay": RouterSpec("sglang-router cache_aware +nodelay", "sglang-router", "cache_aware", True),
    "vllm": RouterSpec("vllm-router cache_aware stock", "vllm-router", "cache_aware"),
    "vllm-nodelay": RouterSpec("vllm-router cache_aware +nodelay", "vllm-router", "cache_aware", True),
}
# vllm-router 0.1.17 sets TCP_NODELAY itself right after accept (NODELAY_SHIM_LOG=1 shows it), so its
# "+nodelay" row (`--routers ...,vllm-nodelay`) measures the same thing as its stock row: not run by default.
DEFAULT_ROUTERS = "prefix,prefix-1p,sglang,sglang-nodelay,vllm"


@dataclass(slots=True)
class Setup:
    out: Path
    peers_venv: Path
    shim: Path | None
    port_base: int
    seed: int
    engines: int
    engine_args: tuple[str, ...]
    workers: list[str] = field(default_factory=list)


# ---------------------------------------------------------------------- processes


def wait_http(url: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), urllib.request.urlopen(url, timeout=2) as resp:
            if resp.status == 200:
                return
        time.sleep(0.25)
    raise RuntimeError(f"no answer from {url} within {timeout_s:.0f} s")


def fetch(url: str) -> str:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return str(resp.read().decode("utf-8", "replace"))
    except OSError as exc:
        return f"# could not fetch {url}: {exc}\n"


def start(cmd: Sequence[str], log: Path, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    """Start ``cmd`` in its own process group (its children are stopped with it), output to ``log``."""
    with log.open("wb") as sink:
        return subprocess.Popen(cmd, stdout=sink, stderr=subprocess.STDOUT, env=env, start_new_session=True)


def stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM to the process group ``start`` made, SIGKILL after 15 s."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)  # stragglers of the group


@contextlib.contextmanager
def engines(setup: Setup) -> Iterator[list[str]]:
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for i in range(setup.engines):
            port = setup.port_base + 1 + i
            cmd = [PR, "engine-sim", "--port", str(port), *setup.engine_args]
            procs.append(start(cmd, setup.out / f"engine-{port}.log"))
        urls = [f"http://127.0.0.1:{setup.port_base + 1 + i}" for i in range(setup.engines)]
        for url in urls:
            wait_http(f"{url}/health")
        yield urls
    finally:
        for proc in procs:
            stop(proc)


def router_command(spec: RouterSpec, setup: Setup, port: int, metrics_port: int) -> list[str]:
    workers = setup.workers
    if spec.kind == "prefix-router":
        flags = [arg for w in workers for arg in ("--worker", w)]
        return [
            PR,
            "serve",
            *flags,
            "--policy",
            spec.policy,
            "--port",
            str(port),
            "--set",
            "log_level=warning",
            *(["--processes", str(spec.processes)] if spec.processes is not None else []),
        ]
    common = ["--host", "127.0.0.1", "--port", str(port), "--worker-urls", *workers, "--policy", spec.policy,
              "--prometheus-host", "127.0.0.1", "--prometheus-port", str(metrics_port)]  # fmt: skip
    if spec.kind == "sglang-router":
        python = str(setup.peers_venv / "bin" / "python")
        return [python, "-m", "sglang_router.launch_router", *common, "--log-level", "warn"]
    return [str(setup.peers_venv / "bin" / "vllm-router"), *common, "--log-level", "warning"]


def router_env(spec: RouterSpec, setup: Setup) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("LD_PRELOAD", None)
    if spec.kind == "sglang-router":  # never reach a model hub (peers.md)
        env.update(HF_HUB_OFFLINE="1", HF_ENDPOINT="http://127.0.0.1:9")
    if spec.nodelay_shim:
        if setup.shim is None:
            raise RuntimeError(f"{spec.label} needs --shim")
        env["LD_PRELOAD"] = str(setup.shim)
    return env


@contextlib.contextmanager
def router(spec: RouterSpec, setup: Setup, log: Path) -> Iterator[tuple[str, str]]:
    """A fresh router process; yields (its URL, its metrics URL)."""
    port, metrics_port = setup.port_base + 100, setup.port_base + 101
    cmd = router_command(spec, setup, port, metrics_port)
    proc = start(cmd, log, router_env(spec, setup))
    try:
        url = f"http://127.0.0.1:{port}"
        wait_http(f"{url}/health")
        peer_metrics = f"http://127.0.0.1:{metrics_port}/metrics"
        yield url, f"{url}/metrics" if spec.kind == "prefix-router" else peer_metrics
    finally:
        stop(proc)


# ---------------------------------------------------------------------- runs


def code_commit() -> str:
    """The checkout's commit (prefix-router's code under test), ``+dirty`` when ``src/`` has changes."""
    git = ["git", "-C", str(ROOT)]
    try:
        head = _output([*git, "rev-parse", "--short=12", "HEAD"])
        dirty = _output([*git, "status", "--porcelain", "--untracked-files=no", "--", "src"])
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return head + ("+dirty" if dirty else "")


def _output(cmd: list[str]) -> str:
    return subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=30).stdout.strip()


def bench_command(
    setup: Setup, workload: Workload, load: str, spec: RouterSpec, url: str, out: Path, requests: int
) -> list[str]:
    opts = [arg for o in workload.options for arg in ("--workload-opt", o)]
    rate = str(workload.rates[load])
    return [PR, "bench", "--workers", *setup.workers, "--router", url, "--label", spec.label,
            "--workload", workload.name, *opts, "--requests", str(requests), "--rate", rate,
            "--seed", str(setup.seed), "--no-progress", "--json", str(out)]  # fmt: skip


def slug(label: str) -> str:
    return label.replace(" ", "_").replace("+", "plus-")


def run_one(
    setup: Setup, workload: Workload, load: str, spec: RouterSpec, requests: int, cell_dir: Path, repeat: int
) -> dict[str, object]:
    name = f"{slug(spec.label)}.r{repeat}"
    result = cell_dir / f"{name}.json"
    started = time.monotonic()
    load_start = round(os.getloadavg()[0], 2)
    cmd = bench_command(setup, workload, load, spec, "URL", result, requests)
    try:
        with router(spec, setup, cell_dir / f"{name}.router.log") as (url, metrics_url):
            cmd = bench_command(setup, workload, load, spec, url, result, requests)
            cmd += ["--records", str(cell_dir / f"{name}.records.jsonl")]
            with (cell_dir / f"{name}.log").open("wb") as sink:
                rc = subprocess.call(cmd, stdout=sink, stderr=subprocess.STDOUT)
            (cell_dir / f"{name}.metrics.txt").write_text(fetch(metrics_url))
    except RuntimeError as exc:  # the router did not come up: say so, go on with the others
        print(f"    {spec.label}: {exc} (see {name}.router.log)", flush=True)
        rc = -1
    shown = " ".join(c if " " not in c else repr(c) for c in cmd)
    seconds = round(time.monotonic() - started, 1)
    load_avg = round(os.getloadavg()[0], 2)  # the machine's 1-minute load average as the run ended
    return {
        "label": spec.label,
        "file": name,
        "rc": rc,
        "seconds": seconds,
        "load_avg": load_avg,
        "load_avg_start": load_start,
        "command": shown,
    }


def run_matrix(
    setup: Setup,
    cells: Sequence[tuple[Workload, str]],
    specs: Sequence[RouterSpec],
    repeats: int,
    requests: int | None,
) -> list[dict[str, object]]:
    """Every router of every cell, ``repeats`` times; the order rotates per cell and reverses per repeat,
    so slow drifts of the (shared, noisy) machine do not always hit the same router."""
    runs: list[dict[str, object]] = []
    total = len(cells) * len(specs) * repeats
    for index, (workload, load) in enumerate(cells):
        cell_dir = setup.out / f"{workload.name}-{load}"
        cell_dir.mkdir(parents=True, exist_ok=True)
        shift = index % len(specs)
        order = list(specs[shift:]) + list(specs[:shift])
        for repeat in range(repeats):
            for spec in order if repeat % 2 == 0 else order[::-1]:
                rate = workload.rates[load]
                step = f"[{len(runs) + 1}/{total}] {workload.name} {load} ({rate:g}/s) #{repeat}"
                print(f"{step}: {spec.label}", flush=True)
                run = run_one(setup, workload, load, spec, requests or workload.requests, cell_dir, repeat)
                run.update(workload=workload.name, load=load, rate=rate, repeat=repeat)
                runs.append(run)
                if run["rc"] != 0:
                    print(f"    bench exited {run['rc']}: see {cell_dir / str(run['file'])}.log", flush=True)
    return runs


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=Path("/tmp/prefix-router-peers"))
    p.add_argument("--peers-venv", type=Path, default=Path("/tmp/peers"))
    p.add_argument("--shim", type=Path, help="the built nodelay_shim.so (for the +nodelay rows)")
    p.add_argument("--routers", default=DEFAULT_ROUTERS, help=f"comma-separated, of {', '.join(ROUTERS)}")
    p.add_argument("--workloads", default=",".join(w.name for w in CELLS))
    p.add_argument("--loads", default="cold,hot")
    p.add_argument("--rate", action="append", metavar="WORKLOAD:LOAD=R", help="override a cell's rate")
    p.add_argument("--requests", type=int, help="requests per run (default: the workload's)")
    p.add_argument("--repeats", type=int, default=2, help="runs per router and cell (pooled)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--engines", type=int, default=4)
    p.add_argument("--engine-arg", action="append", default=[], help="extra engine-sim argument")
    p.add_argument("--port-base", type=int, default=18500)
    args = p.parse_args(argv)
    workloads = {w.name: w for w in CELLS}
    for item in args.rate or []:
        key, _, value = item.partition("=")
        wname, _, load = key.partition(":")
        workloads[wname].rates[load] = float(value)
    cells = [(workloads[w], load) for w in args.workloads.split(",") for load in args.loads.split(",")]
    specs = [ROUTERS[r] for r in args.routers.split(",")]
    engine_args = ("--profile", "llama-3.1-8b-h100", "--kv-capacity-tokens", "20480", *args.engine_arg)
    args.out.mkdir(parents=True, exist_ok=True)
    setup = Setup(args.out, args.peers_venv, args.shim, args.port_base, args.seed, args.engines, engine_args)
    with engines(setup) as urls:
        setup.workers = urls
        runs = run_matrix(setup, cells, specs, args.repeats, args.requests)
    commit = code_commit()
    for run in runs:
        run["commit"] = commit
    manifest = {"engines": args.engines, "engine_args": list(engine_args), "seed": args.seed, "runs": runs,
                "commit": commit, "simulated": True}  # fmt: skip
    (args.out / "runs.json").write_text(json.dumps(manifest, indent=2) + "\n")
    return 0 if all(r["rc"] == 0 for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
