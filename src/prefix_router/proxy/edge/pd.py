"""Prefill/decode disaggregation on the HTTP edge: one client request as two upstream stages, the client
seeing one OpenAI answer (the decode worker's, relayed as a colocated answer is: streaming, tools, ``n``,
usage and the request id unchanged). The bodies are ``node/request/handoff.py``'s, one pair per
``disaggregation.flow``; the choice is ``Router.route_pd`` (``routing/pd.py``).

Sequential flows (``shared_storage``, ``kv_transfer_params``): the prefill stage runs first and is read
whole; each prefill attempt may use at most ``PREFILL_SHARE`` of what is left of the first-byte budget, so
that a stuck one leaves time for another prefill worker and then for the decode; a prefill that fails or
times out is retried on another prefill worker (up to ``retries.max_attempts``), then the request is served
colocated on its decode worker (``prefill_failed``). The decode stage is the exchange's usual opening, with
its retries (on the other decode workers) before the first byte. ``sglang_bootstrap``: each decode attempt
is paired with a prefill sent at the same time (a fresh ``bootstrap_room``); a prefill that fails before the
decode answers cancels that decode attempt and the pair is tried again with another prefill worker, then
colocated.

The decode stage is charged to its worker at the two-stage choice (sequential flows: ``reserve``, the
prompt predicted handed over, ``Router.handed_over``), so that the requests arriving while the prefill runs
see it coming instead of herding onto the decode worker that looks idle (the simulator's study:
docs/simulator.md). The first decode attempt takes the reservation (``take``); when the prefill failed the
reservation is released and the decode charged anew with its own prefill; whatever else ends the opening
(the client gone, no worker left, the decode worker removed) releases it, so nothing stays counted.

Faults: a client that leaves cancels whatever stage runs (the handler's task is cancelled; a concurrent
prefill is cancelled with it); every stage is bounded by the request's deadlines. The index learns both
sides: the prefill stage is dispatched on its worker (which holds the prefix after it), the decode stage
on its own (which holds it too once its connector loaded it).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from typing import TYPE_CHECKING, Any

import orjson

from prefix_router.node import (
    CLIENT_GONE,
    FailureKind,
    Flight,
    UpstreamError,
    UpstreamRequest,
    UpstreamResponse,
    bootstrap_fields,
    cached_tokens,
    nobody,
    note_choice,
    prefill_body,
    returned_params,
    upstream_headers,
    upstream_url,
)
from prefix_router.pool import Worker, count, dig
from prefix_router.routing import Decision, Outcome, PdDecision, SkipReason

if TYPE_CHECKING:
    from prefix_router.proxy.edge.exchange import Exchange, Failed, Opened

log = logging.getLogger(__name__)
PREFILL_SHARE = 0.5  # of the first-byte budget left, the most one prefill attempt may use
SPLIT = "split"  # a request that ran both stages (the ``mode`` label beside the skip reasons)
MAX_PREFILL_ANSWER = 1 << 20  # a prefill's answer (one token) read at most


class Disaggregation:
    """The stages of one disaggregated exchange: its decision, the prefill attempts, and what the decode
    body carries (``decode_fields``)."""

    def __init__(
        self, ex: Exchange, pd: PdDecision, prefill_names: list[str], decode_names: list[str]
    ) -> None:
        self.ex = ex
        self.pd = pd
        self.flow = ex.state.config.disaggregation.flow
        self.prefill_names = prefill_names
        # the decode stage's workers (its retries among them): the prefill workers when none can decode
        self.decode_names = frozenset(decode_names or prefill_names)
        self.prefill_req = dataclasses.replace(ex.req, route_id=ex.req.route_id + "/prefill", session=None)
        self.prefill_worker: Worker | None = None  # the last prefill stage's worker
        self.prefill_excluded: set[str] = set()
        self.prefill_decision: Decision | None = pd.prefill
        self.skipped: SkipReason | None = pd.skipped
        self.decode_fields: dict[str, Any] | None = None
        self.tasks: set[asyncio.Task[bool]] = set()  # concurrent prefills (SGLang) still running
        self.prefill_done_at: float | None = None
        self.reserved: Flight | None = None  # the decode stage, charged at the choice until it is sent

    @property
    def concurrent(self) -> bool:
        return self.flow == "sglang_bootstrap" and self.skipped is None

    # ------------------------------------------------------------------ the decode's reservation

    def reserve(self, decision: Decision) -> None:
        """Charge the decode stage to ``decision``'s worker now, while the prefill runs."""
        ex = self.ex
        worker = ex.state.pool.require(decision.worker)
        self.reserved = Flight(ex.state, worker, ex.req, decision, ex.parsed, ex.started)

    def take(self, worker: Worker) -> Flight | None:
        """The reservation, for the decode attempt on its worker (then sent: its first-token time runs
        from here); None for another worker, or once taken."""
        flight = self.reserved
        if flight is None or flight.worker is not worker:
            return None
        self.reserved = None
        self.ex.state.router.sent(flight.req.route_id, self.ex.state.clock())
        return flight

    def release(self) -> None:
        """Give the reservation back unsent (idempotent)."""
        flight, self.reserved = self.reserved, None
        if flight is not None:
            flight.release()

    # ------------------------------------------------------------------ the sequential prefill stage

    async def prefill_stage(self) -> None:
        """Run the prefill (retried on other prefill workers), leaving what the decode carries in
        ``decode_fields``; all failed: the request goes colocated (``skipped``)."""
        parsed = self.ex.parsed
        assert parsed is not None  # a disaggregated exchange is a routed one
        for attempt in range(self.ex.state.request_config.max_attempts):
            decision = self.next_prefill(attempt)
            if decision is None:
                break
            salt = self.ex.salt_fields(self.ex.state.pool.require(decision.worker))
            answer = await self.prefill_once(decision, prefill_body(parsed.body, parsed.raw, self.flow, salt))
            if answer is None:
                continue
            if self.flow == "kv_transfer_params":
                params = returned_params(answer)
                if params is None:  # the decode computes the prompt itself
                    log.info("prefill on %s returned no kv_transfer_params", decision.worker)
                else:
                    self.decode_fields = {"kv_transfer_params": params}
            return
        self.skipped = SkipReason.PREFILL_FAILED

    def next_prefill(self, attempt: int) -> Decision | None:
        """The prefill decision of ``attempt``: the routing core's first, then a choice among the prefill
        workers not tried yet, while the first-byte budget lasts."""
        ex = self.ex
        if attempt == 0:
            return self.prefill_decision
        if ex.loop.time() >= ex.first_byte_deadline or ex.state.deadlines.stopping:
            return None
        names = [n for n in ex.eligible(set()) if n in self.prefill_set() and n not in self.prefill_excluded]
        if not names:
            return None
        ex.state.metrics.retries.inc()
        return ex.state.router.route(self.prefill_req, names, ex.state.clock(), ex.policy)

    def prefill_set(self) -> set[str]:
        pool = self.ex.state.pool
        return {w.name for w in pool if w.role == "prefill"}

    async def prefill_once(self, decision: Decision, body: bytes) -> bytes | None:
        """One prefill attempt on ``decision.worker``; its answer's bytes (2xx), None when it failed."""
        ex, state = self.ex, self.ex.state
        worker = state.pool.require(decision.worker)
        self.prefill_worker = worker
        ex.note.prefill_worker = worker.name
        flight = Flight(state, worker, self.prefill_req, decision, ex.parsed, ex.started)
        started = ex.loop.time()
        until = min(ex.first_byte_deadline, started + (ex.first_byte_deadline - started) * PREFILL_SHARE)
        response: UpstreamResponse | None = None
        try:
            async with state.deadlines.watch(worker.name, until):
                response = await state.upstream.send(self.upstream(worker, body))
                answer, complete = await _read_whole(response)
        except (UpstreamError, TimeoutError) as exc:
            kind = exc.kind if isinstance(exc, UpstreamError) else FailureKind.TIMEOUT
            _abort(response)
            flight.fail(kind, 504 if kind == FailureKind.TIMEOUT else 502, str(exc) or "no answer in time")
            self.prefill_excluded.add(worker.name)
            return None
        except BaseException:
            _abort(response)
            flight.finish(CLIENT_GONE, Outcome(ok=False))
            raise
        if not 200 <= response.status < 300 or not complete:
            flight.fail(FailureKind.STATUS, response.status, f"HTTP {response.status}")
            self.prefill_excluded.add(worker.name)
            return None
        self.prefill_finished(flight, answer, started)
        return answer

    def prefill_finished(self, flight: Flight, answer: bytes, started: float) -> None:
        state, now = self.ex.state, self.ex.loop.time()
        state.router.first_token(self.prefill_req.route_id, state.clock())
        usage = _json(answer)
        cached = cached_tokens(usage, flight.worker.adapter)
        prompt = None if usage is None else count(dig(usage, "usage", "prompt_tokens"))
        flight.finish(200, Outcome(True, cached, (), prompt))
        self.ex.note.prefill_s = now - started
        state.metrics.pd_prefill.observe(now - started)
        self.prefill_done_at = now

    def upstream(self, worker: Worker, body: bytes) -> UpstreamRequest:
        ex = self.ex
        config = ex.state.request_config
        headers = upstream_headers(ex.request.headers, worker, config.forward_client_auth, ex.note.request_id)
        return UpstreamRequest("POST", upstream_url(worker, ex.path_qs), headers, body)

    # ------------------------------------------------------------------ SGLang: both stages at once

    async def paired_attempt(self, worker: Worker, decision: Decision) -> Opened | Failed:
        """One decode attempt on ``worker`` with its prefill sent at the same time (SGLang); a prefill
        that fails first cancels the decode, and the pair is tried again with the next prefill worker,
        then colocated."""
        ex = self.ex
        for attempt in range(ex.state.request_config.max_attempts):
            # the routing core's prefill first; a decode retried is paired again with a prefill chosen anew
            prefill = self.prefill_decision if attempt == 0 else None
            prefill = prefill or self.next_prefill(max(attempt, 1))
            if prefill is None:
                break
            self.prefill_decision = None
            outcome = await self.pair(prefill, worker, decision)
            if outcome is not None:
                return outcome
        self.skipped, self.decode_fields = SkipReason.PREFILL_FAILED, None
        return await ex.plain_attempt(worker, decision)

    async def pair(self, prefill: Decision, worker: Worker, decision: Decision) -> Opened | Failed | None:
        """The decode attempt's result, or None when its prefill failed first (the decode cancelled)."""
        ex = self.ex
        p_worker = ex.state.pool.require(prefill.worker)
        fields = bootstrap_fields(p_worker.url, p_worker.bootstrap_port, ex.state.router.rng)
        self.decode_fields = fields
        body = ex.stage_body(fields, p_worker)
        p_task = asyncio.get_running_loop().create_task(self.prefill_ok(prefill, body))
        self.tasks.add(p_task)
        p_task.add_done_callback(self.tasks.discard)
        d_task = asyncio.get_running_loop().create_task(ex.plain_attempt(worker, decision))
        try:
            done, _ = await asyncio.wait({p_task, d_task}, return_when=asyncio.FIRST_COMPLETED)
            if d_task in done or p_task.result():
                return await d_task
        except BaseException:
            p_task.cancel()
            d_task.cancel()
            raise
        d_task.cancel()  # its prefill failed: the decode would wait for a KV cache that never comes
        await asyncio.gather(d_task, return_exceptions=True)
        return None

    async def prefill_ok(self, decision: Decision, body: bytes) -> bool:
        return await self.prefill_once(decision, body) is not None

    async def close(self) -> None:
        """Cancel the concurrent prefills still running (the decode is over, or the client left)."""
        self.release()
        tasks = list(self.tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    # ------------------------------------------------------------------ accounting

    def mode(self) -> str:
        return SPLIT if self.skipped is None else str(self.skipped)

    def opened(self) -> None:
        """The decode stage's first byte: counted by mode, its time from the prefill's end."""
        ex, state = self.ex, self.ex.state
        ex.note.pd = self.mode()
        state.metrics.pd_requests.inc((self.mode(),))
        since = self.prefill_done_at if self.prefill_done_at is not None else ex.decode_started
        state.metrics.pd_decode_ttft.observe(max(0.0, ex.loop.time() - since))


async def open_disaggregated(ex: Exchange) -> Opened:
    """The exchange's opening in a fleet with prefill workers: the two-stage choice, the prefill stage
    (sequential flows) and the decode stage with its retries."""
    state = ex.state
    names = ex.eligible(set())
    if not names:
        raise nobody(state, ex.model)
    prefill, decode = state.pool.split(names)
    if state.before_route is not None:
        state.before_route()  # the other processes' placements, up to now
    pd = state.router.route_pd(
        ex.req,
        prefill,
        decode,
        state.clock(),
        skip_prefill_tokens=state.config.disaggregation.skip_prefill_tokens,
        policy=ex.policy,
    )
    stages = Disaggregation(ex, pd, prefill, decode)
    ex.pd = stages
    decode_decision = pd.decode
    if pd.prefill is not None:  # the prompt's KV cache is to reach the decode worker
        decode_decision = state.router.handed_over(ex.req, pd.decode)
    try:
        if pd.prefill is not None and not stages.concurrent:
            stages.reserve(decode_decision)
            await stages.prefill_stage()
            if stages.skipped is not None:  # every prefill failed: the decode worker prefills itself
                stages.release()
                decode_decision = pd.decode
        ex.decode_started = ex.loop.time()
        note_choice(state, decode_decision, ex.label, ex.note, ex.req)
        worker = state.pool.get(decode_decision.worker)  # None: removed while the prefill ran
        chosen = None if worker is None else decode_decision
        opened = await ex.open_from(worker, chosen, stages.decode_names)
    finally:
        stages.release()  # not taken by a decode attempt: nothing stays counted
    stages.opened()
    return opened


async def _read_whole(response: UpstreamResponse) -> tuple[bytes, bool]:
    parts: list[bytes] = []
    size = 0
    while size <= MAX_PREFILL_ANSWER:
        chunk = await response.next_chunk()
        if not chunk:
            response.release()
            return b"".join(parts), True
        parts.append(chunk)
        size += len(chunk)
    response.abort()
    return b"".join(parts), False


def _json(answer: bytes) -> dict[str, Any] | None:
    try:
        value = orjson.loads(answer)
    except orjson.JSONDecodeError:
        return None
    return value if isinstance(value, dict) else None


def _abort(response: UpstreamResponse | None) -> None:
    if response is not None:
        response.abort()
