"""Shared pieces of the policies: random tie-breaking and the bounded-load cap."""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from operator import attrgetter
from typing import TypeVar

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
    total_weight = sum(map(_WEIGHT, workers)) or 1.0
    total = sum(map(_IN_FLIGHT, workers)) + 1
    return math.ceil(load_factor * total / total_weight) + slack


def under_cap(worker: WorkerSnapshot, cap: float) -> bool:
    return worker.in_flight + 1 <= cap * worker.weight


class NoHooks:
    """No-op hooks for policies without state of their own."""

    def on_worker_removed(self, worker: str) -> None:
        return None
