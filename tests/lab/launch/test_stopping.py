"""SIGTERM stops an ``engines`` fleet at any moment of its life, the moment its URLs are printed included."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading

import pytest

from prefix_router.lab.launch.stopping import interrupted_by_sigterm, wait_for_stop

# A fleet that starts nothing and sends its own process SIGTERM while its URLs are being printed: after
# the launcher's ready lines begin and before it waits, where a stop asked for by a script usually lands.
LAUNCH_WITH_A_STOP_WHILE_PRINTING = textwrap.dedent(
    """
    import os, signal, sys
    from prefix_router.cli import build_parser
    from prefix_router.lab.launch import cli, vllm_cli

    class Fleet:
        kv_storage = None  # a colocated vLLM fleet's: no connector folder
        def __init__(self, settings):
            self.settings = settings
            self.instances = []
        def __enter__(self):
            print("started", flush=True)
            return self
        def __exit__(self, *exc):
            print("fleet stopped", flush=True)
        @property
        def urls(self):
            os.kill(os.getpid(), signal.SIGTERM)
            return ["http://127.0.0.1:1"]

    cli.LlamaCppFleet = vllm_cli.VllmFleet = Fleet
    args = build_parser().parse_args(["engines", sys.argv[1], "--instances", "1"])
    sys.exit(args.func(args))
    """
)


@pytest.mark.parametrize("engine", ["llama-cpp", "vllm"])
def test_a_sigterm_as_the_urls_are_printed_stops_the_fleet_and_exits_0(engine: str) -> None:
    done = subprocess.run(
        [sys.executable, "-c", LAUNCH_WITH_A_STOP_WHILE_PRINTING, engine],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.splitlines()[-2:] == ["fleet stopped", "stopped"]


def test_sigterm_raises_keyboard_interrupt_inside_the_block_only() -> None:
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(KeyboardInterrupt), interrupted_by_sigterm():
        os.kill(os.getpid(), signal.SIGTERM)
        for _ in range(1000):  # the handler runs between bytecodes, right after the kill
            pass
    assert signal.getsignal(signal.SIGTERM) is before


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_the_wait_ends_on_either_signal_and_gives_the_handlers_back(sig: signal.Signals) -> None:
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    timer = threading.Timer(0.2, os.kill, (os.getpid(), sig))
    timer.start()
    try:
        wait_for_stop()
    finally:
        timer.cancel()
    assert {s: signal.getsignal(s) for s in before} == before
