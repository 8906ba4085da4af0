"""The routing core's own cost per request, in-process, for ``benchmarks/floor.py``.

The same ``Router`` as ``serve`` builds (the proxy's default config, ``prefix`` policy) with 1 or N
workers, fed the benchmark's own requests (``bench.overhead.bodies``: one shared system prompt of the
given size, a question of each request's own). Every cycle does what the proxy asks of the core for one
request: the body's JSON parse (reported apart: a floor never parses), the routing key
(``keys.build``), ``route`` over all workers, ``dispatched``; and for the request dispatched
``in_flight`` cycles earlier (so that many stay in flight, as at that concurrency) ``first_token``, the
reply's extension (``keys.extend``: the instant worker's "ok") and ``finished`` with the usage it reports
(100 prompt tokens, no cached tokens). Each stage is timed with ``perf_counter_ns``. On a shared machine
wall time also counts the time other processes held the core, so the stages' means are scaled by the
thread's CPU time over its wall time across all cycles (``time.thread_time_ns``; the factor is printed:
1.0 when nothing preempted it). The process is hot with nothing but the core: a lower bound of what the
same calls cost inside a server, whose HTTP work between them evicts the caches.
"""

from __future__ import annotations

import itertools
import random
import statistics
import time
from collections import deque
from dataclasses import dataclass
from typing import Any

import orjson

from prefix_router.lab.bench.overhead import bodies
from prefix_router.node import Config
from prefix_router.routing import Decision, Outcome, Router, RouteRequest

STAGES = ("key", "route", "dispatched", "first_token", "extension", "finished")
GENERATED = {"role": "assistant", "content": "ok"}  # what the instant worker answers
WARM_UP = 300  # cycles after the first `in_flight`, unmeasured


@dataclass
class CoreCost:
    prompt_chars: int
    workers: int
    mean_us: dict[str, float]  # CPU per stage, and "parse"
    total_us: float  # CPU of the core's stages together (parse excluded)
    p50_us: float  # median cycle, wall time (parse excluded)
    cpu_share: float  # the thread's CPU time / wall time over the cycles (< 1: preempted meanwhile)


def router_for(workers: int) -> Router:
    routing = Config().routing.model_copy(update={"policy": "prefix"})
    router = Router(routing, rng=random.Random(0))
    for i in range(workers):
        router.add_worker(f"w{i}")
    return router


class Setting:
    """One router and its requests in flight; ``run`` times the next cycles."""

    def __init__(self, prompt_chars: int, workers: int, cycles: int, in_flight: int) -> None:
        self.prompt_chars, self.workers, self.in_flight = prompt_chars, workers, in_flight
        self.router = router_for(workers)
        self.names = self.router.workers()
        sent = bodies(in_flight + WARM_UP + cycles, prompt_chars, False)
        self.raws = iter([raw.split(b"\r\n\r\n", 1)[1] for raw in sent])
        self.flying: deque[tuple[RouteRequest, dict[str, Any], Decision]] = deque()
        self.spent = dict.fromkeys(("parse", *STAGES), 0)
        self.totals: list[int] = []
        self.count = self.cpu_ns = self.wall_ns = 0
        self.run(in_flight + WARM_UP)
        self.spent = dict.fromkeys(self.spent, 0)
        self.totals.clear()
        self.cpu_ns = self.wall_ns = 0

    def run(self, cycles: int) -> None:
        router, names, clock, spent = self.router, self.names, time.perf_counter_ns, self.spent
        cpu0, wall0 = time.thread_time_ns(), clock()
        for raw in itertools.islice(self.raws, cycles):
            self.count += 1
            now = time.monotonic()
            t0 = clock()
            body = orjson.loads(raw)
            t1 = clock()
            req = router.keys.build("chat", body, route_id=f"r{self.count}")
            t2 = clock()
            decision = router.route(req, names, now)
            t3 = clock()
            router.dispatched(req, decision, now)
            t4 = clock()
            self.flying.append((req, body, decision))
            t5 = t6 = t7 = t4
            if len(self.flying) > self.in_flight:
                old, old_body, old_decision = self.flying.popleft()
                router.first_token(old.route_id, now)
                t5 = clock()
                extension = router.keys.extend(old, "chat", old_body, GENERATED)
                t6 = clock()
                router.finished(old, old_decision.worker, Outcome(True, None, extension, 100), now)
                t7 = clock()
            took = (t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4, t6 - t5, t7 - t6)
            for stage, ns in zip(spent, took, strict=True):
                spent[stage] += ns
            self.totals.append(t7 - t1)
        self.cpu_ns += time.thread_time_ns() - cpu0
        self.wall_ns += clock() - wall0

    def cost(self) -> CoreCost:
        cycles = len(self.totals)
        share = min(1.0, self.cpu_ns / self.wall_ns)
        mean = {stage: ns * share / cycles / 1e3 for stage, ns in self.spent.items()}
        total = sum(mean[s] for s in STAGES)
        p50 = statistics.median(self.totals) / 1e3
        return CoreCost(self.prompt_chars, self.workers, mean, total, p50, share)


def settings_for(sizes: list[int], workers: list[int], cycles: int, in_flight: int) -> list[Setting]:
    return [Setting(chars, n, cycles, in_flight) for chars in sizes for n in workers]


def run_slice(settings: list[Setting], cycles: int) -> None:
    """``cycles`` more cycles of every setting, in turn (drift on a shared machine touches all alike)."""
    for setting in settings:
        setting.run(cycles)
