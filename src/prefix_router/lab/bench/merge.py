"""Merging benchmark documents (one per router or policy) into one comparison, and a Markdown table.

Used by ``benchmarks/peers.sh``: each router is benchmarked by its own ``prefix-router bench --router URL
--label NAME --json FILE`` run on the same workers and workload; the files are merged here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from prefix_router.lab.bench.table import rows


def merge(documents: Sequence[Mapping[str, Any]], baseline: str | None = None) -> dict[str, Any]:
    """One document whose policies are every document's policies (labels must be distinct)."""
    if not documents:
        raise ValueError("nothing to merge")
    policies: dict[str, Any] = {}
    for doc in documents:
        for name, summary in doc["policies"].items():
            if name in policies:
                raise ValueError(f"label {name!r} appears twice")
            policies[name] = {**summary, "router": doc.get("router")}
    first = documents[0]
    chosen = baseline if baseline in policies else next(iter(policies))
    return {
        **{k: v for k, v in first.items() if k not in ("policies", "baseline", "router")},
        "simulated": all(bool(d.get("simulated")) for d in documents),
        "policies": policies,
        "baseline": chosen,
        "workers_match": all(list(d.get("workers", [])) == list(first.get("workers", [])) for d in documents),
        "workload_match": all(d.get("workload") == first.get("workload") for d in documents),
    }


HEADERS = (
    "policy", "requests", "errors", "hit rate", "TTFT p50 ms", "TTFT p90 ms", "TTFT p99 ms",
    "e2e p50 ms", "req/s", "out tok/s", "imbalance", "token imbalance", "TTFT p50 gain", "req/s ratio",
)  # fmt: skip


def markdown(document: Mapping[str, Any], first_column: str = "policy") -> str:
    """The comparison as a Markdown table (same columns as the terminal table)."""
    header = "| " + " | ".join((first_column, *HEADERS[1:])) + " |"
    lines = [header, "|" + "|".join(["---"] + ["---:"] * (len(HEADERS) - 1)) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows(document)]
    return "\n".join(lines) + "\n"
