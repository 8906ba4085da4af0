"""``prefix-router bench-overhead`` end to end at a tiny size: direct, one and two router processes."""

from __future__ import annotations

import argparse
import contextlib
import time
from pathlib import Path

import psutil
import pytest

from prefix_router.lab.bench import overhead


def args(**changes: object) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    overhead.register(parser.add_subparsers())
    ns = parser.parse_args(["bench-overhead"])
    for key, value in changes.items():
        setattr(ns, key, value)
    return ns


@pytest.mark.timeout(180)
def test_a_small_run_measures_every_target(capsys: pytest.CaptureFixture[str]) -> None:
    code = overhead.run_bench(
        args(requests=60, rounds=1, processes="1,2", concurrency="4", prompt_chars="500")
    )
    out = capsys.readouterr().out
    assert code == 0
    assert "prefix-router (1 proc, uvloop)" in out and "prefix-router (2 proc, uvloop)" in out
    assert "direct" in out and "500-char chat prompts, concurrency 4" in out


@pytest.mark.timeout(180)
def test_the_routers_http_servers_side_by_side(capsys: pytest.CaptureFixture[str]) -> None:
    code = overhead.run_bench(
        args(requests=40, rounds=1, http_servers="lean,aiohttp", concurrency="4", prompt_chars="500")
    )
    out = capsys.readouterr().out
    assert code == 0  # no errors: every request answered, by either server
    assert "prefix-router (1 proc, uvloop, lean)" in out and "prefix-router (1 proc, uvloop, aiohttp)" in out


def test_a_missing_peer_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = overhead.run_bench(args(peer="sglang-router", peer_python=str(tmp_path / "python")))
    assert code == 2 and "benchmarks/peers.sh" in capsys.readouterr().out


def test_cpu_seconds_counts_a_process_tree() -> None:
    import os

    assert overhead.cpu_seconds(os.getpid()) > 0
    user, system = overhead.cpu_split(os.getpid())
    assert user > 0 and system >= 0 and overhead.cpu_seconds(os.getpid()) >= user + system
    assert overhead.cpu_seconds(2**22 + 12345) != overhead.cpu_seconds(2**22 + 12345)  # NaN: no such process


SPIN = """
import os, time
os.sched_setaffinity(0, {0})
end = time.monotonic() + 0.4
while time.monotonic() < end:
    pass
"""
TWO_SPINNERS = f"""
import subprocess, sys
spinners = [subprocess.Popen([sys.executable, "-c", {SPIN!r}]) for _ in range(2)]
for spinner in spinners:
    spinner.wait()
"""


def test_preemptions_count_a_process_tree() -> None:
    """Two busy processes under one parent, both on one core: the scheduler takes it from them in turn."""
    import subprocess
    import sys
    import time

    parent = subprocess.Popen([sys.executable, "-c", TWO_SPINNERS])
    try:
        time.sleep(0.3)  # both children spinning
        counted = overhead.preemptions(parent.pid)
    finally:
        parent.wait()
    assert counted > 0
    assert overhead.preemptions(2**22 + 12345) == 0  # no such process


@pytest.mark.compiled
@pytest.mark.timeout(1300)  # a cold compiled build first (cached per source: seconds when warm)
def test_pure_and_compiled_builds_side_by_side(capsys: pytest.CaptureFixture[str]) -> None:
    from support.compiled import compiled_lib

    lib = str(compiled_lib())
    code = overhead.run_bench(
        args(
            requests=60,
            rounds=1,
            concurrency="4",
            prompt_chars="500",
            builds="pure,compiled,before",
            compiled_lib=lib,
            before_lib=lib,
        )
    )
    out = capsys.readouterr().out
    assert code == 0
    assert "prefix-router (1 proc, uvloop, pure)" in out and "prefix-router (1 proc, uvloop, compiled)" in out
    assert "prefix-router (1 proc, uvloop, before)" in out


def test_a_compiled_build_that_is_not_one_is_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert overhead.run_bench(args(builds="pure,compiled", compiled_lib="")) == 2
    assert "--compiled-lib" in capsys.readouterr().out
    assert overhead.run_bench(args(builds="compiled", compiled_lib=str(tmp_path))) == 2  # the pure one there
    assert "holds no compiled routing core" in capsys.readouterr().out
    assert overhead.run_bench(args(builds="pure,before", before_lib="")) == 2
    assert "--before-lib" in capsys.readouterr().out
    assert overhead.run_bench(args(builds="before", before_lib=str(tmp_path))) == 2
    assert "holds no compiled routing core" in capsys.readouterr().out


def test_spawned_servers_are_stopped_with_their_workers(tmp_path: Path) -> None:
    """A server that leaves a worker behind when told to stop (as granian's could) takes it along."""
    record = tmp_path / "worker"
    script = f'sleep 60 & echo $! > {record}; trap "exit 0" TERM; wait'
    with overhead.processes() as spawn:
        spawn(["sh", "-c", script], None)
        deadline = time.monotonic() + 30
        while not (record.exists() and record.read_text().strip()) and time.monotonic() < deadline:
            time.sleep(0.01)
    with contextlib.suppress(psutil.NoSuchProcess):  # gone, or dying: a signal takes a moment
        psutil.Process(int(record.read_text())).wait(timeout=10)  # alive after that: TimeoutExpired


KILLED_PARENT = """
import sys, time
from prefix_router.lab.bench import overhead
with overhead.processes() as spawn:
    print(spawn([sys.executable, "-c", "import time; time.sleep(300)"], None), flush=True)
    time.sleep(300)
"""


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


@pytest.mark.timeout(60)
def test_helpers_end_with_a_parent_killed_before_its_cleanup() -> None:
    """SIGKILL skips ``processes()``'s cleanup; its helpers, in sessions of their own, end anyway."""
    import subprocess
    import sys

    parent = subprocess.Popen([sys.executable, "-c", KILLED_PARENT], stdout=subprocess.PIPE, text=True)
    assert parent.stdout is not None
    helper = int(parent.stdout.readline())
    try:
        assert not gone(helper)
        parent.kill()
        parent.wait()
        deadline = time.monotonic() + 20
        while not gone(helper) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert gone(helper)
    finally:
        with contextlib.suppress(psutil.NoSuchProcess):
            psutil.Process(helper).kill()
