"""What the dashboard shows, as one JSON document (``Board.document``), made from the node's state when a
viewer asks (nothing is sampled while nobody watches) and shared by every viewer for ``FRESH_S``.

- ``workers``: per worker, its health, draining, in flight, the engine's queue and KV usage (scraped), the
  predicted and engine-reported cache hit rates over the decisions of the last ``WINDOW_S``, and precise
  mode's view (state, event lag: the age of its last event).
- ``series``: the fleet's hit rates (predicted, reported) and first-token time (observed, predicted) in
  ``BUCKET_S`` buckets over ``WINDOW_S``, from the decision feed.
- ``decisions``: the last ``DECISIONS_SHOWN`` decisions with each candidate's figures.
- ``prefixes``: the prefix map: the ``PREFIXES_SHOWN`` prefixes most requested in the feed (by a salted
  hash of their first block, with their tenant's), where the index holds them and how much of each (the
  index's match of their longest request seen); ``moves``: when a prefix's main holder changed between two
  documents (the last ``MOVES_KEPT``).
- ``replication``: the replication's counters and gauges (None: not replicated).

Bounded whatever the fleet: workers by the pool's cap, everything else by the constants below. Workers
are named as the decision feed names them (``public_names``: never an upstream address); no text, no key.
"""

from __future__ import annotations

import math
from collections import Counter, deque
from collections.abc import Callable, Iterable
from typing import Any

from prefix_router.node.state import NodeState
from prefix_router.node.telemetry.decisions import DecisionEntry, Hasher, public_names

WINDOW_S = 300.0  # the charts' and the hit rates' span
BUCKET_S = 5.0  # one chart point
DECISIONS_SHOWN = 40
PREFIXES_SHOWN = 60
MOVES_KEPT = 40
HOME_REQUESTS = 16  # a prefix's home: where most of its last this many requests went
FRESH_S = 0.5  # a document is shared by the viewers that ask within this


class Board:
    """The dashboard's document of one node, and the prefix map's memory (main holders, moves)."""

    def __init__(self, state: NodeState) -> None:
        self.state = state
        self._holders: dict[str, str] = {}  # prefix id -> its main holder in the last document
        self.moves: deque[dict[str, Any]] = deque(maxlen=MOVES_KEPT)
        self._cached: tuple[float, bytes] | None = None

    def cached(self, now: float, make: Callable[[dict[str, Any]], bytes]) -> bytes:
        if self._cached is None or now - self._cached[0] > FRESH_S:
            self._cached = (now, make(self.document(now)))
        return self._cached[1]

    def document(self, now: float) -> dict[str, Any]:
        state = self.state
        feed = state.decisions
        names = public_names(state.pool, feed.hasher)
        recent = [e for e in feed if now - e.at <= WINDOW_S]
        prefixes = self.prefix_map(recent, names, now - feed.origin)
        return {
            "t": round(now - feed.origin, 3),
            "policy": state.config.routing.policy,
            "decisions_total": feed.total,
            "workers": self.workers(recent, names, now),
            "series": series(recent, now, feed.origin),
            "decisions": feed.view(names, DECISIONS_SHOWN),
            "prefixes": prefixes,
            "moves": list(self.moves),
            "replication": None if state.replication_stats is None else state.replication_stats(),
            "simulated": False,
        }

    def workers(self, recent: list[DecisionEntry], names: Callable[[str], str], now: float) -> list[Any]:
        router, pool = self.state.router, self.state.pool
        by_worker: dict[str, list[DecisionEntry]] = {}
        for entry in recent:
            by_worker.setdefault(entry.worker, []).append(entry)
        out = []
        for worker in pool:
            snap = router.load.snapshot(worker.name, now)
            mine = by_worker.get(worker.name, [])
            precise = router.precise.summary(worker.name, now) if worker.name in router.precise else None
            out.append(
                {
                    "name": names(worker.name),
                    "health": worker.health.verdict,
                    "draining": worker.draining,
                    "in_flight": pool.in_flight(worker.name),
                    "queue": snap.queue_depth,
                    "kv_usage": snap.kv_usage,
                    "indexed_tokens": router.index.tokens_of(worker.name),
                    "decisions": len(mine),
                    "hit_predicted": predicted_rate(mine),
                    "hit_reported": reported_rate(mine),
                    "precise": None if precise is None else precise_view(precise),
                }
            )
        return out

    def prefix_map(self, recent: list[DecisionEntry], names: Callable[[str], str], t: float) -> list[Any]:
        """The most requested prefixes, where the index holds them, and their moves since last time."""
        hasher = self.state.decisions.hasher
        counts: Counter[int] = Counter()
        longest: dict[int, DecisionEntry] = {}
        latest: dict[int, deque[str]] = {}  # where each prefix's last requests went
        for entry in recent:
            root = entry.root
            if root is None:
                continue
            counts[root] += 1
            latest.setdefault(root, deque(maxlen=HOME_REQUESTS)).append(entry.worker)
            if root not in longest or len(entry.blocks) > len(longest[root].blocks):
                longest[root] = entry
        index = self.state.router.index
        out, holders = [], {}
        for root, n in counts.most_common(PREFIXES_SHOWN):
            entry = longest[root]
            matched = index.match(entry.blocks)
            held = sorted(
                ((w, round(b * index.block_value(w))) for w, b in matched.items() if b > 0),
                key=lambda x: -x[1],
            )
            pid = hasher(root, "p-")
            held.sort(key=lambda x: x[0] != home_of(latest[root]))  # its home first, if held there
            main = names(held[0][0]) if held else None
            self._moved(pid, entry, main, hasher, t)
            if main is not None:
                holders[pid] = main
            out.append(
                {
                    "prefix": pid,
                    "tenant": None if entry.namespace == 0 else hasher(entry.namespace, "t-"),
                    "requests": n,
                    "blocks": len(entry.blocks),
                    "holders": [{"worker": names(w), "tokens": tokens} for w, tokens in held],
                }
            )
        self._holders = {**self._holders, **holders} if len(self._holders) < 4 * PREFIXES_SHOWN else holders
        return out

    def _moved(self, pid: str, entry: DecisionEntry, main: str | None, hasher: Hasher, t: float) -> None:
        before = self._holders.get(pid)
        if main is not None and before is not None and before != main:
            tenant = None if entry.namespace == 0 else hasher(entry.namespace, "t-")
            self.moves.append({"t": round(t, 3), "prefix": pid, "tenant": tenant, "from": before, "to": main})


def home_of(workers: Iterable[str]) -> str:
    """Where most of a prefix's last requests went (the latest among equals)."""
    counts = Counter(workers)
    top = max(counts.values())
    return [w for w in workers if counts[w] == top][-1]


def predicted_rate(entries: Iterable[DecisionEntry]) -> float | None:
    predicted = prompt = 0
    for e in entries:
        if e.prompt_tokens:
            predicted, prompt = predicted + e.predicted_tokens, prompt + e.prompt_tokens
    return predicted / prompt if prompt else None


def reported_rate(entries: Iterable[DecisionEntry]) -> float | None:
    cached = prompt = 0
    for e in entries:
        if e.cached_tokens is not None and e.reported_prompt_tokens:
            cached, prompt = cached + e.cached_tokens, prompt + e.reported_prompt_tokens
    return cached / prompt if prompt else None


def precise_view(summary: dict[str, Any]) -> dict[str, Any]:
    age = summary.get("last_message_age_s")
    return {
        "state": summary.get("state"),
        "lag_ms": None if age is None else round(age * 1e3, 1),
        "blocks": summary.get("blocks"),
    }


def series(recent: list[DecisionEntry], now: float, origin: float) -> list[dict[str, Any]]:
    """The fleet over the window, one point per ``BUCKET_S`` that had decisions."""
    buckets: dict[int, list[DecisionEntry]] = {}
    for entry in recent:
        buckets.setdefault(math.floor((entry.at - origin) / BUCKET_S), []).append(entry)
    return [point(k * BUCKET_S, buckets[k]) for k in sorted(buckets)]


def point(t: float, entries: list[DecisionEntry]) -> dict[str, Any]:
    observed = [e.observed_ttft_s for e in entries if e.observed_ttft_s is not None]
    predicted = [e.predicted_ttft_s for e in entries if e.predicted_ttft_s is not None]
    return {
        "t": t,
        "decisions": len(entries),
        "hit_predicted": predicted_rate(entries),
        "hit_reported": reported_rate(entries),
        "ttft_ms": round(1e3 * sum(observed) / len(observed), 2) if observed else None,
        "predicted_ttft_ms": round(1e3 * sum(predicted) / len(predicted), 2) if predicted else None,
    }
