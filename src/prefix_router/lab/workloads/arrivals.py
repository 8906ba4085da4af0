"""Arrival processes, composable with any request shape.

- ``poisson``: open loop, exponential inter-arrival times at ``rate`` sessions per second.
- ``trace``: open loop at the shape's own timestamps (trace replay), multiplied by ``time_scale``
  (0.5 replays twice as fast).
- ``closed``: closed loop, ``concurrency`` sessions in flight, each starting when a slot frees.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Literal

from prefix_router.lab.workloads.types import Session

ArrivalKind = Literal["poisson", "trace", "closed"]


@dataclass(frozen=True, slots=True)
class Arrivals:
    kind: ArrivalKind = "poisson"
    rate: float = 10.0
    time_scale: float = 1.0
    concurrency: int = 16

    def __post_init__(self) -> None:
        if self.kind not in ("poisson", "trace", "closed"):
            raise ValueError(f"unknown arrival kind {self.kind!r}")
        if self.rate <= 0 or self.time_scale <= 0 or self.concurrency < 1:
            raise ValueError("rate and time_scale must be > 0, concurrency >= 1")

    @property
    def closed_concurrency(self) -> int | None:
        return self.concurrency if self.kind == "closed" else None


def poisson_times(n: int, rate: float, rng: random.Random) -> list[float]:
    """``n`` arrival offsets of a Poisson process at ``rate`` per second, the first at 0."""
    times: list[float] = []
    now = 0.0
    for _ in range(n):
        times.append(now)
        now += rng.expovariate(rate)
    return times


def apply_arrivals(
    sessions: Sequence[Session], arrivals: Arrivals, rng: random.Random
) -> tuple[Session, ...]:
    """Sessions with arrival times set by ``arrivals`` (keeps their order), sorted by arrival."""
    if arrivals.kind == "trace":
        timed = [replace(s, arrival_s=s.arrival_s * arrivals.time_scale) for s in sessions]
    elif arrivals.kind == "closed":
        timed = [replace(s, arrival_s=0.0) for s in sessions]
    else:
        times = poisson_times(len(sessions), arrivals.rate, rng)
        timed = [replace(s, arrival_s=t) for s, t in zip(sessions, times, strict=True)]
    return tuple(sorted(timed, key=lambda s: s.arrival_s))


def spread_buckets(times: Sequence[float], bucket_s: float, rng: random.Random) -> list[float]:
    """Spread timestamps that were bucketed (e.g. at 3 s) uniformly over their bucket."""
    return [t + rng.uniform(0.0, bucket_s) for t in times]
