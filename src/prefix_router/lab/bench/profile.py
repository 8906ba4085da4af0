"""Where the router's CPU goes per request: py-spy samples of a router process, sorted into stages.

``prefix-router bench-overhead --profile`` records the router with `py-spy <https://github.com/benfred/py-spy>`_
(``py-spy record --format raw``: one line per distinct stack, ``frame;frame;... count``) while it serves
the throughput run, then sorts every sample into one stage of a request's trip:

- a stack that passes through ``replication/`` is ``share`` (the other processes' changes applied to
  the index count as sharing, not routing);
- else the innermost frame of the router's own code that a stage rule claims decides (so a metrics update
  made while settling a request counts as metrics, a key built while parsing counts as key);
- a stack with no such frame is sorted by its library frames (aiohttp's server side: ``server``);
- what is left is the event loop itself: polling, callbacks, socket reads and writes it does in C.

Sends are set apart (``send``): a sample whose innermost frame writes to a socket is mostly not CPU. On
loopback a send wakes the receiver (the worker, the client), which may take the sender's core at once,
and py-spy still sees the sender "running" in its write: measured with the router alone on one core
(``taskset``), those samples fell from a third of all to 6 %. So ``per_request`` splits only the user
CPU time among the stages, by the shares of the other samples, and reports the kernel's time (system
CPU, what the syscalls really cost) as ``kernel``; both come from ``/proc``.

Stages: ``parse`` (reading and decoding the body), ``key`` (routing key and block hashes), ``route`` (the
decision and the routing core's bookkeeping), ``forward`` (the upstream request until its answer's head),
``relay`` (the answer to the client), ``accounting`` (in-flight counts, reply accumulation, deadlines),
``metrics``, ``logging``, ``share`` (the other processes' view, ``serve --processes``), ``server``
(aiohttp's request handling outside the router's code) and ``loop``.

Shares of samples times the measured CPU per request give microseconds per request and stage.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

STAGES = (
    "parse", "key", "route", "forward", "relay", "accounting", "metrics", "logging", "share", "server",
    "loop", "kernel",
)  # fmt: skip
SEND = "send"  # not a stage: samples inside socket writes (see the module doc)
SEND_LEAVES = (  # py-spy's frames: "qualified name (path:line)"
    "Connection.start (prefix_router/node/upstream/http_client.py",
    "StreamWriter._write (aiohttp/http_writer.py",
    "StreamWriter._writelines (aiohttp/http_writer.py",
)

# (stage, substring of a frame "function (path:line)"), tried in order on each of the router's own frames
OWN_RULES: tuple[tuple[str, str], ...] = (
    ("logging", "logging/"),
    ("metrics", "node/telemetry/metrics.py"),
    ("share", "replication/"),
    ("key", "routing/keys.py"),
    ("key", "routing/hashing.py"),
    ("route", "routing/"),
    ("route", "node/steps/choice.py"),
    ("route", "Exchange.eligible"),
    ("route", "pool/pool.py"),
    ("accounting", "node/steps/accounting.py"),
    ("accounting", "node/request/sse.py"),
    ("accounting", "node/request/deadlines.py"),
    ("parse", "node/request/parse.py"),
    ("parse", "handlers.py"),
    ("forward", "node/upstream/seam.py"),
    ("forward", "node/upstream/http_client.py"),
    ("forward", "upstream_headers"),
    ("forward", "Exchange.attempt"),
    ("forward", "Exchange.upstream_request"),
    ("forward", "Exchange.read_prefix"),
    ("forward", "Exchange.open"),
    ("relay", "node/request/forward.py"),
    ("relay", "proxy/edge/exchange.py"),
)
LIBRARY_RULES: tuple[tuple[str, str], ...] = (
    ("logging", "logging/"),
    ("server", "aiohttp/web"),
    ("server", "aiohttp/http_"),
    ("server", "aiohttp/base_protocol"),
    ("server", "aiohttp/streams"),
    ("server", "aiohttp/"),
)

LOOP_FRAMES = ("run_app ", "run_until_complete ", "run_forever ", "run ", "_run_once ", "select ")


def stage_of(frames: list[str]) -> str:
    """The stage one sampled stack (outermost frame first) belongs to (or ``SEND``)."""
    if frames and frames[-1].startswith(SEND_LEAVES):
        return SEND
    if any("prefix_router/replication/" in frame for frame in frames):
        return "share"  # applying the other processes' changes runs the routing core: still sharing
    for frame in reversed(frames):
        if "logging/" in frame:
            return "logging"
        if "prefix_router/" not in frame or "prefix_router/node/life/server.py" in frame:
            continue
        for stage, needle in OWN_RULES:
            if needle in frame:
                return stage
    if frames and frames[-1].startswith(LOOP_FRAMES):  # the event loop's own C code (polling, I/O)
        return "loop"
    for frame in reversed(frames):
        for stage, needle in LIBRARY_RULES:
            if needle in frame:
                return stage
    return "loop"


def breakdown(lines: Iterable[str]) -> Counter[str]:
    """Samples per stage from py-spy's raw output."""
    out: Counter[str] = Counter()
    for line in lines:
        stack, _, count = line.rstrip().rpartition(" ")
        if stack and count.isdigit():
            out[stage_of(stack.split(";"))] += int(count)
    return out


def per_request(samples: Counter[str], user_s: float, system_s: float) -> dict[str, float]:
    """Microseconds of CPU per request and stage: the user CPU time split by the stages' shares of the
    samples (sends left out, see the module doc), the system CPU time as ``kernel``."""
    total = sum(n for stage, n in samples.items() if stage != SEND)
    if not total:
        return {}
    out = {stage: samples[stage] / total * user_s * 1e6 for stage in STAGES}
    out["kernel"] = system_s * 1e6
    return out


def py_spy() -> str | None:
    """The py-spy executable (next to this Python first, then on PATH)."""
    local = Path(sys.executable).with_name("py-spy")
    return str(local) if local.exists() else shutil.which("py-spy")


class Recording:
    """``py-spy record`` attached to ``pid`` until ``stop()``; its raw output lands in ``path``."""

    def __init__(self, exe: str, pid: int, path: Path, rate: int = 1000) -> None:
        self.path = path
        argv = [exe, "record", "-p", str(pid), "-r", str(rate), "-f", "raw", "-o", str(path), "--nonblocking"]
        self._proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def stop(self) -> Counter[str]:
        self._proc.send_signal(2)  # SIGINT: py-spy writes its output and exits
        try:
            self._proc.wait(30)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        if not self.path.exists():
            return Counter()
        with self.path.open() as lines:
            return breakdown(lines)
