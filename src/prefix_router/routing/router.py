"""The routing facade: one object that the proxy and the simulator both drive.

It owns the prefix index (what each worker probably caches), the load tracker (what each worker is
doing, as seen by this router), the session table and one instance of every policy. Policies only read;
the router writes, so the index reflects what was really dispatched whichever policy chose.

Per request: ``route`` -> ``dispatched`` -> ``first_token`` (optional) -> ``finished``. A request
without blocks (the proxy's pass-through calls) is counted in the load like any other; with no blocks
and an outcome that reports nothing it writes nothing to the index (no change is emitted either).
``finished`` may come after its worker was removed: it then releases the load and nothing else.

Workers: ``remove_worker`` forgets a worker entirely; ``forget_cache`` keeps it (and its in-flight count)
but drops what the index and the session table say it caches (an ejected engine probably restarted).

Engine feedback: when a response reports fewer cached tokens than predicted (below
``feedback_tolerance`` x the prediction), the engine evicted the predicted blocks earlier than the index
assumed. With LRU engines everything the worker last used no later than those blocks is gone too, so the
worker's entries up to the last access of the deepest predicted block are forgotten. (The request's own
blocks were just recomputed and are kept.)
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum

from prefix_router.routing.bounded import BoundedLRU
from prefix_router.routing.index import PrefixIndex
from prefix_router.routing.keys import KeyBuilder
from prefix_router.routing.load import LoadTracker
from prefix_router.routing.policies import POLICIES
from prefix_router.routing.policies.base import load_cap, under_cap
from prefix_router.routing.settings import RoutingSettings
from prefix_router.routing.types import (
    Branch,
    Context,
    Decision,
    Outcome,
    Policy,
    RouteRequest,
    WorkerSnapshot,
)


class ChangeKind(StrEnum):
    """What an :class:`IndexChange` does to the index (one method of ``PrefixIndex`` each)."""

    INSERT = "insert"
    TRIM = "trim"
    FORGET_OLDER = "forget_older"


@dataclass(frozen=True, slots=True)
class IndexChange:
    """One update of the index, for replicas that share their view (see ``apply``)."""

    kind: ChangeKind
    worker: str
    blocks: tuple[int, ...] = ()
    keep: int = 0
    at: float = 0.0


@dataclass(slots=True)
class _Prediction:
    worker: str
    tokens: int
    deepest_seen: float | None


@dataclass(slots=True)
class FeedbackStats:
    reports: int = 0
    predicted_tokens: int = 0
    actual_tokens: int = 0
    mismatches: int = 0


ChangeHook = Callable[[IndexChange], None]


class Router:
    def __init__(self, cfg: RoutingSettings, rng: random.Random | None = None) -> None:
        self.cfg = cfg
        self.rng = rng if rng is not None else random.Random()
        self.keys = KeyBuilder(cfg.keys)
        self.index = PrefixIndex(
            block_tokens=cfg.keys.block_tokens,
            default_capacity_tokens=cfg.index.worker_capacity_tokens,
            max_total_blocks=cfg.index.max_total_blocks,
            ttl_s=cfg.index.ttl_s,
            max_prefix_blocks=cfg.index.max_prefix_blocks,
        )
        self.load = LoadTracker(cfg.trackers.max_tracked_requests, cfg.trackers.engine_load_stale_s)
        self.policies: dict[str, Policy] = {spec.name: spec.build(cfg.knobs(spec.name)) for spec in POLICIES}
        self._honour_sessions = frozenset(spec.name for spec in POLICIES if spec.honours_sessions)
        if cfg.policy not in self.policies:
            raise KeyError(f"unknown policy {cfg.policy!r}")
        self._sessions: BoundedLRU[str, str] = BoundedLRU(cfg.sessions.max_sessions)
        self._predictions: BoundedLRU[str, _Prediction] = BoundedLRU(cfg.trackers.max_tracked_requests)
        self.feedback: dict[str, FeedbackStats] = {}
        self.on_change: ChangeHook | None = None

    # ------------------------------------------------------------ workers

    def add_worker(self, name: str, capacity_tokens: int | None = None, weight: float = 1.0) -> None:
        self.index.add_worker(name, capacity_tokens)
        self.load.add_worker(name, weight)
        self.feedback.setdefault(name, FeedbackStats())

    def remove_worker(self, name: str) -> None:
        self.index.remove_worker(name)
        self.load.remove_worker(name)
        self._sessions.drop_values(name)
        self.feedback.pop(name, None)
        for policy in self.policies.values():
            policy.on_worker_removed(name)

    def forget_cache(self, name: str) -> None:
        """Drop ``name``'s index entries and sessions; its load, capacity and feedback stats stay."""
        self.index.forget_older(name, math.inf)
        self._sessions.drop_values(name)

    def set_capacity(self, name: str, capacity_tokens: int) -> None:
        if name in self.index.workers():
            self.index.set_capacity(name, capacity_tokens)

    def set_engine_load(self, name: str, queue_depth: int, kv_usage: float | None, now: float) -> None:
        self.load.set_engine(name, queue_depth, kv_usage, now)

    def workers(self) -> list[str]:
        return self.index.workers()

    # ------------------------------------------------------------ decisions

    def route(
        self, req: RouteRequest, candidates: Sequence[str], now: float, policy: str | None = None
    ) -> Decision:
        if not candidates:
            raise ValueError("route needs at least one candidate")
        name = policy or self.cfg.policy
        chosen_policy = self.policies[name]
        matches = self.index.match(req.blocks)
        snaps = self.load.snapshots(candidates, now)
        sticky = self._sticky(req, snaps) if name in self._honour_sessions else None
        decision = sticky or chosen_policy.select(req, snaps, Context(now, self.rng, matches))
        matched = matches.get(decision.worker, 0)
        predicted = min(matched * self.index.block_tokens, req.prompt_tokens)
        return Decision(decision.worker, decision.branch, matched, predicted)

    def _sticky(self, req: RouteRequest, snaps: Sequence[WorkerSnapshot]) -> Decision | None:
        sessions = self.cfg.sessions
        if not (sessions.affinity and req.session):
            return None
        worker = self._sessions.get(req.session)
        snap = next((s for s in snaps if s.name == worker), None)
        if snap is None or not under_cap(snap, load_cap(snaps, sessions.load_factor, sessions.load_slack)):
            return None
        return Decision(snap.name, Branch.SESSION)

    # ------------------------------------------------------------ lifecycle

    def dispatched(self, req: RouteRequest, decision: Decision, now: float) -> None:
        worker = decision.worker
        deepest = req.blocks[decision.matched_blocks - 1] if decision.matched_blocks else None
        seen = self.index.last_access(worker, deepest) if deepest is not None else None
        self._predictions.set(req.request_id, _Prediction(worker, decision.predicted_tokens, seen))
        self._insert(worker, req.blocks, now)
        self.load.start(req.request_id, worker, req.prompt_tokens - decision.predicted_tokens)
        if req.session:
            self._sessions.set(req.session, worker)

    def first_token(self, request_id: str) -> None:
        self.load.first_token(request_id)

    def finished(self, req: RouteRequest, worker: str, outcome: Outcome, now: float) -> None:
        self.load.finish(req.request_id)
        prediction = self._predictions.pop(req.request_id)
        if worker not in self.index:  # removed meanwhile: nothing to learn, no state to re-create
            return
        if not outcome.ok:
            keep = (prediction.tokens // self.index.block_tokens) if prediction else 0
            self._trim(worker, req.blocks, keep, now)
            return
        if prediction is not None and outcome.cached_tokens is not None:
            self._learn(worker, prediction, outcome.cached_tokens, now)
        if outcome.extension_blocks:
            self._insert(worker, outcome.extension_blocks, now)

    def _learn(self, worker: str, prediction: _Prediction, cached: int, now: float) -> None:
        stats = self.feedback.setdefault(worker, FeedbackStats())
        stats.reports += 1
        stats.predicted_tokens += prediction.tokens
        stats.actual_tokens += cached
        if cached >= prediction.tokens * self.cfg.feedback.tolerance or prediction.deepest_seen is None:
            return
        stats.mismatches += 1
        self.index.forget_older(worker, prediction.deepest_seen)
        self._emit(IndexChange(ChangeKind.FORGET_OLDER, worker, at=prediction.deepest_seen))

    # ------------------------------------------------------------ index writes (shared with replicas)

    def _insert(self, worker: str, blocks: tuple[int, ...], now: float) -> None:
        if not blocks:
            return
        self.index.insert(worker, blocks, now)
        self._emit(IndexChange(ChangeKind.INSERT, worker, blocks, at=now))

    def _trim(self, worker: str, blocks: tuple[int, ...], keep: int, now: float) -> None:
        if len(blocks) <= keep:
            return
        self.index.trim(worker, blocks, keep)
        self._emit(IndexChange(ChangeKind.TRIM, worker, blocks, keep, now))

    def _emit(self, change: IndexChange) -> None:
        if self.on_change is not None:
            self.on_change(change)

    def apply(self, change: IndexChange) -> None:
        """Apply another replica's index update to the local index (never re-emitted)."""
        if change.worker not in self.index.workers():
            return
        if change.kind == ChangeKind.INSERT:
            self.index.insert(change.worker, change.blocks, change.at)
        elif change.kind == ChangeKind.TRIM:
            self.index.trim(change.worker, change.blocks, change.keep)
        elif change.kind == ChangeKind.FORGET_OLDER:
            self.index.forget_older(change.worker, change.at)

    # ------------------------------------------------------------ introspection

    def policy_names(self) -> list[str]:
        return list(self.policies)

    def summary(self) -> dict[str, object]:
        return {
            "policy": self.cfg.policy,
            "index": {
                "entries": len(self.index),
                "unique_blocks": self.index.unique_blocks(),
                "max_total_blocks": self.index.max_total_blocks,
                "block_tokens": self.index.block_tokens,
                "evictions": self.index.evictions,
            },
            "tracked_requests": self.load.tracked(),
            "sessions": len(self._sessions),
            "workers": {name: self._worker_summary(name) for name in self.index.workers()},
        }

    def _worker_summary(self, name: str) -> dict[str, object]:
        snap = self.load.snapshot(name, 0.0)
        stats = self.feedback.get(name, FeedbackStats())
        return {
            "indexed_tokens": self.index.tokens_of(name),
            "capacity_tokens": self.index.capacity_tokens(name),
            "in_flight": snap.in_flight,
            "pending_prefill_tokens": snap.pending_prefill_tokens,
            "predicted_cached_tokens": stats.predicted_tokens,
            "actual_cached_tokens": stats.actual_tokens,
            "feedback_reports": stats.reports,
            "feedback_mismatches": stats.mismatches,
        }
