"""The fair peer run's matrix: cells (workload x load level) x routers, and the verdict against the peers.

``benchmarks/peers.py`` benchmarks each router of each cell in its own ``prefix-router bench --router``
run; ``benchmarks/peers_table.py`` reads those files and calls ``build`` and ``markdown`` here. A cell
is one ``merge.merge`` document (its routers' summaries) plus its load level, arrival rate and, per
router, what the router's own metrics said (``router_decisions``).

``machine load`` is the 1-minute load average of the (shared) machine at the end of the router's runs:
on 2 cores, figures measured at a load of 8 were measured on a starved CPU.

Verdict, per cell, row of ours and peer row: ``ours`` (prefix-router's rows: ``serve`` as shipped, one
process per core, and a single process) against that peer on TTFT mean and p99; ``ok`` when ours is no
worse on both, and, in hot cells, at least ``HOT_MARGIN`` better on both.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from prefix_router.lab.bench.summary import distribution_ms
from prefix_router.pool import promtext

OURS = ("prefix-router prefix", "prefix-router prefix 1 process")
HOT_MARGIN = 0.15  # hot cells: ours must be at least 15 % lower than the peer
PEER_PREFIXES = ("sglang-router", "vllm-router")
VLLM_DECISIONS = "vllm_router_prefix_routing_decisions_total"
VLLM_INPUTS = "vllm_router_kv_routing_inputs_total"


def router_decisions(metrics_text: str) -> dict[str, float]:
    """vllm-router's cache_aware decisions (``prefix_hit``, ``prefix_miss``, ``load_imbalance``,
    ``missing_tokens``) and token sources (``render``, ``tokenize``, ``render_unavailable``) from its
    Prometheus page; empty for routers without these series."""
    samples = promtext.parse(metrics_text, frozenset((VLLM_DECISIONS, VLLM_INPUTS)))
    out: dict[str, float] = {}
    for sample in samples:
        key = sample.labels.get("outcome") or sample.labels.get("result")
        if key:
            out[key] = out.get(key, 0.0) + sample.value
    return out


def missing_share(decisions: Mapping[str, float]) -> float | None:
    """Share of vllm-router's decisions made without token ids (None when it reported none)."""
    keys = ("prefix_hit", "prefix_miss", "load_imbalance", "missing_tokens")
    total = sum(decisions.get(k, 0.0) for k in keys)
    return decisions.get("missing_tokens", 0.0) / total if total else None


def pool(summaries: Sequence[Mapping[str, Any]], records: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """One router's summary over its repeats: TTFT and hit rate from every request of every repeat,
    requests per worker summed, busy fraction averaged (``summaries``: the repeats' bench summaries;
    ``records``: their ``bench --records`` lines)."""
    ok = [r for r in records if r["ok"]]
    reported = [r for r in ok if r.get("cached_tokens") is not None and r.get("prompt_tokens")]
    prompt = sum(r["prompt_tokens"] for r in reported)
    cached = sum(min(r["cached_tokens"], r["prompt_tokens"]) for r in reported)
    per_worker: dict[str, int] = {}
    for summary in summaries:
        for worker, count in (summary.get("requests_per_worker") or {}).items():
            per_worker[worker] = per_worker.get(worker, 0) + int(count)
    busy = [s["busy_fraction"] for s in summaries if s.get("busy_fraction") is not None]
    return {
        "repeats": len(summaries),
        "requests": len(records),
        "errors": len(records) - len(ok),
        "hit_rate": round(cached / prompt, 4) if prompt else None,
        "ttft_ms": distribution_ms([r["ttft_s"] for r in ok if r.get("ttft_s") is not None]),
        "requests_per_worker": per_worker,
        "busy_fraction": round(sum(busy) / len(busy), 4) if busy else None,
        "repeat_ttft_mean_ms": [s["ttft_ms"]["mean"] for s in summaries],
    }


def is_peer(label: str) -> bool:
    return label.startswith(PEER_PREFIXES)


def build(cells: Sequence[Mapping[str, Any]], ours: Sequence[str] = OURS) -> dict[str, Any]:
    """The matrix document: the cells as given plus one verdict per (cell, row of ours, peer row)."""
    verdicts = [v for cell in cells for label in ours for v in cell_verdicts(cell, label)]
    return {
        "simulated": all(bool(c["document"].get("simulated")) for c in cells),
        "ours": list(ours),
        "hot_margin": HOT_MARGIN,
        "cells": list(cells),
        "verdicts": verdicts,
        "all_ok": bool(verdicts) and all(v["ok"] for v in verdicts),
    }


def cell_verdicts(cell: Mapping[str, Any], ours: str = OURS[0]) -> list[dict[str, Any]]:
    policies = cell["document"]["policies"]
    mine = policies.get(ours)
    if mine is None:
        return []
    hot = cell["load"] == "hot"
    return [
        {"ours": ours, **_verdict(cell, label, mine, theirs, hot)}
        for label, theirs in policies.items()
        if is_peer(label)
    ]


def _verdict(
    cell: Mapping[str, Any], peer: str, mine: Mapping[str, Any], theirs: Mapping[str, Any], hot: bool
) -> dict[str, Any]:
    limit = 1.0 - HOT_MARGIN if hot else 1.0
    mean = _ratio(mine["ttft_ms"]["mean"], theirs["ttft_ms"]["mean"])
    p99 = _ratio(mine["ttft_ms"]["p99"], theirs["ttft_ms"]["p99"])
    clean = not mine["errors"] and not theirs["errors"]
    ok = clean and mean is not None and p99 is not None and mean <= limit and p99 <= limit
    return {"workload": cell["workload"], "load": cell["load"], "peer": peer, "mean_ratio": mean,
            "p99_ratio": p99, "limit": limit, "ok": ok}  # fmt: skip


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None or b == 0 else round(a / b, 4)


# ---------------------------------------------------------------------- Markdown

HEADERS = ("workload", "load (busy)", "router / policy", "requests", "errors", "hit rate", "TTFT mean ms",
           "TTFT p50 ms", "TTFT p90 ms", "TTFT p99 ms", "requests per worker", "machine load")  # fmt: skip


def markdown(matrix: Mapping[str, Any]) -> str:
    """The results table and the verdict table, as Markdown."""
    lines = [
        "| " + " | ".join(HEADERS) + " |",
        "|" + "|".join(["---"] * 3 + ["---:"] * 7 + ["---", "---:"]) + "|",
    ]
    for cell in matrix["cells"]:
        for label, summary in cell["document"]["policies"].items():
            lines.append("| " + " | ".join(_row(cell, label, summary)) + " |")
    lines += ["", _verdict_table(matrix)]
    return "\n".join(lines) + "\n"


def _row(cell: Mapping[str, Any], label: str, s: Mapping[str, Any]) -> list[str]:
    ttft = s["ttft_ms"]
    busy = s.get("busy_fraction")
    load = f"{cell['load']} ({cell['rate']:g}/s, {busy * 100:.0f} %)" if busy is not None else cell["load"]
    name = label + _decision_note(cell.get("router_decisions", {}).get(label, {}))
    hit = s.get("hit_rate")
    times = [_ms(ttft[k]) for k in ("mean", "p50", "p90", "p99")]
    workers = _per_worker(s.get("requests_per_worker") or {})
    rate = "-" if hit is None else f"{hit * 100:.1f}%"
    machine = s.get("machine_load_avg")
    machine_text = "-" if machine is None else f"{machine:.1f}"
    return [
        cell["workload"],
        load,
        name,
        str(s["requests"]),
        str(s["errors"]),
        rate,
        *times,
        workers,
        machine_text,
    ]


def _decision_note(decisions: Mapping[str, float]) -> str:
    share = missing_share(decisions)
    return "" if share is None else f" (no token ids: {share * 100:.0f} %)"


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def _per_worker(counts: Mapping[str, int]) -> str:
    """Counts in worker order (URLs with or without a scheme sort alike)."""
    ordered = sorted(counts.items(), key=lambda kv: kv[0].split("://")[-1])
    return " / ".join(str(v) for _, v in ordered) or "-"


def _verdict_table(matrix: Mapping[str, Any]) -> str:
    lines = ["| workload | load | ours | peer | ours / peer, TTFT mean | TTFT p99 | needed | met |",
             "|---|---|---|---|---:|---:|---:|---|"]  # fmt: skip
    for v in matrix["verdicts"]:
        met = "yes" if v["ok"] else "no"
        cells = (
            v["workload"],
            v["load"],
            v["ours"],
            v["peer"],
            _x(v["mean_ratio"]),
            _x(v["p99_ratio"]),
            f"<= {v['limit']:.2f}",
            met,
        )
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _x(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"
