"""Shared pieces of the policies: random tie-breaking and the bounded-load cap."""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from operator import attrgetter
from typing import TypeVar

from mypy_extensions import mypyc_attr

from prefix_router.routing.types import WorkerSnapshot

T = TypeVar("T")
_WEIGHT: Callable[[WorkerSnapshot], float] = attrgetter("weight")
_IN_FLIGHT: Callable[[WorkerSnapshot], int] = attrgetter("in_flight")


def pick_min(items: Sequence[T], key: Callable[[T], float], rng: random.Random) -> T:
    """The item with the smallest key; ties broken at random (never "the first one")."""
    best = min(key(item) for item in items)
    tied = [item for item in items if key(item) <= best]
    return tied[0] if len(tied) == 1 else rng.choice(tied)


def load_cap(workers: Sequence[WorkerSnapshot], load_factor: float, slack: int) -> float:
    """Bounded load (CHWBL): no worker may take more than ``load_factor`` x the mean load after this
    request, plus ``slack`` requests so that tiny loads do not force a strict round robin."""
    return cap_of(sum(map(_WEIGHT, workers)), sum(map(_IN_FLIGHT, workers)), load_factor, slack)


def cap_of(total_weight: float, in_flight: int, load_factor: float, slack: int) -> float:
    """``load_cap`` of workers whose weights sum to ``total_weight``, in-flight requests to ``in_flight``."""
    return math.ceil(load_factor * (in_flight + 1) / (total_weight or 1.0)) + slack


def load_totals(workers: Sequence[WorkerSnapshot]) -> tuple[float, int, float]:
    """The workers' total weight, in-flight requests and prefill backlog, in one pass: an inline copy of the
    sums of ``load_cap`` and of the ``prefix`` policy's saturation (``sum(map(...))`` each), for a policy that
    needs all three (one loop reads the three fields; three ``sum(map(attrgetter))`` cost twice as much).
    The same additions in the same order, so the same floats (``tests/routing/test_policy_base.py``)."""
    weight, flight, backlog = 0.0, 0, 0.0
    for w in workers:
        weight += w.weight
        flight += w.in_flight
        backlog += w.prefill_backlog
    return weight, flight, backlog


def under_cap(worker: WorkerSnapshot, cap: float) -> bool:
    return worker.in_flight + 1 <= cap * worker.weight


@mypyc_attr(
    allow_interpreted_subclasses=True
)  # compiled (setup.py), the Python-only policies still subclass it
class NoHooks:
    """No-op hooks for policies without state of their own."""

    def on_worker_removed(self, worker: str) -> None:
        return None
