"""How a request is placed: the whole decision of ``Router.route``, as an ordered pipeline of named steps.

A policy (``routing/policies/``) makes one step of the decision: it picks a worker. ``STEPS`` lists every
step, in the order ``Pipeline.place`` runs them over one ``Placement`` (the request's working state); each
step states its contract (what it reads, what it may decide or change, its knobs) and says whether it
applied (its precondition held). A step that does not apply changes nothing: the next one falls back.

1. ``match``: the prefix index's matched leading blocks per worker.
2. ``steer``: (precise keys, event-fed workers) a fresh event-fed worker's match becomes its engine's
   view's; else the index's match stands.
3. ``load``: the candidates' load snapshots.
4. ``stick``: (a policy that honours sessions) the session's last worker under the sessions' load cap;
   else no decision yet.
5. ``home``: (no decision yet, ``steer`` applied, a policy that honours sessions) a prefix held nowhere
   goes back to its engine's last home under the homes' load cap; else no decision yet.
6. ``estimate``: the prompt's engine tokens (``routing/units.py``) and the policy's token scale.
7. ``select``: (no decision yet) the policy picks a worker and names its branch.
8. ``confirmed``: (the worker is a fresh event-fed one) the prediction is the blocks its engine confirmed,
   the load charged with those and the ones speculated there; ``value`` and ``round`` then do nothing.
9. ``value``: the prediction is the index's match on the worker, valued in engine tokens (units).
10. ``round``: (the worker's engine block size is known) the prediction rounded down to whole engine
    blocks of the prompt less its last token.

The result is one ``Decision``: the worker and branch of ``stick``, ``home`` or ``select``, the matched
blocks, the predicted and estimated prompt engine tokens and, after ``confirmed``, the cached tokens the
load is charged with. The steps draw from the rng only inside the policy, so a decision and its draws
depend on the request, the candidates, the time and the router's state alone.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from prefix_router.routing.bounded import BoundedLRU
from prefix_router.routing.index import PrefixIndex
from prefix_router.routing.load import LoadTracker
from prefix_router.routing.policies.base import load_cap, under_cap
from prefix_router.routing.precise import PreciseMatch, PreciseView
from prefix_router.routing.settings import RoutingSettings
from prefix_router.routing.types import (
    Branch,
    Context,
    Decision,
    LatencyView,
    Policy,
    RouteRequest,
    WorkerSnapshot,
)
from prefix_router.routing.units import TokenUnits, count_prefix

__all__ = ["STEPS", "Pipeline", "Placement", "Step", "prompt_value"]


@dataclass(init=False, slots=True)  # a written __init__, compiled: see routing/types.py
class Placement:
    """One request's working state while the steps run: its inputs (the request, the candidates, the time,
    the router's settings and rng, the policy and whether it honours sessions), what the steps found
    (``matches``, ``precise``, ``snaps``, ``prompt``, ``scale``), the worker's ``chosen`` decision (by
    ``stick``, ``home`` or ``select``) and the prediction's parts (``matched``, ``predicted``,
    ``estimated``, ``expected``; ``by_events``: predicted by ``confirmed``). Made per request, never
    kept. What a step that always applies sets is unset before it (read earlier: AttributeError)."""

    req: RouteRequest
    candidates: Sequence[str]
    now: float
    cfg: RoutingSettings
    rng: random.Random
    policy: Policy
    honours_sessions: bool
    matches: dict[str, int]  # by ``match``
    precise: PreciseMatch | None
    snaps: Sequence[WorkerSnapshot]  # by ``load``
    prompt: float  # by ``estimate``
    scale: float  # by ``estimate``
    chosen: Decision | None
    matched: int  # by ``confirmed`` or ``value``
    predicted: int  # by ``confirmed`` or ``value``
    estimated: int  # by ``confirmed`` or ``value``
    expected: int | None
    by_events: bool

    def __init__(
        self,
        req: RouteRequest,
        candidates: Sequence[str],
        now: float,
        cfg: RoutingSettings,
        rng: random.Random,
        policy: Policy,
        honours_sessions: bool,
    ) -> None:
        self.req = req
        self.candidates = candidates
        self.now = now
        self.cfg = cfg
        self.rng = rng
        self.policy = policy
        self.honours_sessions = honours_sessions
        self.precise = None
        self.chosen = None
        self.expected = None
        self.by_events = False


class Pipeline:
    """Runs ``STEPS`` in order over each request, on the router's parts (its prefix index, event-fed view,
    load tracker, token units, session table, engine block sizes and first-token models: shared, never
    copied). The steps
    record nothing there: what a decision changes is the parts' own upkeep on a read (the view expires
    speculative entries, the load tracker stale ones); the router records the dispatch. ``trace``: when
    a list, each applied step's name is appended to it (for tests and debugging; None, the default,
    records nothing)."""

    def __init__(
        self,
        index: PrefixIndex,
        view: PreciseView,
        load: LoadTracker,
        units: TokenUnits,
        sessions: BoundedLRU[str, str],
        engine_blocks: dict[str, int],
        latency: LatencyView | None = None,
    ) -> None:
        self.index = index
        self.view = view
        self.load = load
        self.units = units
        self.sessions = sessions
        self.engine_blocks = engine_blocks
        self.latency = latency
        self.steps = STEPS
        self.trace: list[str] | None = None

    def place(
        self,
        req: RouteRequest,
        candidates: Sequence[str],
        now: float,
        cfg: RoutingSettings,
        rng: random.Random,
        policy: Policy,
        honours_sessions: bool,
    ) -> Decision:
        """``req`` placed on one of ``candidates`` (not empty) by ``policy``: every step in order."""
        p = Placement(req, candidates, now, cfg, rng, policy, honours_sessions)
        trace = self.trace
        for step in self.steps:
            if step.run(self, p) and trace is not None:
                trace.append(step.name)
        chosen = p.chosen
        if chosen is None:  # ``select`` applies whenever no step before it chose
            raise RuntimeError("no step chose a worker")
        out = Decision(chosen.worker, chosen.branch, p.matched, p.predicted, p.estimated, p.expected)
        out.predicted_ttft_s, out.estimates = chosen.predicted_ttft_s, chosen.estimates
        return out

    def index_blocks(self, req: RouteRequest, precise_blocks: int, block_tokens: int) -> int:
        """``precise_blocks`` of the engines' ``block_tokens`` in the index's blocks of ``req``."""
        return min(len(req.blocks), precise_blocks * block_tokens // self.index.block_tokens)


class Step:
    """One step: ``run`` reads the pipeline's parts and the placement, changes only what its docstring
    names, and returns whether it applied (its precondition held)."""

    name: ClassVar[str] = "step"

    def run(self, pipe: Pipeline, p: Placement) -> bool:
        raise NotImplementedError


class Match(Step):
    """Reads ``req.blocks``; sets ``matches``: the prefix index's matched leading blocks per worker (a
    worker without a match absent). Always applies."""

    name = "match"

    def run(self, pipe: Pipeline, p: Placement) -> bool:
        p.matches = pipe.index.match(p.req.blocks)
        return True


class Steer(Step):
    """Applies when the request has precise keys (``req.precise_blocks``) and some worker publishes KV
    cache events. Sets ``precise``: the event-fed view's match (its fresh workers, their blocks held
    confirmed or speculatively, and confirmed only; the view's expired speculative entries go first).
    Replaces in ``matches`` each fresh event-fed worker's match by its view's (confirmed or speculative,
    in the index's blocks), or drops it. Knob: ``routing.events.block_tokens``."""

    name = "steer"

    def run(self, pipe: Pipeline, p: Placement) -> bool:
        req = p.req
        if not req.precise_blocks or not pipe.view:
            return False
        precise = p.precise = pipe.view.match(req.precise_blocks, p.now)
        matches = p.matches = dict(p.matches)
        block = p.cfg.events.block_tokens
        for worker in precise.fresh:
            blocks = pipe.index_blocks(req, precise.steered.get(worker, 0), block)
            if blocks:
                matches[worker] = blocks
            else:
                matches.pop(worker, None)
        return True


class Load(Step):
    """Sets ``snaps``: the load of each candidate (live read-only views: in flight, decoding, pending
    prefill, prefill backlog, scraped engine load). Always applies."""

    name = "load"

    def run(self, pipe: Pipeline, p: Placement) -> bool:
        p.snaps = pipe.load.snapshots(p.candidates, p.now)
        return True


class Stick(Step):
    """Applies when the policy honours sessions, affinity is on, the request names a session and that
    session's last worker is a candidate under the sessions' load cap: ``chosen`` is that worker, branch
    ``session``. Knobs: ``routing.sessions.affinity``, ``load_factor``, ``load_slack``."""

    name = "stick"

    def run(self, pipe: Pipeline, p: Placement) -> bool:
        if not p.honours_sessions:
            return False
        sessions, session = p.cfg.sessions, p.req.session
        if not (sessions.affinity and session):
            return False
        snap = _candidate(p.snaps, pipe.sessions.get(session))
        if snap is None or not under_cap(snap, load_cap(p.snaps, sessions.load_factor, sessions.load_slack)):
            return False
        p.chosen = Decision(snap.name, Branch.SESSION)
        return True


class Home(Step):
    """Applies when no worker is chosen yet, the policy honours sessions and ``steer`` applied, the
    request's next block past the deepest fresh event-fed match has a last home (``PreciseView.home``)
    that is fresh, holds as much of the request as any fresh worker, is a candidate and is under the
    homes' load cap: ``chosen`` is that worker, branch ``home``. Without it a prefix evicted everywhere is
    placed by load alone and may land where it evicts another tenant's, which then moves in turn. Knobs:
    ``routing.sessions.load_factor``, ``load_slack`` (the sessions' cap)."""

    name = "home"

    def run(self, pipe: Pipeline, p: Placement) -> bool:
        precise = p.precise
        if p.chosen is not None or precise is None or not p.honours_sessions:
            return False
        blocks = p.req.precise_blocks
        depth = max(precise.steered.values(), default=0)
        if depth >= len(blocks):
            return False
        worker = pipe.view.home(blocks[depth])
        if worker is None or worker not in precise.fresh or precise.steered.get(worker, 0) < depth:
            return False
        snap = _candidate(p.snaps, worker)
        cfg = p.cfg.sessions
        if snap is None or not under_cap(snap, load_cap(p.snaps, cfg.load_factor, cfg.load_slack)):
            return False
        p.chosen = Decision(snap.name, Branch.HOME)
        return True


class Estimate(Step):
    """Sets ``prompt``: the prompt's engine tokens (``prompt_value``), and ``scale``: the engine tokens per
    key token that the policy's cost multiplies by (``Context.token_scale``; 1 for token ids). Always
    applies."""

    name = "estimate"

    def run(self, pipe: Pipeline, p: Placement) -> bool:
        req = p.req
        p.prompt = prompt = prompt_value(pipe.units, req)
        p.scale = prompt / req.key_tokens if req.text_model is not None and req.key_tokens else 1.0
        return True


class Select(Step):
    """Applies when no worker is chosen yet: ``chosen`` is the policy's decision over ``snaps``, with a
    ``Context`` of the time, the rng, ``matches``, the index's fills, the mean request's prefill work,
    ``scale`` and the workers' first-token models. The only step that draws from the rng. Knob:
    ``routing.trackers.attention_tokens``."""

    name = "select"

    def run(self, pipe: Pipeline, p: Placement) -> bool:
        if p.chosen is not None:
            return False
        index, attention = pipe.index, p.cfg.trackers.attention_tokens
        work = pipe.load.backlog.mean_work
        ctx = Context(p.now, p.rng, p.matches, index, work, attention, p.scale, index.fills, pipe.latency)
        p.chosen = p.policy.select(p.req, p.snaps, ctx)
        return True


class Confirmed(Step):
    """Applies when the chosen worker is a fresh event-fed one: ``predicted`` is the tokens of the blocks
    its engine confirmed (at most the prompt's), ``matched`` those in the index's blocks, ``estimated``
    the exact prompt length and ``expected`` the tokens of the blocks held confirmed or speculatively
    (what the load's prefill is charged with); sets ``by_events``. Knob: ``routing.events.block_tokens``."""

    name = "confirmed"

    def run(self, pipe: Pipeline, p: Placement) -> bool:
        precise, chosen = p.precise, p.chosen
        if precise is None or chosen is None or chosen.worker not in precise.fresh:
            return False
        req, worker, block = p.req, chosen.worker, p.cfg.events.block_tokens
        depth = precise.confirmed.get(worker, 0)
        p.predicted = tokens = min(depth * block, req.precise_tokens)
        p.matched = pipe.index_blocks(req, depth, block)
        p.estimated = req.precise_tokens
        p.expected = max(tokens, min(precise.steered.get(worker, 0) * block, req.precise_tokens))
        p.by_events = True
        return True


class Value(Step):
    """Applies unless ``confirmed`` did: ``matched`` is the chosen worker's match, ``predicted`` the engine
    tokens of those blocks (``match_value``) and ``estimated`` the prompt's engine tokens, rounded up."""

    name = "value"

    def run(self, pipe: Pipeline, p: Placement) -> bool:
        chosen = p.chosen
        if p.by_events or chosen is None:
            return False
        p.matched = matched = p.matches.get(chosen.worker, 0)
        chars = p.cfg.keys.block_chars
        p.predicted = match_value(pipe.units, p.req, matched, p.prompt, pipe.index.block_tokens, chars)
        p.estimated = math.ceil(p.prompt)
        return True


class Round(Step):
    """Applies unless ``confirmed`` did, once the chosen worker's engine states its KV block size
    (``Router.set_engine_block``) and something is predicted: an engine that caches whole blocks and
    computes the prompt's last token serves at most the whole blocks of the first prompt - 1 tokens, so
    ``predicted`` is rounded down to them."""

    name = "round"

    def run(self, pipe: Pipeline, p: Placement) -> bool:
        chosen = p.chosen
        if p.by_events or chosen is None:
            return False
        size = pipe.engine_blocks.get(chosen.worker)
        if not size or p.predicted <= 0:
            return False
        limit = min(p.predicted, math.ceil(p.prompt) - 1)
        p.predicted = max(0, limit - limit % size)
        return True


STEPS: tuple[Step, ...] = (
    Match(),
    Steer(),
    Load(),
    Stick(),
    Home(),
    Estimate(),
    Select(),
    Confirmed(),
    Value(),
    Round(),
)
"""The pipeline, in the order it runs (the module's docstring lists it with each step's fallback)."""


def prompt_value(units: TokenUnits, req: RouteRequest) -> float:
    """The engine tokens of ``req``'s prompt: a text key's valued by its model's units, else its length."""
    if req.text_model is None:
        return float(req.key_tokens)
    return units.tokens(req.text_model, req.counts[-1] if req.counts else None, req.key_tokens)


def match_value(
    units: TokenUnits, req: RouteRequest, matched: int, prompt: float, block_tokens: int, block_chars: int
) -> int:
    """The engine tokens of ``req``'s first ``matched`` blocks (the index's, of ``block_tokens`` tokens and
    ``block_chars`` characters): a text key's by the content of those blocks once its model's value is
    learned, else nominal x the scale (before the model's first report, x the conservative prior
    ``TokenUnits.first``); at most ``prompt``."""
    nominal = min(matched * block_tokens, req.key_tokens)
    if not matched or req.text_model is None:
        return nominal
    first = units.first(req.text_model)
    if first < 1.0:
        return int(min(units.tokens(req.text_model, None, nominal) * first, prompt))
    counts = req.counts[-1] if req.counts else None
    if counts is not None and units.by_content(req.text_model):
        size = matched * block_chars
        if size >= len(req.text):  # the whole key: valued by the same counts as the prompt
            return int(prompt)
        counts = count_prefix(req.text, size, req.counts)
    return int(min(units.tokens(req.text_model, counts, nominal), prompt))


def _candidate(snaps: Sequence[WorkerSnapshot], worker: str | None) -> WorkerSnapshot | None:
    """The snapshot of ``worker`` among the candidates' (None: not a candidate, or no worker)."""
    return next((s for s in snaps if s.name == worker), None)
