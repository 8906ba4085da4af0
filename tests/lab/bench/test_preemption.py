"""Who took a server's cores, read from scheduler switch events as ``perf script`` prints them."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import psutil
import pytest

from prefix_router.lab.bench import preemption
from prefix_router.lab.bench.preemption import (
    SERVER,
    SwitchTrace,
    TraceUnavailable,
    preemptors,
    server_threads,
)


def switch(prev: int, state: str, comm: str, nxt: int) -> str:
    """One ``sched:sched_switch`` line in ``perf script``'s layout (the tracepoint's own format)."""
    return (
        f"          python {prev} [001] 56828.502476: sched:sched_switch: prev_comm=python prev_pid={prev} "
        f"prev_prio=120 prev_state={state} ==> next_comm={comm} next_pid={nxt} next_prio=120"
    )


def test_a_switch_away_from_a_server_thread_that_could_run_is_put_down_to_the_taker() -> None:
    lines = [
        switch(10, "R", "python", 1),  # the load generator takes a server thread's core
        switch(11, "R+", "python", 1),
        switch(10, "R", "python", 2),  # the worker
        switch(10, "R", "python", 11),  # another thread of the server
        switch(11, "R", "tokio-runtime-w", 77),  # anyone else, by name (names may hold dashes, colons)
        switch(10, "S", "python", 1),  # the server thread waits for work: not a preemption
        switch(10, "D", "python", 1),
        switch(1, "R", "python", 10),  # the load generator preempted: not the server's loss
        "          swapper     0 [000] 56828.503202: sched:sched_wakeup: comm=python pid=10 prio=120",
        "",
    ]
    takers = preemptors(lines, {10, 11}, {1: "load generator", 2: "worker"})
    assert takers == {"load generator": 2, "worker": 1, SERVER: 1, "tokio-runtime-w": 1}


def test_the_server_threads_are_every_thread_of_its_process_tree() -> None:
    script = textwrap.dedent(
        """
        import subprocess, sys, threading, time
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        for _ in range(2):
            threading.Thread(target=time.sleep, args=(60,), daemon=True).start()
        print(child.pid, flush=True)
        time.sleep(60)
        """
    )
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout is not None
        child = int(parent.stdout.readline())
        tids = server_threads(parent.pid)
        assert {parent.pid, child} <= tids and len(tids) == 4  # the parent's three threads, the child's one
    finally:
        for process in psutil.Process(parent.pid).children():
            process.kill()
        parent.kill()
        parent.wait()


def test_without_perf_tracing_says_what_it_needs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(preemption.shutil, "which", lambda name: None)
    with pytest.raises(TraceUnavailable, match="perf"):
        SwitchTrace()
