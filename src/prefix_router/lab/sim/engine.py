"""The engine model: continuous batching with chunked prefill over a prefix-cached paged KV cache.

Pure and synchronous (no asyncio, no clock): the caller submits requests at times it chooses, asks when
the engine's current work ends (``next_time``) and completes it (``advance``), which returns what became
observable (first tokens, finished requests). Both the real-time HTTP engine (``server``) and the
discrete-event simulator drive this same class.

Scheduling follows vLLM V1: every step decodes one token for each running sequence, then spends what is
left of the token budget on prompt chunks, first for requests already prefilling, then admitting waiting
requests in arrival order while a sequence slot and KV blocks are free (head-of-line blocking). The
first token is sampled by the step that completes a prompt. A request reserves blocks for its whole
prompt and output at admission, so there is no preemption. A stretch of steps with no prefill work is
collapsed into one *span* (its time has a closed form), which keeps the cost per request small; a span
is cut short at the first step boundary after a new arrival or cancellation.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from dataclasses import dataclass, field

from prefix_router.lab.sim.kvcache import PrefixCache
from prefix_router.lab.sim.profiles import EngineProfile
from prefix_router.lab.sim.timing import (
    decode_coefficients,
    decode_span_time,
    prefill_pairs,
    step_time,
    steps_reaching,
    steps_within,
)

WAITING, PREFILL, DECODE, DONE = range(4)


@dataclass(frozen=True, slots=True)
class EngineRequest:
    """One generation request as the engine sees it.

    ``blocks``: chained hashes of the prompt's full cache blocks. ``extension``: chained hashes of the
    full blocks of prompt + generated output (starting with ``blocks``), cached when the request finishes
    (empty when unknown).
    """

    request_id: str
    prompt_tokens: int
    output_tokens: int
    blocks: tuple[int, ...]
    extension: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class EngineEvent:
    """Something observable: ``kind`` is "first_token" or "finished"."""

    kind: str
    request_id: str
    time: float
    cached_tokens: int
    generated: int
    queued_s: float = 0.0  # from submission to admission (waiting for a slot, KV blocks or budget)


class RequestRejected(ValueError):
    """The engine refuses the request (too long for the model or the cache, or queue full)."""


@dataclass(slots=True)
class EngineStats:
    """Counters over the engine's lifetime (the /metrics totals)."""

    prompt_tokens: int = 0
    generation_tokens: int = 0
    prefix_queries: int = 0
    prefix_hits: int = 0
    prefill_computed: int = 0
    finished: int = 0
    cancelled: int = 0
    rejected: int = 0
    steps: int = 0
    busy_s: float = 0.0  # time with a step in progress
    prefill_s: float = 0.0  # time in steps that computed prompt tokens (mixed steps)


@dataclass(slots=True, eq=False)
class _Seq:
    req: EngineRequest
    order: int
    total_blocks: int
    phase: int = WAITING
    cached: int = 0
    computed: int = 0
    join_step: int = 0
    cancelled: bool = False
    submitted: float = 0.0
    queued_s: float = 0.0


@dataclass(slots=True)
class _Span:
    start: float
    end: float
    steps: int
    chunks: list[tuple[_Seq, int]] = field(default_factory=list)
    first: float = 0.0
    growth: float = 0.0


class EngineModel:
    """One simulated engine instance. ``max_span_s`` caps a pure-decode span (for real-time streaming)."""

    def __init__(
        self,
        profile: EngineProfile,
        *,
        capacity_tokens: int | None = None,
        block_tokens: int | None = None,
        max_span_s: float = math.inf,
        max_waiting: int = 65_536,
    ) -> None:
        self.profile = profile
        self.block_tokens = block_tokens or profile.block_size
        capacity = capacity_tokens if capacity_tokens is not None else profile.kv_capacity_tokens
        self.cache = PrefixCache(max(1, capacity // self.block_tokens), self.block_tokens)
        self.capacity_tokens = self.cache.capacity_blocks * self.block_tokens
        self.max_span_s = max_span_s
        self.max_waiting = max_waiting
        self.stats = EngineStats()
        self._waiting: deque[_Seq] = deque()
        self._prefilling: list[_Seq] = []
        self._heap: list[tuple[int, int, _Seq]] = []
        self._seqs: dict[str, _Seq] = {}
        self._cancels: list[_Seq] = []
        self._decoding = 0
        self._decode_ctx = 0
        self._step = 0
        self._order = 0
        self._span: _Span | None = None
        self._clock = 0.0

    # ------------------------------------------------------------------ observation

    @property
    def num_running(self) -> int:
        return len(self._prefilling) + self._decoding

    @property
    def num_waiting(self) -> int:
        return len(self._waiting)

    @property
    def kv_usage(self) -> float:
        return self.cache.active_blocks / self.cache.capacity_blocks

    def next_time(self) -> float | None:
        """When the work in progress ends (None when idle)."""
        return self._span.end if self._span is not None else None

    def generated(self, request_id: str) -> int:
        """Output tokens produced so far by a live request (0 before its first token)."""
        seq = self._seqs.get(request_id)
        if seq is None or seq.phase != DECODE:
            return 0
        return 1 + self._step - seq.join_step

    def cached_tokens(self, request_id: str) -> int:
        seq = self._seqs.get(request_id)
        return seq.cached if seq is not None else 0

    def __contains__(self, request_id: str) -> bool:
        return request_id in self._seqs

    # ------------------------------------------------------------------ input

    def check(self, req: EngineRequest) -> None:
        """Raise RequestRejected if the request can never run here."""
        total = req.prompt_tokens + req.output_tokens
        if req.prompt_tokens < 1 or req.output_tokens < 1:
            raise RequestRejected("a request needs at least one prompt token and one output token")
        if total > self.profile.max_model_len:
            raise RequestRejected(
                f"This model's maximum context length is {self.profile.max_model_len} tokens. However, "
                f"you requested {total} tokens ({req.prompt_tokens} in the messages, "
                f"{req.output_tokens} in the completion)."
            )
        if self._blocks_for(total) > self.cache.capacity_blocks:
            raise RequestRejected(f"the request needs {total} tokens of KV cache, more than it holds")

    def submit(self, req: EngineRequest, now: float) -> None:
        """Queue a request arriving at ``now`` (not earlier than the previous call's time)."""
        try:
            self._accept(req)
        except RequestRejected:
            self.stats.rejected += 1
            raise
        self._order += 1
        seq = _Seq(req, self._order, self._blocks_for(req.prompt_tokens + req.output_tokens), submitted=now)
        self._seqs[req.request_id] = seq
        self._waiting.append(seq)
        self._wake(now)

    def _accept(self, req: EngineRequest) -> None:
        self.check(req)
        if len(self._waiting) >= self.max_waiting:
            raise RequestRejected(f"engine queue is full ({self.max_waiting} waiting requests)")
        if req.request_id in self._seqs:
            raise RequestRejected(f"duplicate request id {req.request_id!r}")

    def cancel(self, request_id: str, now: float) -> bool:
        """Abort a live request; it leaves the batch at the next step boundary. False if unknown."""
        seq = self._seqs.get(request_id)
        if seq is None or seq.cancelled:
            return False
        seq.cancelled = True
        if seq.phase == WAITING:
            self._waiting.remove(seq)
            self._drop(seq)
            return True
        self._cancels.append(seq)
        self._wake(now)
        return True

    def reset_prefix_cache(self) -> int:
        return self.cache.reset()

    def load(self, blocks: tuple[int, ...]) -> int:
        """A KV handoff: the leading ``blocks`` of a prompt arrive from another engine (a prefill's
        connector) and are cached here as if computed; returns how many were not already resident (the
        transferred ones; 0 too when the cache has no room for them: the prompt is then prefilled)."""
        held = self.cache.match(blocks)
        if held == len(blocks) or self.cache.allocate(blocks, len(blocks)) is None:
            return 0
        self.cache.mark_computed(blocks)
        self.cache.release(blocks, 0)
        return len(blocks) - held

    def transfer_time(self, tokens: int) -> float:
        """How long moving ``tokens`` tokens of KV cache from a prefill engine takes (the profile's cost)."""
        return tokens * self.profile.kv_transfer_s_per_token

    def _blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.block_tokens)

    def _wake(self, now: float) -> None:
        span = self._span
        if span is None:
            self._plan(max(now, self._clock))
        elif span.steps > 1 and now < span.end:
            self._truncate(span, now)

    def _truncate(self, span: _Span, now: float) -> None:
        steps = steps_reaching(span.first, span.growth, now - span.start)
        if steps < span.steps:
            span.steps = steps
            span.end = span.start + decode_span_time(span.first, span.growth, steps)

    # ------------------------------------------------------------------ progress

    def advance(self) -> list[EngineEvent]:
        """Complete the work in progress; returns the events it produced, in time order."""
        span = self._span
        if span is None:
            return []
        events: list[EngineEvent] = []
        self.stats.busy_s += span.end - span.start
        if span.chunks:
            self.stats.prefill_s += span.end - span.start
            self._run_mixed(span, events)
        else:
            self._run_decode(span, events)
        self._clock = span.end
        self._apply_cancels()
        self._plan(span.end)
        return events

    def _run_mixed(self, span: _Span, events: list[EngineEvent]) -> None:
        self._step += 1
        self.stats.steps += 1
        self._decode_ctx += self._decoding
        block = self.block_tokens
        for seq, tokens in span.chunks:
            done = seq.computed
            seq.computed += tokens
            # as vLLM V1, the full blocks of a chunk are cached once computed: hits for later requests
            self.cache.mark_computed(seq.req.blocks[done // block : seq.computed // block])
            if seq.computed >= seq.req.prompt_tokens:
                self._prefill_done(seq, span.end, events)
        self._prefilling = [s for s in self._prefilling if s.phase == PREFILL]
        self._pop_finished(span.end, events)

    def _run_decode(self, span: _Span, events: list[EngineEvent]) -> None:
        self._step += span.steps
        self.stats.steps += span.steps
        self._decode_ctx += self._decoding * span.steps
        self._pop_finished(span.end, events)

    def _prefill_done(self, seq: _Seq, now: float, events: list[EngineEvent]) -> None:
        self.cache.mark_computed(seq.req.blocks)
        if not seq.cancelled:
            events.append(EngineEvent("first_token", seq.req.request_id, now, seq.cached, 1, seq.queued_s))
        if seq.req.output_tokens <= 1:
            self._finish(seq, now, events)
            return
        seq.phase = DECODE
        seq.join_step = self._step
        self._decoding += 1
        self._decode_ctx += seq.req.prompt_tokens + 1
        heapq.heappush(self._heap, (self._step + seq.req.output_tokens - 1, seq.order, seq))

    def _pop_finished(self, now: float, events: list[EngineEvent]) -> None:
        heap = self._heap
        while heap and heap[0][0] <= self._step:
            seq = heapq.heappop(heap)[2]
            if seq.phase == DECODE:
                self._decoding -= 1
                self._decode_ctx -= seq.req.prompt_tokens + seq.req.output_tokens
                self._finish(seq, now, events)

    def _finish(self, seq: _Seq, now: float, events: list[EngineEvent]) -> None:
        req = seq.req
        private = seq.total_blocks - len(req.blocks)
        self.cache.release(req.blocks, private, req.extension[len(req.blocks) :])
        self.stats.generation_tokens += req.output_tokens
        self.stats.finished += 1
        self._drop(seq)
        if not seq.cancelled:
            events.append(
                EngineEvent("finished", req.request_id, now, seq.cached, req.output_tokens, seq.queued_s)
            )

    def _drop(self, seq: _Seq) -> None:
        seq.phase = DONE
        del self._seqs[seq.req.request_id]
        if seq.cancelled:
            self.stats.cancelled += 1

    def _apply_cancels(self) -> None:
        for seq in self._cancels:
            if seq.phase == PREFILL:
                self._prefilling.remove(seq)
                self._abort(seq, seq.computed)
            elif seq.phase == DECODE:
                self._decoding -= 1
                self._decode_ctx -= seq.req.prompt_tokens + 1 + self._step - seq.join_step
                self._abort(seq, seq.req.prompt_tokens)
        self._cancels.clear()

    def _abort(self, seq: _Seq, computed_tokens: int) -> None:
        blocks = seq.req.blocks
        self.cache.mark_computed(blocks[: computed_tokens // self.block_tokens])
        self.cache.release(blocks, seq.total_blocks - len(blocks))
        self._drop(seq)

    # ------------------------------------------------------------------ planning

    def _plan(self, start: float) -> None:
        self._span = None
        chunks = self._prefill_chunks(start)
        if chunks:
            self._span = self._mixed_span(start, chunks)
        elif self._decoding:
            self._span = self._decode_span(start)

    def _mixed_span(self, start: float, chunks: list[tuple[_Seq, int]]) -> _Span:
        tokens = pairs = 0
        for seq, n in chunks:
            tokens += n
            pairs += prefill_pairs(seq.computed, n)
        duration = step_time(self.profile, tokens, pairs, len(chunks), self._decoding, self._decode_ctx)
        return _Span(start, start + duration, 1, chunks)

    def _decode_span(self, start: float) -> _Span:
        heap = self._heap
        while heap[0][2].phase != DECODE:
            heapq.heappop(heap)
        steps = heap[0][0] - self._step
        first, growth = decode_coefficients(self.profile, self._decoding, self._decode_ctx)
        if math.isfinite(self.max_span_s):
            steps = min(steps, steps_within(first, growth, self.max_span_s))
        return _Span(start, start + decode_span_time(first, growth, steps), steps, [], first, growth)

    def _prefill_chunks(self, now: float) -> list[tuple[_Seq, int]]:
        budget = self.profile.max_num_batched_tokens - self._decoding
        chunks: list[tuple[_Seq, int]] = []
        for seq in self._prefilling:
            if budget <= 0:
                return chunks
            n = min(seq.req.prompt_tokens - seq.computed, budget)
            chunks.append((seq, n))
            budget -= n
        while budget > 0 and self._waiting and self.num_running < self.profile.max_num_seqs:
            seq = self._waiting[0]
            if not self._admit(seq, now):
                break
            n = min(seq.req.prompt_tokens - seq.computed, budget)
            chunks.append((seq, n))
            budget -= n
        return chunks

    def _admit(self, seq: _Seq, now: float) -> bool:
        req = seq.req
        allocation = self.cache.allocate(req.blocks, seq.total_blocks)
        if allocation is None:
            return False
        self._waiting.popleft()
        seq.queued_s = max(0.0, now - seq.submitted)
        # vLLM always computes at least the last prompt token, in whole blocks of its page size
        cap = (req.prompt_tokens - 1) // self.profile.block_size * self.profile.block_size
        seq.cached = min(allocation.hit_blocks * self.block_tokens, cap)
        seq.computed = seq.cached
        seq.phase = PREFILL
        self._prefilling.append(seq)
        self._count_admission(req.prompt_tokens, seq.cached)
        return True

    def _count_admission(self, prompt: int, cached: int) -> None:
        stats = self.stats
        stats.prompt_tokens += prompt
        stats.prefix_queries += prompt
        stats.prefix_hits += cached
        stats.prefill_computed += prompt - cached
