"""The cluster simulator: N simulated engines behind the routing core, in virtual time (simulated).

The router is driven exactly as the proxy drives it: ``route`` (candidates = every instance) ->
``dispatched`` -> ``first_token`` -> ``finished`` with the engine-reported cached tokens and the
extension blocks of the reply. Engines are ``EngineModel`` instances (the same model as ``engine-sim``);
the router also receives each engine's queue depth and KV usage every ``scrape_interval_s``, as the
proxy's pool scrapes ``/metrics``. No sockets, no sleeps: a run is a loop over a time-ordered event queue,
deterministic for a fixed seed. With a ``PdSpec`` the fleet is disaggregated: every request goes through
the routing core's two-stage choice (``Router.route_pd``), its stages as ``pd_sim`` says.
"""

from __future__ import annotations

import dataclasses
import random
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from prefix_router.lab.sim.decision_log import DecisionLog
from prefix_router.lab.sim.engine import EngineEvent, EngineModel, RequestRejected
from prefix_router.lab.sim.events import (
    EngineFault,
    EngineStepEnd,
    EventQueue,
    Fault,
    KvHandoff,
    MetricsScrape,
    RequestArrival,
)
from prefix_router.lab.sim.pd_sim import PREFILL_SUFFIX, PdSpec, PdStats, Stage
from prefix_router.lab.sim.precise_feed import EventFeed
from prefix_router.lab.sim.profiles import EngineProfile
from prefix_router.lab.sim.requests import RequestSource, SimRequest
from prefix_router.lab.sim.stats import SimStats
from prefix_router.routing import (
    Decision,
    FeedbackTuning,
    Outcome,
    PdDecision,
    Router,
    RouteRequest,
    RoutingSettings,
)

ProgressHook = Callable[[int], None]
PROGRESS_EVERY = 256  # requests between progress callbacks
SAMPLE_EVERY = 256  # finished requests between samples of the cache replication


@dataclass(frozen=True, slots=True)
class ClusterSpec:
    """The simulated cluster: identical instances of one profile."""

    instances: int
    profile: EngineProfile
    capacity_tokens: int
    seed: int = 0
    scrape_interval_s: float = 2.0  # the proxy scrapes /metrics every 2 s by default
    max_live_requests: int = 10_000_000

    def names(self) -> list[str]:
        return [f"engine-{i:03d}" for i in range(self.instances)]


@dataclass(slots=True)
class _Live:
    request: SimRequest
    instance: int
    predicted: int
    route: RouteRequest  # as routed (with its precise key in precise mode)
    first_token: float | None = None
    predicted_ttft_s: float | None = None  # the decision's prediction, from dispatch
    sent: float = 0.0  # when it was submitted to its engine


class Record(NamedTuple):
    """One finished request: when it arrived, the worker it went to, the cached tokens the router
    predicted there and those the engine reported."""

    arrival: float
    instance: int
    predicted: int
    cached: int


@dataclass(slots=True)
class RunResult:
    stats: SimStats
    wall_s: float
    arrivals: list[SimRequest] = field(default_factory=list)
    router_summary: dict[str, object] = field(default_factory=dict)
    pd: dict[str, object] | None = None  # PdStats.summary() of a disaggregated run


class ClusterSimulation:
    """One run of one policy over one request source."""

    def __init__(
        self,
        spec: ClusterSpec,
        policy: str,
        source: RequestSource,
        routing: RoutingSettings,
        progress: ProgressHook | None = None,
        keep_arrivals: bool = False,
        precise: bool = False,
        faults: Sequence[tuple[float, Fault]] = (),
        event_lag_s: float = 0.0,
        router_seed: str | None = None,
        feedback: FeedbackTuning | None = None,
        decisions: DecisionLog | None = None,
        pd: PdSpec | None = None,
    ) -> None:
        """``precise``: every engine publishes KV cache events to the router's event-fed views
        (``precise_feed.py``), each reaching the router ``event_lag_s`` of simulated time after it was
        published; ``faults``: (time, fault) pairs, restarts and cache resets; ``router_seed``: the seed
        of the router's own random choices (its ties; default ``router:<spec.seed>``), apart from the
        requests' and faults' seed, so two runs can differ in those choices alone; ``feedback``: the engine
        feedback's constants (``routing/feedback.py``; its defaults when None); ``decisions``: where each
        decision and its outcome is written (``decision_log.py``), for the dashboard's replay."""
        self.spec = spec
        self.router_seed = router_seed if router_seed is not None else f"router:{spec.seed}"
        self.policy = policy
        self.source = source
        self.names = spec.names()
        self.index = {name: i for i, name in enumerate(self.names)}
        self.engines = [self._engine() for _ in self.names]
        block = self.source.engine_block_tokens
        if precise:
            keys = routing.keys.model_copy(update={"mode": "events"})
            events = routing.events.model_copy(update={"block_tokens": block})
            routing = routing.model_copy(update={"keys": keys, "events": events})
        self.router = self._router(routing, feedback)
        self.feed = EventFeed(self.router, self.names, block, lag_s=event_lag_s) if precise else None
        if self.feed is not None:
            for i, engine in enumerate(self.engines):
                self.feed.attach(i, engine.cache)
        self.faults = list(faults)
        self.records: list[Record] = []  # one per finished request
        self.queue = EventQueue()
        self.stats = SimStats(spec.instances)
        self._scheduled: list[float | None] = [None] * spec.instances
        self._versions = [0] * spec.instances
        self._live: dict[str, _Live] = {}
        self._initial: Iterator[SimRequest] = iter(())
        self._upcoming: SimRequest | None = None
        self._progress = progress
        self._unreported = 0
        self._unsampled = 0
        self._arrivals: list[SimRequest] | None = [] if keep_arrivals else None
        self.decisions = decisions
        if pd is not None and len(pd.roles) != spec.instances:
            raise ValueError(f"{len(pd.roles)} roles for {spec.instances} instances")
        self.pd = pd
        self.pd_stats = PdStats()
        self._pd_names = pd.names(self.names) if pd is not None else ([], self.names)
        self._stages: dict[str, Stage] = {}

    def _engine(self) -> EngineModel:
        return EngineModel(
            self.spec.profile,
            capacity_tokens=self.spec.capacity_tokens,
            block_tokens=self.source.engine_block_tokens,
        )

    def _router(self, routing: RoutingSettings, feedback: FeedbackTuning | None) -> Router:
        router = Router(routing, rng=random.Random(self.router_seed), feedback=feedback)
        for name in self.names:
            router.add_worker(name, capacity_tokens=self.spec.capacity_tokens)
        return router

    # ------------------------------------------------------------------ loop

    def run(self) -> RunResult:
        started = time.perf_counter()
        self._initial = self.source.initial()
        self._push_next_initial()
        if self.spec.scrape_interval_s > 0:
            self.queue.push(0.0, MetricsScrape())
        for at, fault in self.faults:
            self.queue.push(at, EngineFault(fault))
        queue, feed = self.queue, self.feed
        while queue:
            now, event = queue.pop()
            if feed is not None:
                feed.deliver(now)
                feed.now = now
            event.handle(self, now)
        self._report_progress()
        self._sample_replication()
        self.stats.busy_s = [e.stats.busy_s for e in self.engines]
        self.stats.prefill_s = [e.stats.prefill_s for e in self.engines]
        result = RunResult(self.stats, time.perf_counter() - started, self._arrivals or [])
        result.router_summary = self.router.summary()
        result.pd = self.pd_stats.summary() if self.pd is not None else None
        return result

    def _push_next_initial(self) -> None:
        self._upcoming = next(self._initial, None)
        if self._upcoming is not None:
            self.queue.push(self._upcoming.arrival, RequestArrival(self._upcoming))

    # ------------------------------------------------------------------ hooks

    def on_arrival(self, request: SimRequest, now: float) -> None:
        if request is self._upcoming:
            self._push_next_initial()
        if self._arrivals is not None:
            self._arrivals.append(request)
        self.stats.arrived(now)
        route = request.route if self.feed is None else self.feed.with_precise(request.route, request.engine)
        if self.pd is not None:
            self._arrive_pd(request, route, self.pd, now)
            return
        decision = self.router.route(route, self.names, now, self.policy)
        self.router.dispatched(route, decision, now)
        if self.decisions is not None:
            self.decisions.decided(request.request_id, now, self.policy, decision, route)
        self._run(request, route, decision, now)

    def _run(self, request: SimRequest, route: RouteRequest, decision: Decision, now: float) -> None:
        """Submit ``request`` (routed and dispatched) to its engine."""
        instance = self.index[decision.worker]
        try:
            self.engines[instance].submit(request.engine, now)
        except RequestRejected:
            self._failed(request, decision.worker, now)
            return
        if len(self._live) >= self.spec.max_live_requests:
            raise OverflowError(f"more than {self.spec.max_live_requests} requests in flight")
        self._live[request.request_id] = _Live(
            request,
            instance,
            decision.predicted_tokens,
            route,
            predicted_ttft_s=decision.predicted_ttft_s,
            sent=now,
        )
        self.stats.dispatched(instance, str(decision.branch))
        self._reschedule(instance)

    # ------------------------------------------------------------------ prefill/decode disaggregation

    def _arrive_pd(self, request: SimRequest, route: RouteRequest, pd: PdSpec, now: float) -> None:
        prefill, decode = self._pd_names
        choice = self.router.route_pd(
            route, prefill, decode, now, skip_prefill_tokens=pd.skip_prefill_tokens, policy=self.policy,
            decode_policy=pd.decode_policy,
        )  # fmt: skip
        self._judge(request, choice, pd)
        if choice.prefill is None:
            self.pd_stats.skipped[str(choice.skipped)] += 1
            self.router.dispatched(route, choice.decode, now)
            self._run(request, route, choice.decode, now)
            return
        self._start_prefill(request, route, choice, choice.prefill, now)

    def _judge(self, request: SimRequest, choice: PdDecision, pd: PdSpec) -> None:
        """The decider against the engines' truth: did the decode engine hold the prompt, did anyone?"""
        blocks, prompt = request.engine.blocks, request.engine.prompt_tokens
        engine = self.engines[self.index[choice.decode.worker]]
        held = engine.cache.match(blocks) * engine.block_tokens
        cold = not blocks or all(e.cache.match(blocks[:1]) == 0 for e in self.engines)
        held_all = held > 0 and prompt - held <= pd.skip_prefill_tokens
        self.pd_stats.judged(held_all, cold, choice.prefill is None and choice.skipped is not None)

    def _start_prefill(
        self, request: SimRequest, route: RouteRequest, choice: PdDecision, prefill: Decision, now: float
    ) -> None:
        rid = request.request_id + PREFILL_SUFFIX
        stage_route = dataclasses.replace(route, route_id=rid)
        self.router.dispatched(stage_route, prefill, now)
        stage = Stage(request, route, stage_route, self.index[prefill.worker],
                      self.index[choice.decode.worker], choice.decode)  # fmt: skip
        engine_request = dataclasses.replace(request.engine, request_id=rid, output_tokens=1, extension=())
        try:
            self.engines[stage.prefill].submit(engine_request, now)
        except RequestRejected:  # served colocated on its decode worker
            self.router.finished(stage_route, prefill.worker, Outcome(ok=False), now)
            self.router.dispatched(route, choice.decode, now)
            self._run(request, route, choice.decode, now)
            return
        self._dispatch_decode(stage, now)  # charged at the choice, as the edge does (proxy/edge/pd.py)
        self._stages[rid] = stage
        self.pd_stats.prefills += 1
        self.stats.dispatched(stage.prefill, "prefill")
        self._reschedule(stage.prefill)

    def _on_prefill_done(self, stage: Stage, event: EngineEvent) -> None:
        """The prefill engine has computed the prompt: its KV cache moves to the decode engine (its stage
        dispatched to the router at the choice), which starts the request once it has arrived."""
        request = stage.request
        prompt = request.engine.prompt_tokens
        outcome = Outcome(True, event.cached_tokens, (), prompt)
        self.router.finished(stage.prefill_route, self.names[stage.prefill], outcome, event.time)
        self.pd_stats.prefill_prompt_tokens += prompt
        self.pd_stats.prefill_cached_tokens += event.cached_tokens
        decode = self.engines[stage.decode]
        blocks = request.engine.blocks
        moving = (len(blocks) - decode.cache.match(blocks)) * decode.block_tokens
        delay = decode.transfer_time(moving)
        self.pd_stats.transferred_tokens += moving
        self.pd_stats.transfer_s += delay
        self.queue.push(event.time + delay, KvHandoff(stage))

    def _dispatch_decode(self, stage: Stage, now: float) -> None:
        """The decode stage to the router, its prompt predicted handed over (``Router.handed_over``)."""
        stage.decode_decision = self.router.handed_over(stage.route, stage.decode_decision)
        self.router.dispatched(stage.route, stage.decode_decision, now)

    def on_handoff(self, stage: Stage, now: float) -> None:
        self.engines[stage.decode].load(stage.request.engine.blocks)
        self.router.sent(stage.route.route_id, now)
        self._run(stage.request, stage.route, stage.decode_decision, now)

    def _failed(self, request: SimRequest, worker: str, now: float) -> None:
        self.router.finished(request.route, worker, Outcome(ok=False), now)
        if self.decisions is not None:
            self.decisions.finished(request.request_id, 503, None, None)
        self.stats.errors += 1
        self._follow(request, now, ok=False)
        self._tick()

    def on_engine_step(self, instance: int, version: int, now: float) -> None:
        if version != self._versions[instance]:
            return
        self._scheduled[instance] = None
        for event in self.engines[instance].advance():
            stage = self._stages.pop(event.request_id, None) if event.kind == "finished" else None
            if stage is not None:
                self._on_prefill_done(stage, event)
            elif event.request_id.endswith(PREFILL_SUFFIX):
                self.router.first_token(event.request_id, event.time)
            elif event.kind == "first_token":
                self._on_first_token(event)
            else:
                self._on_finished(event)
        self._reschedule(instance)

    def on_scrape(self, now: float) -> None:
        for name, engine in zip(self.names, self.engines, strict=True):
            self.router.set_engine_load(name, engine.num_waiting, engine.kv_usage, now)
        if self._live or self._upcoming is not None:
            self.queue.push(now + self.spec.scrape_interval_s, MetricsScrape())

    def on_fault(self, fault: Fault, now: float) -> None:
        """A restart (a new engine process: its event sequence starts again, and it announces nothing
        until its first event) or a cache reset (announced: ``AllBlocksCleared``); either way the
        engine's cached blocks no request holds are gone."""
        engine = self.engines[fault.instance]
        if fault.kind == "restart" and self.feed is not None:
            self.feed.restart(fault.instance, engine.reset_prefix_cache)
        else:
            engine.reset_prefix_cache()

    # ------------------------------------------------------------------ engine events

    def _on_first_token(self, event: EngineEvent) -> None:
        live = self._live[event.request_id]
        live.first_token = event.time
        self.stats.first_token(live.predicted_ttft_s, event.time - live.sent)
        self.router.first_token(event.request_id, event.time)
        if self.decisions is not None:
            self.decisions.first_token(event.request_id, event.time - live.request.arrival)

    def _on_finished(self, event: EngineEvent) -> None:
        live = self._live.pop(event.request_id)
        request = live.request
        outcome = Outcome(True, event.cached_tokens, request.extension_blocks, request.engine.prompt_tokens)
        if self.feed is not None:
            outcome = dataclasses.replace(
                outcome, precise_extension_blocks=self.feed.extension(request.engine)
            )
        self.router.finished(live.route, self.names[live.instance], outcome, event.time)
        self.records.append(Record(request.arrival, live.instance, live.predicted, event.cached_tokens))
        if self.decisions is not None:
            self.decisions.finished(
                request.request_id, 200, event.cached_tokens, request.engine.prompt_tokens
            )
        first = live.first_token if live.first_token is not None else event.time
        self.stats.finished(
            request.arrival,
            first,
            event.time,
            request.engine.prompt_tokens,
            event.cached_tokens,
            live.predicted,
            event.generated,
            event.queued_s,
        )
        self._follow(request, event.time, ok=True)
        self._tick()

    def _follow(self, request: SimRequest, now: float, ok: bool) -> None:
        for follow in self.source.followups(request, now, ok):
            self.queue.push(follow.arrival, RequestArrival(follow))

    def _tick(self) -> None:
        self._unreported += 1
        self._unsampled += 1
        if self._unreported >= PROGRESS_EVERY:
            self._report_progress()
        if self._unsampled >= SAMPLE_EVERY:
            self._sample_replication()

    def _sample_replication(self) -> None:
        """Cached block copies across the engines per distinct cached block (1.0: no duplicates)."""
        self._unsampled = 0
        views = [engine.cache.resident() for engine in self.engines]
        copies = sum(len(v) for v in views)
        if copies:
            self.stats.replication.append(copies / len(set().union(*views)))

    def _report_progress(self) -> None:
        if self._progress is not None and self._unreported:
            self._progress(self._unreported)
        self._unreported = 0

    def _reschedule(self, instance: int) -> None:
        end = self.engines[instance].next_time()
        if end == self._scheduled[instance]:
            return
        self._scheduled[instance] = end
        if end is not None:
            self._versions[instance] += 1
            self.queue.push(end, EngineStepEnd(instance, self._versions[instance]))
