"""Per-policy measurements of a simulated run, and their summary in the ``simulate`` JSON schema."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass(slots=True)
class SimStats:
    """Columns of finished requests plus per-instance dispatch counts."""

    instances: int
    ttft: list[float] = field(default_factory=list)
    e2e: list[float] = field(default_factory=list)
    prompt: list[int] = field(default_factory=list)
    cached: list[int] = field(default_factory=list)
    predicted: list[int] = field(default_factory=list)
    output_tokens: int = 0
    errors: int = 0
    first_arrival: float | None = None
    last_finish: float = 0.0
    per_instance: list[int] = field(default_factory=list)
    queued: list[float] = field(default_factory=list)  # engine queue wait per finished request, s
    busy_s: list[float] = field(default_factory=list)  # per instance, set at the end of the run
    prefill_s: list[float] = field(default_factory=list)
    replication: list[float] = field(default_factory=list)  # samples of copies / distinct cached blocks
    branches: dict[str, int] = field(default_factory=dict)  # routing decisions per branch
    tpot: list[float] = field(default_factory=list)  # time per output token after the first, s
    # |predicted - observed| / observed of each first token whose decision predicted its time, in order
    prediction_errors: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.per_instance = [0] * self.instances

    def arrived(self, now: float) -> None:
        if self.first_arrival is None:
            self.first_arrival = now

    def dispatched(self, instance: int, branch: str = "") -> None:
        self.per_instance[instance] += 1
        self.branches[branch] = self.branches.get(branch, 0) + 1

    def finished(
        self,
        arrival: float,
        first: float,
        end: float,
        prompt: int,
        cached: int,
        predicted: int,
        out: int,
        queued: float = 0.0,
    ) -> None:
        self.ttft.append(first - arrival)
        self.queued.append(queued)
        self.e2e.append(end - arrival)
        self.prompt.append(prompt)
        self.cached.append(cached)
        self.predicted.append(predicted)
        self.output_tokens += out
        if out > 1:
            self.tpot.append((end - first) / (out - 1))
        self.last_finish = max(self.last_finish, end)

    def first_token(self, predicted_s: float | None, observed_s: float) -> None:
        """A first token ``observed_s`` after dispatch, where the decision predicted ``predicted_s``."""
        if predicted_s is not None and observed_s > 0.0:
            self.prediction_errors.append(abs(predicted_s - observed_s) / observed_s)

    @property
    def completed(self) -> int:
        return len(self.ttft)


def latency_ms(values: Sequence[float]) -> dict[str, float]:
    if not values:
        return {"p50": 0.0, "p90": 0.0, "p99": 0.0, "mean": 0.0}
    array = np.asarray(values) * 1000.0
    p50, p90, p99 = np.percentile(array, [50, 90, 99])
    return {"p50": float(p50), "p90": float(p90), "p99": float(p99), "mean": float(array.mean())}


def imbalance(per_instance: Sequence[int]) -> float:
    """max / mean requests per instance (1.0 is perfect balance)."""
    total = sum(per_instance)
    if not total:
        return 0.0
    return max(per_instance) / (total / len(per_instance))


PREDICTION_WARMUP = 8  # first tokens left out of the prediction error (the model learns online)


def prediction_mdape(errors: Sequence[float]) -> float | None:
    """The median relative error of the predicted first-token times after ``PREDICTION_WARMUP`` (None
    where the policy predicts none)."""
    kept = errors[PREDICTION_WARMUP:]
    return float(np.median(kept)) if len(kept) else None


def summarize(stats: SimStats) -> dict[str, Any]:
    """The per-policy entry of the JSON report (the schema of ``bench.summary``)."""
    prompt = sum(stats.prompt)
    cached = sum(stats.cached)
    span = stats.last_finish - (stats.first_arrival or 0.0)
    return {
        "requests": stats.completed,
        "errors": stats.errors,
        "hit_rate": cached / prompt if prompt else 0.0,
        "predicted_hit_rate": sum(stats.predicted) / prompt if prompt else 0.0,
        "ttft_ms": latency_ms(stats.ttft),
        "e2e_ms": latency_ms(stats.e2e),
        "throughput_rps": stats.completed / span if span > 0 else 0.0,
        "prefill_tokens": prompt - cached,
        "load_imbalance": imbalance(stats.per_instance),
    }


def utilisation(stats: SimStats, span: float) -> dict[str, float]:
    """How busy the engines were: the fraction of the run each had a step in progress (mean and max
    over instances) and the share of that busy time spent in steps that computed prompt tokens."""
    if span <= 0 or not stats.busy_s:
        return {"busy_fraction": 0.0, "busy_fraction_max": 0.0, "prefill_share": 0.0}
    busy = [b / span for b in stats.busy_s]
    total = sum(stats.busy_s)
    return {
        "busy_fraction": sum(busy) / len(busy),
        "busy_fraction_max": max(busy),
        "prefill_share": sum(stats.prefill_s) / total if total > 0 else 0.0,
    }


def replication(stats: SimStats) -> dict[str, float]:
    """Cached block copies per distinct cached block across the engines (1.0: no block is cached
    twice), averaged over the samples taken during the run, and the last sample."""
    samples = stats.replication
    if not samples:
        return {"mean": 0.0, "final": 0.0}
    return {"mean": sum(samples) / len(samples), "final": samples[-1]}


def details(stats: SimStats, wall_s: float) -> dict[str, Any]:
    """Extra facts per policy (kept out of the fixed schema)."""
    span = stats.last_finish - (stats.first_arrival or 0.0)
    return {
        "requests_per_instance": list(stats.per_instance),
        "prompt_tokens": sum(stats.prompt),
        "cached_tokens": sum(stats.cached),
        "output_tokens_per_s": stats.output_tokens / span if span > 0 else 0.0,
        "simulated_span_s": span,
        "wall_s": wall_s,
        "utilisation": utilisation(stats, span),
        "queue_wait_ms": latency_ms(stats.queued),
        "tpot_ms": latency_ms(stats.tpot),
        "replication": replication(stats),
        "branches": dict(sorted(stats.branches.items())),
        "predicted_ttft_mdape": prediction_mdape(stats.prediction_errors),
    }
