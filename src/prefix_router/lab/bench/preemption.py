"""Who takes a server's cores: the scheduler's switch events of a measured interval, read with
``perf record -e sched:sched_switch`` (Linux, root or ``perf_event_paranoid`` <= -1), each switch away
from one of the server's threads while it could still run (``prev_state`` R: a preemption, what
``/proc``'s ``nonvoluntary_ctxt_switches`` count) put down to the task that took the core.

``SwitchTrace`` records system-wide while its ``with`` block runs; ``preemptors`` names the takers: a
known pid by its given name (the load generator, the worker), a thread of the server itself as
``SERVER``, anything else by its command name. ``server_threads`` lists a process tree's thread ids (a
switch event names threads).
"""

from __future__ import annotations

import re
import shutil
import signal
import subprocess
import tempfile
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path

from prefix_router.lab.bench.overhead import threads

SERVER = "the server's own threads"
_SWITCH = re.compile(r"prev_pid=(\d+) prev_prio=\S+ prev_state=(\S+) ==> next_comm=(.*) next_pid=(\d+) ")


class TraceUnavailable(RuntimeError):
    """``perf`` is missing or may not trace scheduler events here."""


def server_threads(pid: int) -> set[int]:
    """The thread ids of a process and all its descendants (Linux ``/proc``; empty elsewhere)."""
    return {int(task.name) for task in threads(pid)}


def preemptors(lines: Iterable[str], victims: set[int], names: Mapping[int, str]) -> Counter[str]:
    """How often each task took a core from a thread of ``victims`` that could still run, from
    ``perf script`` lines of ``sched:sched_switch`` events (other lines are skipped)."""
    takers: Counter[str] = Counter()
    for line in lines:
        match = _SWITCH.search(line)
        if match is None or int(match[1]) not in victims or not match[2].startswith("R"):
            continue
        taker = int(match[4])
        takers[names.get(taker) or (SERVER if taker in victims else match[3])] += 1
    return takers


class SwitchTrace:
    """Records every CPU's switch events while the ``with`` block runs; ``lines()`` reads them after."""

    def __init__(self) -> None:
        perf = shutil.which("perf")
        if perf is None:
            raise TraceUnavailable("tracing preemptions needs perf (Debian: linux-perf)")
        self._perf = perf
        self._folder = tempfile.TemporaryDirectory(prefix="switches-")
        self._data = Path(self._folder.name) / "perf.data"
        self._process: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> SwitchTrace:
        argv = [self._perf, "record", "-q", "-a", "-e", "sched:sched_switch", "-o", str(self._data)]
        self._process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:  # perf fails at once when it may not trace; else it records until SIGINT
            _, err = self._process.communicate(timeout=0.5)
        except subprocess.TimeoutExpired:
            return self
        raise TraceUnavailable(f"perf cannot trace sched_switch here: {err.decode(errors='replace')[-300:]}")

    def __exit__(self, *exc: object) -> None:
        if self._process is not None and self._process.poll() is None:
            self._process.send_signal(signal.SIGINT)
            self._process.wait(30)

    def lines(self) -> Iterator[str]:
        """The recorded events as ``perf script`` prints them."""
        argv = [self._perf, "script", "-i", str(self._data)]
        with subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True) as script:
            assert script.stdout is not None
            yield from script.stdout

    def close(self) -> None:
        self._folder.cleanup()
