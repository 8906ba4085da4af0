"""``serve --processes N``: N router processes on one port (``SO_REUSEPORT``), one shared view.

The supervisor (the process started by ``serve``) makes a private directory, forks N serving processes
and then only watches them: SIGTERM/SIGINT are passed on (each child drains as a single router does),
so is SIGHUP (each child reloads the configuration, as a single router does), a child that dies
unexpectedly is restarted (each child at most ``RESTART_BUDGET`` times in any ``RESTART_WINDOW_S``: past
that, its next restart waits until the window allows it, so a crash loop costs little and the capacity
comes back; meanwhile every process's ``/health`` and ``/ready`` say ``degraded`` with the processes
running and configured), and it exits with the children's worst exit status. Each child binds the same
port with ``SO_REUSEPORT`` (the kernel spreads new connections across them) and joins the local channel
(``replication.local``): index changes and in-flight counts reach the other processes within about
10 ms (50 ms; a request's own placement is sent at dispatch, before it is forwarded, and each process
reads what the others sent before it routes), and every ``/metrics`` scrape, whichever process answers
it, adds the others' latest counters (sent every ``METRICS_INTERVAL_S``). The worker pool is shared too
(``node.control.shared_pool``): admin changes reach every process, and process 0 alone probes and
scrapes the engines, for all of them. Workers whose KV events the router binds (``kv_events.bind``) get
one more process, started first: the fan-out (``event_fanout``), which binds those endpoints once and
forwards every message to every serving process; it is restarted as they are.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ctypes.util
import logging
import math
import multiprocessing
import os
import shutil
import signal
import tempfile
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from pathlib import Path
from types import FrameType

from aiohttp import web

from prefix_router.node import STATE, Config, NodeState, SharedPool
from prefix_router.proxy.run.event_fanout import FanoutPlan, Wanted, run_fanout, wanted
from prefix_router.replication import LocalReplication, ReplicationCollector

log = logging.getLogger("prefix_router.processes")
RESTART_BUDGET = 5  # restarts of one child per RESTART_WINDOW_S; past it, the next waits for the window
RESTART_WINDOW_S = 60.0
PR_SET_PDEATHSIG = 1  # Linux prctl option
METRICS_INTERVAL_S = 1.0
FANOUT = -1  # the fan-out process's index among the children
FANOUT_START_S = 10.0  # the longest the supervisor waits for the fan-out's plan


def process_count(configured: int) -> int:
    """``processes`` from config: 0 means one per core this process may use."""
    return configured if configured > 0 else usable_cores()


def usable_cores(cpu_max: Path = Path("/sys/fs/cgroup/cpu.max")) -> int:
    """Cores this process may run on (CPU affinity), capped by a cgroup v2 CPU quota (a container's CPU
    limit): ``os.cpu_count()`` would count every core of a Kubernetes node."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    with contextlib.suppress(OSError, ValueError):
        quota, period = cpu_max.read_text().split()[:2]
        if quota != "max":
            cores = min(cores, math.ceil(int(quota) / int(period)))
    return max(1, cores)


def install_local_replication(app: web.Application, directory: Path, index: int, count: int) -> None:
    """Join the local channel of ``count`` processes for the app's lifetime; /metrics adds the others'."""
    state: NodeState = app[STATE]
    local = LocalReplication(state.router, directory, index, count, clock=state.clock)
    state.metrics.peers = local.snapshots
    state.before_route, state.after_dispatch = local.read_once, local.flush
    state.processes = lambda: (1 + local.live_peers(), count)
    shared = SharedPool(state, local, index)
    shared.install()

    async def lifetime(_: web.Application) -> AsyncIterator[None]:
        await local.start()
        task = asyncio.create_task(_publish(state, local, shared), name="local-replication-publish")
        yield
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await local.stop()

    app.cleanup_ctx.append(lifetime)
    state.metrics.registry.register(ReplicationCollector(local))


async def _publish(state: NodeState, local: LocalReplication, shared: SharedPool) -> None:
    """Every ``METRICS_INTERVAL_S``: this process's metrics and the admin changes it knows."""
    while True:
        await asyncio.sleep(METRICS_INTERVAL_S)
        local.publish_snapshot(state.metrics.snapshot())
        shared.publish()


def supervise(config: Config, count: int, serve_one: Callable[[int, Path, FanoutPlan], None]) -> int:
    """Run ``serve_one(index, directory, plan)`` in ``count`` forked processes until they all stop (after
    the fan-out process, when some worker's KV events are bound by the router: ``plan``)."""
    directory = Path(tempfile.mkdtemp(prefix="prefix-router-"))
    context = multiprocessing.get_context("fork")
    children: dict[int, BaseProcess] = {}
    stopping = False
    endpoints = wanted(config, directory)
    plan = FanoutPlan()

    def start(index: int) -> None:
        if index == FANOUT:
            start_fanout()
            return
        child = context.Process(
            target=_child,
            args=(serve_one, index, directory, plan, os.getpid()),
            name=f"prefix-router-{index}",
        )
        child.start()
        children[index] = child

    def start_fanout() -> FanoutPlan:
        receive, send = context.Pipe(duplex=False)
        child = context.Process(
            target=_fanout_child, args=(endpoints, send, os.getpid()), name="prefix-router-kv-events"
        )
        child.start()
        send.close()
        children[FANOUT] = child
        got = receive.recv() if receive.poll(FANOUT_START_S) else FanoutPlan()
        receive.close()
        return got if isinstance(got, FanoutPlan) else FanoutPlan()

    def tell(signum: int) -> None:
        for child in children.values():
            if child.pid is not None and child.is_alive():
                os.kill(child.pid, signum)

    def stop(signum: int, _: FrameType | None) -> None:
        nonlocal stopping
        stopping = True
        tell(signal.SIGTERM)

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGINT)}
    previous[signal.SIGHUP] = signal.signal(signal.SIGHUP, lambda signum, _: tell(signal.SIGHUP))
    try:
        if endpoints:
            plan = start_fanout()
        for index in range(count):
            start(index)
        log.info("serving with %d processes on %s:%d", count, config.host, config.port)
        return _watch(children, start, lambda: stopping)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        shutil.rmtree(directory, ignore_errors=True)


def _child(
    serve_one: Callable[[int, Path, FanoutPlan], None],
    index: int,
    directory: Path,
    plan: FanoutPlan,
    supervisor: int,
) -> None:
    """A serving process: gets SIGTERM should the supervisor die (no orphan keeps the port), and does not
    start at all when the supervisor died between the fork and the request for that signal."""
    _tied_to(supervisor)
    serve_one(index, directory, plan)


def _fanout_child(endpoints: Wanted, report: Connection, supervisor: int) -> None:
    _tied_to(supervisor)
    run_fanout(endpoints, report)


def parent_death_signal(sig: int = signal.SIGTERM) -> Callable[[], None]:
    """What a freshly forked child calls first (``subprocess.Popen(preexec_fn=...)``, or a forked process's
    first step) to get ``sig`` from Linux when its parent ends, however it ends (SIGKILL included); a no-op
    where ``prctl`` is missing. The kernel sends it when the *thread* that forked the child ends: spawn
    from a thread that outlives the child (the main thread). libc is loaded here, in the parent, so that
    the child only makes the call."""
    libc = None
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)

    def arm() -> None:
        if libc is not None:
            with contextlib.suppress(AttributeError):
                libc.prctl(PR_SET_PDEATHSIG, sig)

    return arm


def _tied_to(supervisor: int) -> None:
    parent_death_signal()()
    if os.getppid() != supervisor:
        os._exit(0)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)  # not the supervisor's: ``serve_one`` installs its own


class RestartBudget:
    """Each child's restarts in the last ``window_s``, at most ``budget`` of them (one deque per child
    index: bounded by the children and the budget)."""

    def __init__(self, budget: int = RESTART_BUDGET, window_s: float = RESTART_WINDOW_S) -> None:
        self.budget, self.window_s = budget, window_s
        self._times: dict[int, deque[float]] = {}

    def next_at(self, index: int, now: float) -> float:
        """When child ``index`` may be restarted: ``now`` while under its budget, else when its oldest
        restart in the window leaves it."""
        times = self._times.get(index)
        if times is None or len(times) < self.budget:
            return now
        return max(now, times[0] + self.window_s)

    def spend(self, index: int, now: float) -> None:
        times = self._times.setdefault(index, deque(maxlen=self.budget))
        while times and now - times[0] >= self.window_s:
            times.popleft()
        times.append(now)


def _watch(
    children: dict[int, BaseProcess],
    start: Callable[[int], None],
    stopping: Callable[[], bool],
    budget: RestartBudget | None = None,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> int:
    """Wait for the children; restart one that exits unless stopping, within its ``budget`` (later when
    spent). Returns the worst exit status of the children stopped."""
    budget = budget or RestartBudget()
    waiting: dict[int, float] = {}  # child index -> when it is restarted
    worst = 0
    while children or (waiting and not stopping()):
        sleep(0.2)
        now = clock()
        for index, child in list(children.items()):
            if child.is_alive():
                continue
            child.join()
            code = child.exitcode or 0
            del children[index]
            if stopping():  # ended by the SIGTERM passed on (one still starting had no handler yet): a stop
                worst = max(worst, 0 if code == -signal.SIGTERM else abs(code))
                continue
            waiting[index] = at = budget.next_at(index, now)
            if at > now:
                log.error(
                    "serving process %d exited (%s), its %d restarts in %.0f s spent: restarting in %.0f s",
                    index, code, budget.budget, budget.window_s, at - now,
                )  # fmt: skip
            else:
                log.warning("serving process %d exited (%s); restarting it", index, code)
        for index, at in list(waiting.items()):
            if not stopping() and now >= at:
                del waiting[index]
                budget.spend(index, now)
                start(index)
    return worst
