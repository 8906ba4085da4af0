"""What exact mode costs: microseconds per routing key, default and exact, measured side by side.

For a chat body of about ``chars`` characters (a system prompt, then a short conversation), the default key
(character blocks), the default key in token blocks (mode ``tokenizer``) and the exact key (render the
chat template, then tokenize) are each built ``repeat`` times, interleaved in rounds so that the shared
machine's noise falls on all three alike. Reported: the median of the rounds' means, and the ratios to the
default key.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from prefix_router.lab.bench.fidelity.corpus import _assistant, _system, _user
from prefix_router.lab.workloads.text import rng_for
from prefix_router.routing import KeyBuilder, KeySettings


@dataclass(frozen=True, slots=True)
class Cost:
    chars: int
    default_us: float
    tokens_us: float
    exact_us: float


def body_of(chars: int) -> dict[str, Any]:
    rng = rng_for("fidelity-cost", chars)
    turns = [_user(rng, 300), _assistant(rng, 400), _user(rng, 300)]
    system = _system(rng, max(100, chars - sum(len(m["content"]) for m in turns)))
    return {"model": "m", "messages": [system, *turns]}


def _mean_us(build: Callable[[], object], repeat: int) -> float:
    start = time.perf_counter()
    for _ in range(repeat):
        build()
    return (time.perf_counter() - start) / repeat * 1e6


def measure_cost(model_dir: Path, chars: int, repeat: int = 20, rounds: int = 5) -> Cost:
    body = body_of(chars)
    builders = {
        "default": KeyBuilder(KeySettings()),
        "tokens": KeyBuilder(KeySettings(mode="tokenizer", tokenizer=str(model_dir / "tokenizer.json"))),
        "exact": KeyBuilder(KeySettings(mode="template", templates={"m": str(model_dir)})),
    }
    samples: dict[str, list[float]] = {name: [] for name in builders}
    for _ in range(rounds):
        for name, builder in builders.items():
            samples[name].append(_mean_us(partial(builder.build, "chat", body, route_id="c"), repeat))
    med = {name: statistics.median(values) for name, values in samples.items()}
    return Cost(chars, med["default"], med["tokens"], med["exact"])
