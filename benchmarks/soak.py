"""Soak: sustained traffic through a real ``prefix-router serve`` process in front of simulated engines
(engine-sim processes: every latency here is SIMULATED), bounded in time and in memory, with the router's
resident memory, descriptors and tables sampled as it runs.

The traffic mixes multi-turn conversations (with session ids, so the session table churns), one-off prompts
over shared system prompts (so the prefix index fills up and evicts), completions, streams and not, several
tenants (``tenants.isolate``), and two injected faults: clients that hang up mid-stream, and
(with ``--kill-every``) an engine killed with SIGKILL and restarted on its address a few seconds later.
Small table bounds are configured so that they bind within minutes.

    python benchmarks/soak.py --duration 600 --kill-every 60 \
        --out benchmarks/results/soak.json --plot docs/figures/soak_rss.png

Exit status 0 when the run saw no error beyond the injected faults and resident memory levelled off (grew
less than max(2 MiB, 3 %) over the second half of the run), 1 otherwise.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import secrets
import selectors
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import psutil  # type: ignore[import-untyped,unused-ignore]
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from prefix_router.lab.launch.net import free_port
from prefix_router.protocol import SESSION_HEADER

READY_PREFIX = "ENGINE-SIM READY "
MIB = 1024 * 1024
WORDS = ("router", "engine", "prefix", "cache", "token", "block", "worker", "stream", "tenant", "session")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--duration", type=float, default=600.0, help="seconds of traffic")
    p.add_argument("--engines", type=int, default=3)
    p.add_argument("--concurrency", type=int, default=24)
    p.add_argument("--time-scale", type=float, default=0.1, help="engine-sim wall seconds per model second")
    p.add_argument("--sample-s", type=float, default=5.0, help="seconds between samples")
    p.add_argument("--disconnect-rate", type=float, default=0.02, help="share of streams hung up early")
    p.add_argument("--kill-every", type=float, default=0.0, help="kill and restart an engine every N s")
    p.add_argument("--tenants", type=int, default=4)
    p.add_argument(
        "--max-total-blocks", type=int, default=50_000, help="router bound routing.index.max_total_blocks"
    )
    p.add_argument(
        "--max-sessions", type=int, default=2_000, help="router bound routing.sessions.max_sessions"
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, help="write samples and summary as JSON")
    p.add_argument("--plot", type=Path, help="write an RSS / index plot (PNG)")
    return p.parse_args(argv)


# ---------------------------------------------------------------------------------------- processes


def stop(proc: subprocess.Popen[bytes], grace_s: float = 5.0) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@dataclass
class Engine:
    port: int
    time_scale: float
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        argv = [
            sys.executable,
            "-m",
            "prefix_router.lab.sim",
            "--port",
            str(self.port),
            "--model",
            "m",
        ]
        self.proc = subprocess.Popen([*argv, "--time-scale", str(self.time_scale)], stdout=subprocess.PIPE)
        wait_ready_line(self.proc)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def wait_ready_line(proc: subprocess.Popen[bytes], timeout_s: float = 30.0) -> None:
    assert proc.stdout is not None
    with selectors.DefaultSelector() as selector:
        selector.register(proc.stdout, selectors.EVENT_READ)
        if not selector.select(timeout_s):
            raise RuntimeError("engine-sim did not start")
    line = proc.stdout.readline().decode()
    if not line.startswith(READY_PREFIX):
        raise RuntimeError(f"engine-sim failed: {line!r}")


def router_argv(opts: argparse.Namespace, engines: list[Engine], port: int, token: str) -> list[str]:
    settings = {
        "auth.admin_token": token,
        "tenants.isolate": "true",
        "routing.index.max_total_blocks": opts.max_total_blocks,
        "routing.sessions.max_sessions": opts.max_sessions,
        "health.interval_s": 0.5,
        "health.fail_threshold": 2,
        "log_level": "warning",
        "access_log": "false",  # hundreds of thousands of requests: warnings only on the terminal
    }
    argv = [sys.executable, "-m", "prefix_router.proxy", "serve", "--port", str(port)]
    argv += [arg for i, e in enumerate(engines) for arg in ("--worker", f"sim{i}={e.url}")]
    return argv + [arg for k, v in settings.items() for arg in ("--set", f"{k}={v}")]


@contextlib.contextmanager
def cluster(
    opts: argparse.Namespace, token: str
) -> Iterator[tuple[list[Engine], subprocess.Popen[bytes], str]]:
    """Engines and a router process; yields (engines, router process, router URL)."""
    engines = [Engine(free_port(), opts.time_scale) for _ in range(opts.engines)]
    router: subprocess.Popen[bytes] | None = None
    try:
        for engine in engines:
            engine.start()
        port = free_port()
        router = subprocess.Popen(router_argv(opts, engines, port, token))
        yield engines, router, f"http://127.0.0.1:{port}"
    finally:
        if router is not None:
            stop(router)
        for engine in engines:
            engine.kill()


async def wait_ready(http: aiohttp.ClientSession, url: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(aiohttp.ClientError):
            async with http.get(url + "/ready") as resp:
                if resp.status == 200:
                    return
        await asyncio.sleep(0.2)
    raise RuntimeError("the router did not become ready")


# ---------------------------------------------------------------------------------------- workload


def text(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words))


@dataclass
class Conversation:
    tenant: int
    session: str
    messages: list[dict[str, str]]
    turns_left: int


@dataclass
class Workload:
    """Requests to send; live conversations are bounded (``max_conversations``)."""

    rng: random.Random
    tenants: int
    systems: list[str] = field(default_factory=list)
    conversations: list[Conversation] = field(default_factory=list)
    max_conversations: int = 64

    def __post_init__(self) -> None:
        self.systems = [f"System prompt {i}. " + text(self.rng, 300) for i in range(8)]

    def next(self) -> tuple[str, dict[str, Any], dict[str, str], Conversation | None]:
        """(path, body, headers, the conversation to extend with the reply, if any)."""
        roll = self.rng.random()
        if roll < 0.6:
            return self._turn()
        tenant = self.rng.randrange(self.tenants)
        headers = {"Authorization": f"Bearer tenant-{tenant}"}
        if roll < 0.9:
            messages = [{"role": "system", "content": self.rng.choice(self.systems)}, self._user()]
            return "/v1/chat/completions", self._body(messages=messages), headers, None
        prompt = self.rng.choice(self.systems) + text(self.rng, self.rng.randint(20, 400))
        return "/v1/completions", self._body(prompt=prompt), headers, None

    def _turn(self) -> tuple[str, dict[str, Any], dict[str, str], Conversation]:
        if len(self.conversations) < self.max_conversations:
            system = {"role": "system", "content": self.rng.choice(self.systems)}
            tenant = self.rng.randrange(self.tenants)
            turns = self.rng.randint(2, 8)
            self.conversations.append(Conversation(tenant, secrets.token_hex(8), [system], turns))
        conv = self.rng.choice(self.conversations)
        conv.messages.append(self._user())
        conv.turns_left -= 1
        if conv.turns_left <= 0:
            self.conversations.remove(conv)
        headers = {"Authorization": f"Bearer tenant-{conv.tenant}", SESSION_HEADER: conv.session}
        return "/v1/chat/completions", self._body(messages=list(conv.messages)), headers, conv

    def _user(self) -> dict[str, str]:
        return {"role": "user", "content": text(self.rng, self.rng.randint(5, 120))}

    def _body(self, **fields: Any) -> dict[str, Any]:
        stream = self.rng.random() < 0.5
        body = {"model": "m", "max_tokens": self.rng.randint(4, 48), "stream": stream, **fields}
        if stream:
            body["stream_options"] = {"include_usage": True}
        return body


# ---------------------------------------------------------------------------------------- traffic


@dataclass
class Tally:
    outcomes: Counter[str] = field(default_factory=Counter)

    @property
    def done(self) -> int:
        return sum(self.outcomes.values())

    def unexpected(self, kills: bool) -> int:
        allowed = {"ok", "hung_up"} | ({"cut_by_kill"} if kills else set())
        return sum(n for kind, n in self.outcomes.items() if kind not in allowed)


def reply_text(raw: bytes, stream: bool) -> tuple[str, str | None]:
    """(outcome, assistant text) of a response body."""
    if not stream:
        body = orjson.loads(raw)
        choice = body["choices"][0]
        return "ok", choice.get("message", {}).get("content") or choice.get("text")
    parts: list[str] = []
    for event in raw.split(b"\n\n"):
        payload = event.removeprefix(b"data: ")
        if not event.startswith(b"data: ") or payload == b"[DONE]":
            continue
        data = orjson.loads(payload)
        if "error" in data:
            return ("cut_by_kill" if data["error"].get("code") == "upstream_io" else "stream_error"), None
        for choice in data.get("choices") or []:
            parts.append((choice.get("delta") or {}).get("content") or choice.get("text") or "")
    return ("ok" if raw.rstrip().endswith(b"[DONE]") else "truncated"), "".join(parts)


async def one(http: aiohttp.ClientSession, url: str, work: Workload, hang_up: bool) -> str:
    path, body, headers, conv = work.next()
    async with http.post(url + path, data=orjson.dumps(body), headers=headers) as resp:
        if resp.status != 200:
            await resp.read()
            return f"HTTP {resp.status}"
        if hang_up and body["stream"]:
            await resp.content.readany()
            resp.close()
            return "hung_up"
        outcome, reply = reply_text(await resp.read(), body["stream"])
    if conv is not None and reply is not None:
        conv.messages.append({"role": "assistant", "content": reply})
    return outcome


async def client_loop(http: aiohttp.ClientSession, url: str, work: Workload, opts: argparse.Namespace,
                      tally: Tally, stop_at: float) -> None:  # fmt: skip
    while time.monotonic() < stop_at:
        hang_up = work.rng.random() < opts.disconnect_rate
        try:
            outcome = await one(http, url, work, hang_up)
        except (aiohttp.ClientError, TimeoutError, orjson.JSONDecodeError, KeyError) as exc:
            outcome = f"exception {type(exc).__name__}"
        tally.outcomes[outcome] += 1


async def fault_loop(
    engines: list[Engine], every_s: float, down_s: float, stop_at: float, log: list[str]
) -> None:
    """Kill one engine (in turn) every ``every_s`` seconds and restart it ``down_s`` later."""
    victim = 0
    while every_s > 0 and time.monotonic() + every_s + down_s < stop_at:
        await asyncio.sleep(every_s)
        engine = engines[victim % len(engines)]
        engine.kill()
        log.append(f"{time.strftime('%H:%M:%S')} killed sim{victim % len(engines)}")
        await asyncio.sleep(down_s)
        await asyncio.to_thread(engine.start)
        victim += 1


# ---------------------------------------------------------------------------------------- sampling


@dataclass
class Sample:
    t_s: float
    rss_mib: float
    fds: int
    requests: int
    unexpected: int
    index_entries: int
    tracked_requests: int
    sessions: int


async def sample(http: aiohttp.ClientSession, url: str, token: str, proc: psutil.Process,
                 began: float, tally: Tally, kills: bool) -> Sample:  # fmt: skip
    headers = {"Authorization": f"Bearer {token}"}
    async with http.get(url + "/admin/routing", headers=headers) as resp:
        summary = (await resp.json())["summary"]
    return Sample(
        t_s=round(time.monotonic() - began, 1),
        rss_mib=round(proc.memory_info().rss / MIB, 2),
        fds=proc.num_fds(),
        requests=tally.done,
        unexpected=tally.unexpected(kills),
        index_entries=summary["index"]["entries"],
        tracked_requests=summary["tracked_requests"],
        sessions=summary["sessions"],
    )


async def sample_loop(http: aiohttp.ClientSession, url: str, token: str, pid: int, opts: argparse.Namespace,
                      tally: Tally, samples: list[Sample], stop_at: float) -> None:  # fmt: skip
    proc, began = psutil.Process(pid), time.monotonic()
    with Progress(transient=True) as progress:
        task = progress.add_task("soak (simulated engines)", total=opts.duration)
        while time.monotonic() < stop_at:
            await asyncio.sleep(min(opts.sample_s, max(0.0, stop_at - time.monotonic())))
            with contextlib.suppress(aiohttp.ClientError):
                samples.append(await sample(http, url, token, proc, began, tally, opts.kill_every > 0))
            progress.update(task, completed=time.monotonic() - began, description=progress_text(samples))


def progress_text(samples: list[Sample]) -> str:
    if not samples:
        return "soak (simulated engines)"
    s = samples[-1]
    return f"soak: {s.requests} requests, RSS {s.rss_mib:.1f} MiB, index {s.index_entries}"


# ---------------------------------------------------------------------------------------- summary


def slope_mib_per_min(samples: list[Sample]) -> float:
    n = len(samples)
    if n < 2:
        return 0.0
    mean_t = sum(s.t_s for s in samples) / n
    mean_r = sum(s.rss_mib for s in samples) / n
    cov = sum((s.t_s - mean_t) * (s.rss_mib - mean_r) for s in samples)
    var = sum((s.t_s - mean_t) ** 2 for s in samples) or 1.0
    return cov / var * 60.0


def summarize(
    samples: list[Sample], tally: Tally, opts: argparse.Namespace, faults: list[str]
) -> dict[str, Any]:
    half = [s for s in samples if s.t_s >= opts.duration / 2] or samples[-1:]
    growth = half[-1].rss_mib - half[0].rss_mib if half else 0.0
    leveled = growth <= max(2.0, 0.03 * half[0].rss_mib) if half else False
    return {
        "engines": "simulated (engine-sim)",
        "duration_s": opts.duration,
        "requests": tally.done,
        "requests_per_s": round(tally.done / opts.duration, 1),
        "outcomes": dict(tally.outcomes),
        "unexpected_errors": tally.unexpected(opts.kill_every > 0),
        "faults_injected": faults,
        "rss_mib": {
            "first": samples[0].rss_mib if samples else None,
            "at_half": half[0].rss_mib if half else None,
            "last": samples[-1].rss_mib if samples else None,
            "max": max((s.rss_mib for s in samples), default=None),
            "growth_second_half": round(growth, 2),
            "slope_second_half_mib_per_min": round(slope_mib_per_min(half), 3),
        },
        "leveled_off": leveled,
        "fds": {
            "first": samples[0].fds if samples else None,
            "max": max((s.fds for s in samples), default=None),
        },
        "bounds": bound_report(samples, opts),
    }


def bound_report(samples: list[Sample], opts: argparse.Namespace) -> dict[str, Any]:
    entries = max((s.index_entries for s in samples), default=0)
    sessions = max((s.sessions for s in samples), default=0)
    return {
        "index_entries_max": entries,
        "index_bound": opts.max_total_blocks,
        "sessions_max": sessions,
        "sessions_bound": opts.max_sessions,
        "tracked_requests_last": samples[-1].tracked_requests if samples else None,
        "within_bounds": entries <= opts.max_total_blocks and sessions <= opts.max_sessions,
    }


def print_report(console: Console, samples: list[Sample], summary: dict[str, Any]) -> None:
    table = Table(title="soak: router process, simulated engines")
    for column in ("t s", "RSS MiB", "fds", "requests", "unexpected", "index", "tracked", "sessions"):
        table.add_column(column, justify="right")
    step = max(1, len(samples) // 20)
    for s in samples[::step] + ([samples[-1]] if samples and (len(samples) - 1) % step else []):
        table.add_row(*(str(v) for v in asdict(s).values()))
    console.print(table)
    console.print_json(data=summary)


def plot(path: Path, samples: list[Sample]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, left = plt.subplots(figsize=(8, 4))
    minutes = [s.t_s / 60 for s in samples]
    left.plot(minutes, [s.rss_mib for s in samples], color="tab:blue", label="router RSS (MiB)")
    left.set_xlabel("minutes")
    left.set_ylabel("RSS MiB", color="tab:blue")
    right = left.twinx()
    right.plot(minutes, [s.index_entries for s in samples], color="tab:orange", label="index entries")
    right.set_ylabel("prefix index entries", color="tab:orange")
    left.set_title("prefix-router soak: resident memory and index size (simulated engines)")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


# ---------------------------------------------------------------------------------------- main


async def soak(
    opts: argparse.Namespace, url: str, token: str, pid: int, engines: list[Engine]
) -> tuple[list[Sample], Tally, list[str]]:
    tally, samples, faults = Tally(), list[Sample](), list[str]()
    timeout = aiohttp.ClientTimeout(total=120)
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as http:
        await wait_ready(http, url)
        stop_at = time.monotonic() + opts.duration
        work = Workload(random.Random(opts.seed), opts.tenants)
        clients = [client_loop(http, url, work, opts, tally, stop_at) for _ in range(opts.concurrency)]
        await asyncio.gather(
            *clients,
            sample_loop(http, url, token, pid, opts, tally, samples, stop_at),
            fault_loop(engines, opts.kill_every, 3.0, stop_at, faults),
        )
        samples.append(
            await sample(http, url, token, psutil.Process(pid), stop_at - opts.duration, tally, bool(faults))
        )
    return samples, tally, faults


def main(argv: list[str] | None = None) -> int:
    opts = parse_args(argv)
    console, token = Console(), secrets.token_hex(16)
    with cluster(opts, token) as (engines, router, url):
        samples, tally, faults = asyncio.run(soak(opts, url, token, router.pid, engines))
    summary = summarize(samples, tally, opts, faults)
    print_report(console, samples, summary)
    if opts.out is not None:
        opts.out.parent.mkdir(parents=True, exist_ok=True)
        opts.out.write_text(
            json.dumps({"summary": summary, "samples": [asdict(s) for s in samples]}, indent=1)
        )
    if opts.plot is not None and samples:
        plot(opts.plot, samples)
    ok = summary["unexpected_errors"] == 0 and summary["bounds"]["within_bounds"] and summary["leveled_off"]
    return 0 if ok else 1


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
