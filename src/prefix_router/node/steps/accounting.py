"""Bookkeeping of one attempt on one worker: the routing core's lifecycle calls (which keep the one
in-flight count, ``Router.load``), metrics and the trace record. Every attempt, routed or pass-through,
is dispatched and finished exactly once, whatever happens.

The first byte of a successful (2xx) response is the request's first token for the routing core: the
engine has computed the whole prompt, so a failure or a client abort after it keeps the prompt's blocks
in the index; only a failure before it (no answer, a 4xx/5xx, a cut before any byte) trims them.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from prefix_router.node.request.access import RequestNote, log_access
from prefix_router.node.request.auth import tenant_of
from prefix_router.node.request.parse import Parsed
from prefix_router.node.request.sse import ReplyAccumulator
from prefix_router.node.state import NodeState
from prefix_router.node.telemetry.decisions import closed
from prefix_router.node.upstream.seam import FailureKind
from prefix_router.pool import EngineAdapter, Worker, count, dig, openai_cached_tokens
from prefix_router.routing import Decision, Outcome, RouteRequest

log = logging.getLogger(__name__)
CLIENT_GONE = 499  # the client disconnected (nginx's convention), for metrics only


class Flight:
    """One attempt: counted in flight by the routing core from dispatch until ``finish``. ``parsed`` is
    None for a pass-through call (``req`` then has no blocks)."""

    __slots__ = ("_done", "_state", "decision", "parsed", "req", "started", "worker")

    def __init__(
        self,
        state: NodeState,
        worker: Worker,
        req: RouteRequest,
        decision: Decision,
        parsed: Parsed | None,
        started: float,
    ) -> None:
        self._state = state
        self.worker = worker
        self.req = req
        self.decision = decision
        self.parsed = parsed
        self.started = started
        self._done = False
        state.router.dispatched(req, decision, state.clock())
        if state.after_dispatch is not None:
            state.after_dispatch()  # the placement, to the other processes before the engine has it

    def first_byte(self, status: int) -> float:
        """The response's status and first bytes arrived (a 2xx: the engine's first token); returns the
        time to it (seconds since the request arrived)."""
        now = self._state.clock()
        ttft = now - self.started
        self._state.metrics.ttft.observe(ttft)
        if 200 <= status < 300:
            self._state.router.first_token(self.req.route_id, now)
        return ttft

    def fail(self, kind: FailureKind, status: int, error: str) -> None:
        """The attempt failed before anything reached the client."""
        self._state.metrics.upstream_errors.inc((self.worker.name, kind))
        if kind == FailureKind.CONNECT and self._state.pool.get(self.worker.name) is self.worker:
            self._state.pool.report(self.worker, False, error)  # passive health check
        self.finish(status, Outcome(ok=False))

    def release(self) -> None:
        """Given back before it was sent (a decode stage reserved at the two-stage choice that does not
        run as reserved): the routing core forgets it; no attempt is counted."""
        if self._done:
            return
        self._done = True
        self._state.router.finished(self.req, self.worker.name, Outcome(ok=False), self._state.clock())

    def finish(self, status: int, outcome: Outcome) -> None:
        if self._done:
            return
        self._done = True
        state, now = self._state, self._state.clock()
        state.router.finished(self.req, self.worker.name, outcome, now)  # also if it left meanwhile
        state.metrics.attempt_done(self.worker.name, status)
        state.metrics.latency.observe(now - self.started)


def settle(state: NodeState, flight: Flight, reply: ReplyAccumulator, status: int, ok: bool) -> None:
    """Finish a flight whose response reached the client, learning what the engine cached (routed
    requests only: a pass-through call teaches the index nothing)."""
    parsed = flight.parsed
    if parsed is None:
        flight.finish(status, Outcome(ok=ok))
        return
    usage = reply.usage_body
    cached = cached_tokens(usage, flight.worker.adapter)
    prompt = None if usage is None else count(dig(usage, "usage", "prompt_tokens"))
    generated = reply.generated() if ok else None
    extension = extension_blocks(state, parsed, generated)
    precise = precise_extension(state, parsed, generated)
    flight.finish(status, Outcome(ok, cached, extension, prompt, precise))  # the router judges the report
    state.decisions.reported(parsed.req.route_id, cached, prompt)
    if state.recorder is not None:
        state.recorder.record(parsed.req, output_tokens(reply, state.config.routing.keys.chars_per_token))


def cached_tokens(body: dict[str, Any] | None, adapter: EngineAdapter | None) -> int | None:
    if body is None:
        return None
    found = openai_cached_tokens(body)
    if found is None and adapter is not None:
        found = adapter.cached_tokens(body)
    return found


def extension_blocks(state: NodeState, parsed: Parsed, generated: dict[str, Any] | None) -> tuple[int, ...]:
    if generated is None:
        return ()
    try:
        return state.router.keys.extend(
            parsed.req, parsed.endpoint, parsed.body, generated, tenant=parsed.tenant
        )
    except Exception as exc:  # learning is best effort; never fail a served request
        log.debug("extension blocks failed: %s", type(exc).__name__)
        return ()


def precise_extension(state: NodeState, parsed: Parsed, generated: dict[str, Any] | None) -> tuple[int, ...]:
    """The reply's blocks as the next turn carries them, in precise keys (exact mode only)."""
    if generated is None or not parsed.req.precise_blocks:
        return ()
    try:
        return state.router.keys.precise_extension(
            parsed.req,
            parsed.endpoint,
            parsed.body,
            generated,
            tenant=parsed.tenant,
            engine_salt=parsed.engine_salt,
        )
    except Exception as exc:  # learning is best effort; never fail a served request
        log.debug("precise extension failed: %s", type(exc).__name__)
        return ()


def output_tokens(reply: ReplyAccumulator, chars_per_token: float) -> int:
    reported = dig(reply.usage_body or {}, "usage", "completion_tokens")
    if isinstance(reported, int) and not isinstance(reported, bool) and reported >= 0:
        return reported
    return round(reply.chars / chars_per_token)


def traced(state: NodeState, note: RequestNote, headers: Mapping[str, str]) -> None:
    """The request's span opened on ``note`` when tracing is on (``telemetry.tracing``); nothing when off."""
    tracing = state.tracing
    if tracing is not None:
        note.trace = tracing.start(headers, note.method, note.path, note.request_id, tenant_of(headers))


def request_closed(state: NodeState, note: RequestNote, status: int) -> None:
    """The request is over with ``status`` (the one the client got, ``CLIENT_GONE`` when it left): count
    it once (``prefix_router_requests_total``), its decision's outcome (the feed, the predicted first-token
    time against the observed), log it (``access_log``) and end its span (if traced)."""
    state.metrics.request_done(note.worker, note.model, note.policy, status)
    entry = note.decision
    if entry is not None:  # a routed request: its decision's outcome, its prediction judged
        closed(entry, note.ttft_s, status)
        if entry.predicted_ttft_s is not None and note.ttft_s is not None and 200 <= status < 300:
            state.metrics.ttft_predicted(entry.worker, entry.predicted_ttft_s, note.ttft_s)
    if state.request_config.access_log:
        log_access(note, status, state.clock(), state.log_handler)
    trace = note.trace
    if trace is not None:
        note.trace = None
        trace.end(status, note.model)
