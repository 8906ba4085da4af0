"""Per-policy summaries of a run, in the JSON schema shared with the simulator.

Schema: ``{"simulated", "policies": {NAME: {"requests", "errors", "hit_rate", "predicted_hit_rate",
"ttft_ms": {"p50", "p90", "p99", "mean"}, "e2e_ms": {...}, "throughput_rps", "prefill_tokens",
"load_imbalance"}}, "oracle": {"hit_rate"}}``. A live benchmark adds (extra keys, same schema):
``output_tokens_per_s``, ``prompt_tokens``, ``cached_tokens``, ``requests_per_worker``, ``wall_s``,
``error_samples`` per policy and ``workload``, ``workers``, ``baseline`` at the top level. The oracle is a
simulator notion: a live benchmark reports ``"oracle": {"hit_rate": null}``.

- ``hit_rate``: engine-reported cached prompt tokens / prompt tokens, over successful requests whose
  engine reported ``cached_tokens`` (None when none did).
- ``prefill_tokens``: prompt tokens the engines computed (prompt - cached).
- ``load_imbalance``: max / mean requests per worker (1.0 = perfectly even).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from prefix_router.lab.bench.client import RequestRecord
from prefix_router.lab.bench.runner import RunResult

SCHEMA_KEYS = (
    "requests",
    "errors",
    "hit_rate",
    "predicted_hit_rate",
    "ttft_ms",
    "e2e_ms",
    "throughput_rps",
    "prefill_tokens",
    "load_imbalance",
)
MAX_ERROR_SAMPLES = 5


def quantile(sorted_values: Sequence[float], q: float) -> float:
    """Linear-interpolated quantile of already sorted values (non-empty)."""
    pos = (len(sorted_values) - 1) * q
    low = math.floor(pos)
    high = min(low + 1, len(sorted_values) - 1)
    return sorted_values[low] + (sorted_values[high] - sorted_values[low]) * (pos - low)


def distribution_ms(values_s: Sequence[float]) -> dict[str, float | None]:
    """p50, p90, p99 and mean of ``values_s`` (seconds) in milliseconds; None for an empty list."""
    if not values_s:
        return {"p50": None, "p90": None, "p99": None, "mean": None}
    ordered = sorted(v * 1000.0 for v in values_s)
    out: dict[str, float | None] = {f"p{q}": round(quantile(ordered, q / 100), 3) for q in (50, 90, 99)}
    out["mean"] = round(sum(ordered) / len(ordered), 3)
    return out


def hit_rate(records: Sequence[RequestRecord]) -> tuple[float | None, int, int]:
    """(cached / prompt tokens, prompt tokens, cached tokens) over records reporting cached tokens."""
    reported = [r for r in records if r.ok and r.cached_tokens is not None and r.prompt_tokens]
    prompt = sum(r.prompt_tokens or 0 for r in reported)
    cached = sum(min(r.cached_tokens or 0, r.prompt_tokens or 0) for r in reported)
    return (cached / prompt if prompt else None), prompt, cached


def predicted_hit_rate(records: Sequence[RequestRecord]) -> float | None:
    """The router's predicted cached tokens / prompt tokens, over records carrying a prediction."""
    known = [r for r in records if r.ok and r.predicted_tokens is not None and r.prompt_tokens]
    prompt = sum(r.prompt_tokens or 0 for r in known)
    return round(sum(r.predicted_tokens or 0 for r in known) / prompt, 4) if prompt else None


def worker_counts(records: Sequence[RequestRecord], workers: Sequence[str]) -> dict[str, int]:
    """Requests per worker from the router's response header (every known worker listed, even at 0)."""
    counts = Counter(r.worker for r in records if r.worker)
    return {**dict.fromkeys(workers, 0), **counts}


def imbalance(counts: Mapping[str, int]) -> float | None:
    """max / mean requests per worker; None without per-worker counts."""
    values = list(counts.values())
    total = sum(values)
    if not values or total == 0:
        return None
    return round(max(values) / (total / len(values)), 4)


def summarize(
    result: RunResult,
    per_worker: Mapping[str, int] | None = None,
) -> dict[str, Any]:
    """The schema dict of one policy's run. ``per_worker`` overrides the header-derived counts."""
    records = result.records
    ok = [r for r in records if r.ok]
    rate, prompt, cached = hit_rate(records)
    counts = dict(per_worker) if per_worker is not None else worker_counts(records, ())
    wall = max(result.wall_s, 1e-9)
    return {
        "requests": len(records),
        "errors": len(records) - len(ok),
        "hit_rate": None if rate is None else round(rate, 4),
        "predicted_hit_rate": predicted_hit_rate(records),
        "ttft_ms": distribution_ms([r.ttft_s for r in ok if r.ttft_s is not None]),
        "e2e_ms": distribution_ms([r.e2e_s for r in ok]),
        "throughput_rps": round(len(ok) / wall, 3),
        "prefill_tokens": sum(max(0, (r.prompt_tokens or 0) - (r.cached_tokens or 0)) for r in ok),
        "load_imbalance": imbalance(counts),
        "output_tokens_per_s": round(sum(r.output_tokens for r in ok) / wall, 2),
        "prompt_tokens": prompt,
        "cached_tokens": cached,
        "requests_per_worker": counts,
        "wall_s": round(result.wall_s, 3),
        "error_samples": sorted({r.error for r in records if r.error})[:MAX_ERROR_SAMPLES],
    }


def report_document(
    policies: Mapping[str, Mapping[str, Any]],
    *,
    simulated: bool,
    workload: str,
    workers: Sequence[str],
    extra: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The whole JSON document: the shared schema plus the live benchmark's context."""
    baseline = "random" if "random" in policies else next(iter(policies), None)
    return {
        "simulated": simulated,
        "policies": {name: dict(summary) for name, summary in policies.items()},
        "oracle": {"hit_rate": None},
        "workload": workload,
        "workers": list(workers),
        "baseline": baseline,
        **(extra or {}),
    }
