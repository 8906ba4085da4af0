"""The routing facade: one object that the proxy and the simulator both drive.

It owns the prefix index, the load tracker, the session table, the token units and one instance of every
policy. Policies only read; the router writes, so the index reflects what was really dispatched whichever
policy chose. A decision (``route``) is the ordered pipeline of ``routing/placement.py``, the policy's
``select`` one of its steps; that module states each step's contract and fallback.

Per request: ``route`` -> ``dispatched`` -> ``first_token`` (optional) -> ``finished``. A request
without blocks (the proxy's pass-through calls) is counted in the load like any other and writes nothing
to the index. ``finished`` may come after its worker was removed: it then releases the load and nothing
else. A request that failed before its first token trims its blocks beyond the prediction; after its
first token its blocks stay (the engine computed the whole prompt).

Workers: ``remove_worker`` forgets a worker entirely; ``forget_cache`` keeps it (and its in-flight count)
but drops what the index and the session table say it caches and its learned first-token model
(``routing/latency.py``: an ejected engine probably restarted).

Engine feedback (``routing/feedback.py`` judges each report against the prediction made at dispatch)
moves a worker's learned capacity by at most ``FeedbackTuning.capacity_step`` (a miss shrinks it, an
over-report on a full index grows it back, up to the known capacity) and never forgets a prefix. Token
units (``routing/units.py``) value a text key's tokens wherever they are used: the prediction, the load
tracker, the policy's cost (``Context.token_scale``) and the index's capacity in blocks. Index changes go
to a listener (``IndexChange``) when one is set (replication). Why: docs/routing.md, "Engine feedback".

Engine blocks: once a worker's engine states its KV block size (``set_engine_block``, from vLLM's
``cache_config_info``; 128 tokens on its CPU backend), its predictions are rounded down to whole engine
blocks of the prompt less its last token, never a partial block (the pipeline's ``round`` step).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum

from prefix_router.routing.backlog import prefill_work
from prefix_router.routing.bounded import BoundedLRU
from prefix_router.routing.feedback import (
    FeedbackStats,
    FeedbackTuning,
    PrefillTracker,
    Verdict,
    clamp_report,
    explained_by_queueing,
    judge,
    prompt_bound,
)
from prefix_router.routing.index import PrefixIndex
from prefix_router.routing.keys import KeyBuilder
from prefix_router.routing.latency import LatencyModel
from prefix_router.routing.load import LoadTracker
from prefix_router.routing.pd import DEFAULT_SKIP_PREFILL_TOKENS, PdDecision, SkipReason, skip_prefill
from prefix_router.routing.placement import Pipeline, prompt_value
from prefix_router.routing.policies import POLICIES
from prefix_router.routing.precise import PreciseTuning, PreciseView
from prefix_router.routing.settings import RoutingSettings
from prefix_router.routing.types import Decision, Outcome, Policy, RouteRequest
from prefix_router.routing.units import Counts, TokenUnits, UnitTuning


class ChangeKind(StrEnum):
    """What an :class:`IndexChange` does to the index (one method of ``PrefixIndex`` each). The router
    emits every kind but ``FORGET_OLDER`` (a worker's entries older than ``at``), which it applies when a
    replica sends it."""

    INSERT = "insert"
    TRIM = "trim"
    FORGET_OLDER = "forget_older"
    CAPACITY = "capacity"  # the worker's learned capacity, ``keep`` blocks (engine feedback)


@dataclass(init=False, slots=True)  # a written __init__, compiled: see routing/types.py
class IndexChange:
    """One update of the index, for replicas that share their view (see ``apply``). ``chained``: an insert's
    blocks are whole chains, each block's parent before it (what this router's own inserts are); False for
    block lists that need not be (some merged changes of other replicas): the index then matches the worker
    block by block for a while (``PrefixIndex.match``). A value, never changed once made, but not
    ``frozen`` (a frozen dataclass cannot have a written ``__init__``): a request makes two, and each
    process of ``serve --processes N`` two more per request of the others."""

    kind: ChangeKind
    worker: str
    blocks: tuple[int, ...] = ()
    keep: int = 0
    at: float = 0.0
    chained: bool = True

    def __init__(
        self,
        kind: ChangeKind,
        worker: str,
        blocks: tuple[int, ...] = (),
        keep: int = 0,
        at: float = 0.0,
        chained: bool = True,
    ) -> None:
        self.kind = kind
        self.worker = worker
        self.blocks = blocks
        self.keep = keep
        self.at = at
        self.chained = chained


@dataclass(init=False, slots=True)  # a written __init__, compiled: see routing/types.py
class _Prediction:
    worker: str
    tokens: int
    raced: bool  # dispatched while some of its predicted blocks were in another request's first prefill
    blocks: int  # the matched blocks behind ``tokens``
    last_touched: float | None  # the index's last access of its deepest predicted block before dispatch
    started: bool = False  # its first token came: the engine computed the whole prompt
    started_at: float | None = None  # when
    precise: bool = False  # predicted on the worker's event-fed view (``routing/precise.py``)

    def __init__(
        self,
        worker: str,
        tokens: int,
        raced: bool,
        blocks: int,
        last_touched: float | None,
        started: bool = False,
        started_at: float | None = None,
        precise: bool = False,
    ) -> None:
        self.worker = worker
        self.tokens = tokens
        self.raced = raced
        self.blocks = blocks
        self.last_touched = last_touched
        self.started = started
        self.started_at = started_at
        self.precise = precise


ChangeHook = Callable[[IndexChange], None]
# (model, worker, nominal tokens, reported tokens, the key's byte counts): one sample the units learned
SampleHook = Callable[[str, str, int, int, Counts | None], None]


class Router:
    def __init__(
        self,
        cfg: RoutingSettings,
        rng: random.Random | None = None,
        *,
        feedback: FeedbackTuning | None = None,
        units: UnitTuning | None = None,
        precise: PreciseTuning | None = None,
    ) -> None:
        """``feedback``, ``units``, ``precise``: the constants of those algorithms (their defaults when
        None), for the tests and the lab that want others; operators set ``cfg`` only."""
        self.cfg = cfg
        self.rng = rng if rng is not None else random.Random()
        self.feedback_tuning = feedback if feedback is not None else FeedbackTuning()
        self.keys = KeyBuilder(cfg.keys)
        self.units = TokenUnits(cfg.units, cfg.keys.chars_per_token, cfg.keys.image_tokens, units)
        self.index = PrefixIndex(
            block_tokens=cfg.keys.block_tokens,
            default_capacity_tokens=cfg.index.worker_capacity_tokens,
            max_total_blocks=cfg.index.max_total_blocks,
            ttl_s=cfg.index.ttl_s,
            max_prefix_blocks=cfg.index.max_prefix_blocks,
        )
        self.load = LoadTracker(cfg.trackers.max_tracked_requests)
        self.policies: dict[str, Policy] = {spec.name: spec.build(cfg.knobs(spec.name)) for spec in POLICIES}
        self._honour_sessions = frozenset(spec.name for spec in POLICIES if spec.honours_sessions)
        if cfg.policy not in self.policies:
            raise KeyError(f"unknown policy {cfg.policy!r}")
        self._sessions: BoundedLRU[str, str] = BoundedLRU(cfg.sessions.max_sessions)
        self._predictions: BoundedLRU[str, _Prediction] = BoundedLRU(cfg.trackers.max_tracked_requests)
        self._prefills = PrefillTracker(cfg.trackers.max_tracked_requests)
        self.feedback: dict[str, FeedbackStats] = {}
        self._engine_blocks: dict[str, int] = {}  # per worker (removed with it): the engine's KV block
        self.on_change: ChangeHook | None = None
        # told of every report the token units learned from (``serve --processes``: the others learn it too)
        self.on_units_sample: SampleHook | None = None
        self.precise = PreciseView(cfg.events, precise)
        self.precise.on_clear = self._engine_cleared
        # the steps of a decision (routing/placement.py), on these parts
        # each worker's first-token time, learned from the requests' (routing/latency.py)
        self.latency = LatencyModel(
            cfg.trackers.max_tracked_requests, active=False, drain=self.load.backlog.fleet_rate
        )
        self.pipeline = Pipeline(
            self.index, self.precise, self.load, self.units, self._sessions, self._engine_blocks, self.latency
        )

    def retune(self, cfg: RoutingSettings) -> None:
        """Take new knobs while serving: the default policy, each policy's knob group (a policy whose group
        changed is rebuilt, its own state, such as a round-robin position, starting over), session
        affinity, feedback tolerance and tenant isolation (``keys.isolate_tenants``: new requests are keyed
        in their tenant's namespace, or not). What sizes live state (the rest of ``keys``, ``index``,
        ``trackers``, ``units``, ``events``, ``sessions.max_sessions``) must not change (ValueError):
        that needs a new ``Router``."""
        same = ("index", "trackers", "units", "events")
        isolation = {"isolate_tenants": self.cfg.keys.isolate_tenants}
        if (
            any(getattr(cfg, k) != getattr(self.cfg, k) for k in same)
            or cfg.keys.model_copy(update=isolation) != self.cfg.keys
            or cfg.sessions.max_sessions != self.cfg.sessions.max_sessions
        ):
            raise ValueError(
                "retune: keys, index, trackers, units, events and sessions.max_sessions need a new Router"
            )
        if cfg.policy not in self.policies:
            raise KeyError(f"unknown policy {cfg.policy!r}")
        for spec in POLICIES:
            if cfg.knobs(spec.name) != self.cfg.knobs(spec.name):
                self.policies[spec.name] = spec.build(cfg.knobs(spec.name))
        self.keys.cfg = cfg.keys
        self.cfg = cfg

    # ------------------------------------------------------------ workers

    def add_worker(self, name: str, capacity_tokens: int | None = None, weight: float = 1.0) -> None:
        self.index.add_worker(name, capacity_tokens)
        self.load.add_worker(name, weight)
        self.feedback.setdefault(name, FeedbackStats())

    def add_event_worker(self, name: str, model: str) -> None:
        """``name`` (added) publishes KV cache events for ``model``: routed on its event-fed view while
        that is fresh (``routing/precise.py``); requests get precise keys from now on."""
        if name in self.index:
            self.precise.add_worker(name, model)
            self.keys.precise_block_tokens = self.cfg.events.block_tokens

    def remove_worker(self, name: str) -> None:
        self.index.remove_worker(name)
        self.precise.remove_worker(name)
        self.load.remove_worker(name)
        self._sessions.drop_values(name)
        self._prefills.forget_worker(name)
        self.feedback.pop(name, None)
        self._engine_blocks.pop(name, None)
        self.latency.forget(name)
        for policy in self.policies.values():
            policy.on_worker_removed(name)

    def _engine_cleared(self, name: str) -> None:
        """An event-fed worker's engine said its cache is empty (restart, ``AllBlocksCleared``): its
        approximate index goes too, so the cost model's fill (and the view used while the events are not
        fresh) starts from what the engine holds."""
        self.index.forget_older(name, math.inf)
        self.latency.forget(name)

    def forget_cache(self, name: str) -> None:
        """Drop ``name``'s index entries and sessions; its load, capacity and feedback stats stay."""
        self.index.forget_older(name, math.inf)
        self.precise.clear(name)
        self._sessions.drop_values(name)
        self._prefills.forget_worker(name)
        self.latency.forget(name)

    def set_engine_block(self, name: str, tokens: int) -> None:
        """The worker's engine caches whole blocks of ``tokens`` (vLLM's ``cache_config_info``)."""
        if name in self.index and tokens > 0:
            self._engine_blocks[name] = tokens

    def engine_block_tokens(self, name: str) -> int | None:
        return self._engine_blocks.get(name)

    def set_capacity(self, name: str, capacity_tokens: int) -> None:
        if name in self.index:
            self.index.set_capacity(name, capacity_tokens)

    def set_engine_load(self, name: str, queue_depth: int, kv_usage: float | None, now: float) -> None:
        if name in self.index:  # a late scrape of a removed worker re-creates nothing
            self.load.set_engine(name, queue_depth, kv_usage, now)

    def workers(self) -> list[str]:
        return self.index.workers()

    # ------------------------------------------------------------ decisions

    def route(
        self, req: RouteRequest, candidates: Sequence[str], now: float, policy: str | None = None
    ) -> Decision:
        """``req`` placed on one of ``candidates`` by ``policy`` (the configured one when None; KeyError for
        an unknown name): the steps of ``routing/placement.py`` in their order, the policy's ``select`` one
        of them."""
        if not candidates:
            raise ValueError("route needs at least one candidate")
        name = policy or self.cfg.policy
        chosen = self.policies[name]
        honours = name in self._honour_sessions
        return self.pipeline.place(req, candidates, now, self.cfg, self.rng, chosen, honours)

    def route_pd(
        self,
        req: RouteRequest,
        prefill: Sequence[str],
        decode: Sequence[str],
        now: float,
        *,
        skip_prefill_tokens: int = DEFAULT_SKIP_PREFILL_TOKENS,
        policy: str | None = None,
        decode_policy: str | None = None,
    ) -> PdDecision:
        """``req`` split into a prefill stage on one of ``prefill`` and a decode stage on one of ``decode``
        (the decode-capable workers), each by its policy (the configured one when None); the prefill stage
        skipped by the decider or for want of workers (``routing/pd.py``). Nothing is written: the edge
        calls ``dispatched`` for each stage it runs."""
        if not decode:
            if not prefill:
                raise ValueError("route_pd needs at least one candidate")
            return PdDecision(None, self.route(req, prefill, now, policy), SkipReason.NO_DECODE_WORKER)
        chosen = self.route(req, decode, now, decode_policy or policy)
        if not prefill:
            return PdDecision(None, chosen, SkipReason.NO_PREFILL_WORKER)
        prompt = chosen.estimated_prompt_tokens
        if prompt is None:
            prompt = self.estimated_prompt_tokens(req)
        if skip_prefill(chosen, prompt, skip_prefill_tokens):
            return PdDecision(None, chosen, SkipReason.DECODE_HOLDS_PREFIX)
        return PdDecision(self.route(req, prefill, now, policy), chosen)

    def handed_over(self, req: RouteRequest, decode: Decision) -> Decision:
        """``decode`` once a prefill stage handed the prompt's KV cache to its worker: the prompt predicted
        cached there (the whole engine blocks of all but its last token, once the engine's block is
        known), so that its load is charged no prefill and its engine's report is judged against it."""
        prompt = decode.estimated_prompt_tokens
        if prompt is None:
            prompt = self.estimated_prompt_tokens(req)
        block = self._engine_blocks.get(decode.worker)
        held = (prompt - 1) // block * block if block else prompt
        held = max(held, decode.predicted_tokens)
        return Decision(decode.worker, decode.branch, decode.matched_blocks, held, prompt, held)

    def estimated_prompt_tokens(self, req: RouteRequest) -> int:
        """The engine tokens ``req``'s prompt is estimated at (a text key's: ``routing/units.py``)."""
        return math.ceil(prompt_value(self.units, req))

    # ------------------------------------------------------------ lifecycle

    def dispatched(self, req: RouteRequest, decision: Decision, now: float) -> None:
        worker, matched = decision.worker, decision.matched_blocks
        raced = self._prefills.racing(worker, req.blocks[:matched])
        touched = self.index.last_access(worker, req.blocks[matched - 1]) if matched else None
        precise = bool(req.precise_blocks) and self.precise.fresh(worker, now)
        prediction = _Prediction(worker, decision.predicted_tokens, raced, matched, touched, precise=precise)
        self._predictions.set(req.route_id, prediction)
        if precise:
            confirmed = decision.predicted_tokens // self.cfg.events.block_tokens
            self.precise.speculate(worker, req.precise_blocks, confirmed, now)
        if worker in self.index and matched < len(req.blocks):
            self._prefills.started(req.route_id, worker, req.blocks[matched])
        self._insert(worker, req.blocks, now)
        prompt = (
            self.estimated_prompt_tokens(req)
            if decision.estimated_prompt_tokens is None
            else decision.estimated_prompt_tokens
        )
        cached = decision.predicted_tokens
        if decision.expected_cached_tokens is not None:
            cached = decision.expected_cached_tokens
        uncached = prompt - cached
        work = prefill_work(uncached, cached, self.cfg.trackers.attention_tokens)
        if self.latency.active and worker in self.index:  # recorded once a policy reads the model
            ahead = self.load.backlog.remaining(worker, now)
            decoding, queued = self.load.decoding(worker), self.load.queued(worker)
            self.latency.dispatched(req.route_id, worker, ahead + work, decoding, now, queued)
        self.load.start(req.route_id, worker, uncached, now, work)
        if req.session:
            self._sessions.set(req.session, worker)

    def sent(self, route_id: str, now: float) -> None:
        """A request ``dispatched`` earlier (a decode stage reserved at the two-stage choice while its
        prefill ran) is sent to its engine at ``now``: its first-token time runs from here."""
        self.latency.sent(route_id, now)

    def first_token(self, route_id: str, now: float) -> None:
        """The first token arrived at ``now``: its prefill, and every earlier one there, is done."""
        self.load.first_token(route_id, now)
        self.latency.observed(route_id, now)
        self._prefills.done(route_id)
        prediction = self._predictions.get(route_id)
        if prediction is not None:
            prediction.started, prediction.started_at = True, now

    def finished(self, req: RouteRequest, worker: str, outcome: Outcome, now: float) -> None:
        self.load.finish(req.route_id, now)
        self.latency.discard(req.route_id)
        self._prefills.done(req.route_id)
        prediction = self._predictions.pop(req.route_id)
        if worker not in self.index:  # removed meanwhile: nothing to learn, no state to re-create
            return
        if not outcome.ok:
            if prediction is None or not prediction.started:  # the engine may not have computed them
                keep = prediction.blocks if prediction else 0
                self._trim(worker, req.blocks, keep, now)
            return
        self._learn(req, worker, prediction, outcome, now)
        reported, counts = outcome.reported_prompt_tokens, req.counts[-1] if req.counts else None
        if (
            req.text_model is not None
            and reported is not None
            and self.learn_units(req.text_model, worker, req.key_tokens, reported, counts)
            and self.on_units_sample is not None
        ):
            self.on_units_sample(req.text_model, worker, req.key_tokens, reported, counts)
        if outcome.extension_blocks:
            self._insert(worker, outcome.extension_blocks, now)
        if outcome.precise_extension_blocks and self.precise.fresh(worker, now):
            confirmed = len(req.precise_blocks)  # the prompt's: speculated at dispatch or held
            self.precise.speculate(worker, outcome.precise_extension_blocks, confirmed, now)

    def learn_units(
        self, model: str, worker: str, nominal: int, reported: int, counts: Counts | None
    ) -> bool:
        """Learn what ``model``'s key bytes are worth from one report (here, or another process's); returns
        whether it was a sample. The worker's blocks take the model's new value."""
        if not self.units.observe(model, nominal, reported, counts):
            return False
        if worker in self.index:
            self.index.set_block_value(worker, self.index.block_tokens * self.units.scale(model))
        return True

    def _learn(
        self, req: RouteRequest, worker: str, prediction: _Prediction | None, outcome: Outcome, now: float
    ) -> None:
        """Judge the engine's report (``routing/feedback.py``); a miss or an over-report moves the worker's
        learned capacity by at most ``feedback.capacity_step`` of it."""
        if prediction is None:  # its prediction gave way in the bounded table: nothing to compare
            return
        stats = self.feedback[worker]
        if outcome.cached_tokens is None:
            stats.unreported += 1
            return
        reported, moved = clamp_report(outcome.cached_tokens, prompt_bound(req.key_tokens, outcome))
        if prediction.precise:  # the events are the engine's word: nothing to learn, agreement counted
            self.precise.report(
                worker, prediction.tokens, outcome.cached_tokens, outcome.reported_prompt_tokens
            )
            stats.count(
                judge(self.feedback_tuning, prediction.tokens, reported, False, False),
                prediction.tokens,
                reported,
                moved,
            )
            return
        cfg = self.feedback_tuning
        turnover = self.index.turnover(worker, now)
        queued = explained_by_queueing(cfg, prediction.last_touched, prediction.started_at, turnover)
        verdict = judge(cfg, prediction.tokens, reported, prediction.raced, queued)
        stats.count(verdict, prediction.tokens, reported, moved)
        if verdict in (Verdict.MISS, Verdict.OVER):
            self._learn_capacity(worker, verdict == Verdict.OVER, now)

    def _learn_capacity(self, worker: str, grow: bool, now: float) -> None:
        """A miss: the engine evicted what the index still holds, so it holds less than the index assumes
        (shrink). An over-report while the index is full: the index evicted what the engine still holds
        (grow, up to the known capacity). One report moves the capacity by at most a step of it."""
        step, index = self.feedback_tuning.capacity_step, self.index
        cap = index.capacity_blocks(worker)
        if grow:
            if index.blocks_of(worker) < cap * (1 - step):
                return  # the index was not full: its capacity did not cause the shortfall
            wanted = cap + max(1, math.ceil(cap * step))
        else:
            floor = index.blocks_for(worker, self.feedback_tuning.min_capacity_tokens)
            wanted = max(floor, cap - math.ceil(cap * step))
        learned = index.learn_capacity(worker, wanted)
        if learned != cap:
            self.feedback[worker].capacity_changes += 1
            self._emit(IndexChange(ChangeKind.CAPACITY, worker, keep=learned, at=now))

    # ------------------------------------------------------------ index writes (shared with replicas)

    def _insert(self, worker: str, blocks: tuple[int, ...], now: float) -> None:
        if not blocks or worker not in self.index:
            return
        self.index.insert_chain(worker, blocks, now)  # a request's key or its extension: one chain
        if self.on_change is not None:  # built for a listener only (twice per request, ~1 us each)
            self._emit(IndexChange(ChangeKind.INSERT, worker, blocks, at=now))

    def _trim(self, worker: str, blocks: tuple[int, ...], keep: int, now: float) -> int:
        if len(blocks) <= keep:
            return 0
        removed = self.index.trim(worker, blocks, keep)
        self._emit(IndexChange(ChangeKind.TRIM, worker, blocks, keep, now))
        return removed

    def _emit(self, change: IndexChange) -> None:
        if self.on_change is not None:
            self.on_change(change)

    def apply(self, change: IndexChange) -> None:
        """Apply another replica's index update to the local index (never re-emitted)."""
        if change.worker not in self.index:
            return
        if change.kind == ChangeKind.INSERT:
            self.index.insert(change.worker, change.blocks, change.at, chained=change.chained)
        elif change.kind == ChangeKind.TRIM:
            self.index.trim(change.worker, change.blocks, change.keep)
        elif change.kind == ChangeKind.FORGET_OLDER:
            self.index.forget_older(change.worker, change.at)
        elif change.kind == ChangeKind.CAPACITY:
            self.index.learn_capacity(change.worker, change.keep)

    # ------------------------------------------------------------ introspection

    def policy_names(self) -> list[str]:
        return list(self.policies)

    def summary(self, now: float = 0.0) -> dict[str, object]:
        """The index, trackers and per worker state (``now``: the clock of ``route``, for the event-fed
        views' ages and freshness)."""
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
            "prefilling_requests": len(self._prefills),
            "sessions": len(self._sessions),
            "units": self.units.summary(),  # learned tokens of text keys, per model
            "workers": {name: self._worker_summary(name, now) for name in self.index.workers()},
        }

    def _worker_summary(self, name: str, now: float) -> dict[str, object]:
        snap = self.load.snapshot(name, 0.0)
        stats = self.feedback.get(name, FeedbackStats())
        return {
            "indexed_tokens": self.index.tokens_of(name),
            "capacity_tokens": self.index.capacity_tokens(name),  # learned from engine feedback
            "known_capacity_tokens": self.index.ceiling_tokens(name),  # configured or scraped
            "block_tokens": self.index.block_value(name),  # what one of its blocks is worth (units)
            "engine_block_tokens": self._engine_blocks.get(name),  # the engine's KV block, once scraped
            "in_flight": snap.in_flight,
            "pending_prefill_tokens": snap.pending_prefill_tokens,
            # predicted vs reported cached tokens, summed over the requests whose engine reported only
            "feedback": stats.as_dict(),
            # the event-fed view (workers with kv_events): its state, blocks by source, counters
            **({"precise": self.precise.summary(name, now)} if name in self.precise else {}),
        }
