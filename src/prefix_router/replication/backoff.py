"""Exponential backoff with full jitter, for reconnecting to Redis."""

from __future__ import annotations

import random


class Backoff:
    """``next()`` gives the delay before the next try: a random fraction (at least half) of
    ``initial x 2^failures``, capped at ``maximum``; ``reset()`` after a success."""

    def __init__(self, initial_s: float, maximum_s: float, rng: random.Random | None = None) -> None:
        if initial_s <= 0 or maximum_s < initial_s:
            raise ValueError("backoff needs 0 < initial <= maximum")
        self.initial_s = initial_s
        self.maximum_s = maximum_s
        self.failures = 0
        self._rng = rng if rng is not None else random.Random()

    def next(self) -> float:
        ceiling = min(self.maximum_s, self.initial_s * float(2 ** min(self.failures, 32)))
        self.failures += 1
        return ceiling * (0.5 + 0.5 * self._rng.random())

    def reset(self) -> None:
        self.failures = 0
