"""Remaining prefill work per worker: a fluid queue drained at a learned rate.

The router knows the prompt tokens it sent to each worker that have not produced a first token yet (its
*pending* prefill), but not how far the engine got: a 100,000-token prompt counts in full until its first
token, although it is half done halfway through. Engines prefill first come, first served (vLLM's
scheduler with chunked prefill), so between two first tokens a worker's pending work drains at about its
prefill rate. Per worker this model keeps:

- the pending work, exactly (added at dispatch, removed at the first token or when a request leaves);
- an estimate of what remains, ``pending - rate x (time since the last first token)`` (never below 0),
  re-synchronised with the exact pending work at every first token (all earlier work is done then);
- the drain rate, learned from the same events: the work drained between two first tokens (exact) and
  the time it took while the worker had work, each as an exponential moving average (``alpha`` per
  sample), the rate their ratio (a batch's first tokens arrive microseconds apart: an average of the
  intervals' own ratios reached 300,000 tokens/s on real vLLM engines that prefill 800);
  a worker without samples yet uses the fleet's average, and 0 (no drain) before any sample at all.

It also keeps the work of a typical dispatched request (``mean_work``, a moving average with weight
``WORK_ALPHA``), the unit in which a backlog counts as "requests waiting".

Work is in *token-equivalents* (``prefill_work``): a prompt token at context position ``c`` costs
``1 + c / attention_tokens`` tokens, since attention makes long prompts slower per token; with work in
these units one drain rate fits short and long prompts alike. Bounded: one entry per worker.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from prefix_router.routing.types import WorkerSnapshot

WORK_ALPHA = 0.02  # weight of one request in the moving average of dispatched work (about 50 requests)


def prefill_work(uncached: float, cached: float, attention_tokens: float) -> float:
    """Token-equivalents of prefilling ``uncached`` tokens after ``cached`` ones: each token at context
    position c costs ``1 + c / attention_tokens`` (linear layers plus attention over its context)."""
    if uncached <= 0:
        return 0.0
    return uncached * (1.0 + (cached + uncached / 2.0) / attention_tokens)


@dataclass(slots=True)
class _Worker:
    pending: float = 0.0  # exact work dispatched and not past its first token
    estimate: float = 0.0  # remaining work at ``estimate_at``
    estimate_at: float = 0.0
    synced: float = 0.0  # pending work at the last first token (or when work reached an idle worker)
    synced_at: float = 0.0
    added: float = 0.0  # work dispatched since
    rate: float = 0.0  # learned work per second (0: unknown): ``drained / elapsed``
    drained: float = 0.0  # moving average of the work drained between two first tokens ...
    elapsed: float = 0.0  # ... and of the time it took (0: no sample yet)


_Entry = tuple[_Worker, WorkerSnapshot]  # a busy worker's state and live snapshot


class PrefillBacklog:
    def __init__(self, alpha: float = 0.1) -> None:
        if not 0.0 < alpha <= 1.0:
            raise ValueError("alpha must be in (0, 1]")
        self.alpha = alpha
        self._workers: dict[str, _Worker] = {}
        self._rate_sum = 0.0
        self._rated = 0
        self._snaps: dict[str, WorkerSnapshot] = {}  # live snapshots whose backlog ``refresh`` keeps
        self._busy: dict[str, _Entry] = {}  # those of the workers with pending work
        # busy workers whose backlog ``refresh`` found at 0, at a rate of their own or at the fleet's: it
        # stays 0 as time goes on until their next event (``_track``) or, for the latter, until the fleet's
        # rate falls below the highest it was drained at; ``refresh`` skips them (all if time goes back)
        self._drained: dict[str, _Entry] = {}
        self._fleet_drained: dict[str, _Entry] = {}
        self._drained_at = -math.inf  # the latest time one of them was found drained
        self._drained_fleet = -math.inf  # the highest fleet rate one of the latter was found drained at
        self.mean_work = 0.0

    def add_worker(self, worker: str, snap: WorkerSnapshot | None = None) -> None:
        """``snap``: the worker's live snapshot, whose ``prefill_backlog`` ``refresh`` keeps current."""
        state = self._workers.setdefault(worker, _Worker())
        if snap is not None:
            self._snaps[worker] = snap
            self._track(worker, state)

    def remove_worker(self, worker: str) -> None:
        self._busy.pop(worker, None)
        self._drained.pop(worker, None)
        self._fleet_drained.pop(worker, None)
        self._snaps.pop(worker, None)
        state = self._workers.pop(worker, None)
        if state is not None and state.rate > 0:
            self._rated -= 1
            self._rate_sum -= state.rate

    # ------------------------------------------------------------ reads

    def rate(self, worker: str) -> float:
        """The learned prefill rate of ``worker`` (work/s), else the fleet's average, else 0."""
        state = self._workers.get(worker)
        if state is None:
            return 0.0
        if state.rate > 0:
            return state.rate
        return self._rate_sum / self._rated if self._rated else 0.0

    def fleet_rate(self) -> float:
        """The workers' learned prefill rates averaged (work/s; 0 before any)."""
        return self._rate_sum / self._rated if self._rated else 0.0

    def pending(self, worker: str) -> float:
        state = self._workers.get(worker)
        return 0.0 if state is None else state.pending

    def remaining(self, worker: str, now: float) -> float:
        """Estimated prefill work still to compute on ``worker`` (at most its pending work)."""
        state = self._workers.get(worker)
        if state is None:
            return 0.0
        left = state.estimate - self.rate(worker) * max(0.0, now - state.estimate_at)
        return min(state.pending, max(0.0, left))

    def refresh(self, now: float) -> None:
        """Each worker's live snapshot's ``prefill_backlog = remaining(worker, now)``: computed for the
        workers with pending work only (an idle worker's is set to 0 when it becomes idle), so a decision
        pays for the busy workers, not for every candidate; and among those, not for the drained ones: a
        backlog found at 0 stays 0 at any later time (``left`` only falls as ``now`` grows) until the
        worker's next event, or, at the fleet's rate, until that rate falls."""
        fleet = self._rate_sum / self._rated if self._rated else 0.0
        if now < self._drained_at:  # time went back: the drained ones may not be drained then
            self._wake(self._drained)
        if now < self._drained_at or fleet < self._drained_fleet:
            self._wake(self._fleet_drained)
            self._drained_fleet = -math.inf
        own: list[str] = []
        by_fleet: list[str] = []
        for worker, (state, snap) in self._busy.items():  # ``remaining``'s min and max, inlined (same floats)
            rate, elapsed, left = state.rate, now - state.estimate_at, state.estimate
            if elapsed > 0.0:
                left -= (rate if rate > 0 else fleet) * elapsed
            pending = state.pending
            if left > 0.0:
                snap.prefill_backlog = left if left < pending else pending
            else:
                snap.prefill_backlog = 0.0
                (own if rate > 0 else by_fleet).append(worker)
        if own or by_fleet:
            self._rest(own, self._drained, now)
            self._rest(by_fleet, self._fleet_drained, now)
            if by_fleet:
                self._drained_fleet = max(self._drained_fleet, fleet)

    def _rest(self, workers: list[str], drained: dict[str, _Entry], now: float) -> None:
        """``workers`` (busy) were found drained at ``now``: skipped by ``refresh`` from now on."""
        busy = self._busy
        for worker in workers:
            drained[worker] = busy.pop(worker)
        self._drained_at = now

    def _wake(self, drained: dict[str, _Entry]) -> None:
        """The ``drained`` workers are computed by ``refresh`` again."""
        self._busy.update(drained)
        drained.clear()

    def _track(self, worker: str, state: _Worker) -> None:
        """After ``state.pending`` changed: a worker with pending work is busy (``refresh`` computes its
        backlog), an idle one's snapshot says 0 (what ``remaining`` says of it until its next request)."""
        snap = self._snaps.get(worker)
        if snap is None:
            return
        self._drained.pop(worker, None)
        self._fleet_drained.pop(worker, None)
        if state.pending > 0:
            self._busy[worker] = (state, snap)
        else:
            self._busy.pop(worker, None)
            snap.prefill_backlog = 0.0

    # ------------------------------------------------------------ events

    def dispatched(self, worker: str, work: float, now: float) -> None:
        state = self._workers.get(worker)
        if state is None:
            return
        self.mean_work = (
            work if self.mean_work <= 0 else self.mean_work + WORK_ALPHA * (work - self.mean_work)
        )
        state.estimate = self.remaining(worker, now) + work
        state.estimate_at = now
        if state.pending <= 0:  # the worker's prefill was idle: a learning interval starts now
            state.synced, state.synced_at, state.added = 0.0, now, 0.0
        state.pending += work
        state.added += work
        self._track(worker, state)

    def first_token(self, worker: str, work: float, now: float) -> None:
        """A request on ``worker`` got its first token: everything dispatched before it is computed."""
        state = self._workers.get(worker)
        if state is None:
            return
        state.pending = max(0.0, state.pending - work)
        drained, elapsed = state.synced + state.added - state.pending, now - state.synced_at
        if drained > 0 and elapsed > 0:
            self._learn(state, drained, elapsed)
        self._sync(state, now)
        self._track(worker, state)

    def abandoned(self, worker: str, work: float, now: float) -> None:
        """A request left without a first token (failed, cancelled): its work is dropped, not drained."""
        state = self._workers.get(worker)
        if state is None:
            return
        left = self.remaining(worker, now)
        state.pending = max(0.0, state.pending - work)
        self._sync(state, now)
        state.estimate = min(state.pending, left)
        self._track(worker, state)

    def _sync(self, state: _Worker, now: float) -> None:
        state.synced, state.synced_at, state.added = state.pending, now, 0.0
        state.estimate, state.estimate_at = state.pending, now

    def _learn(self, state: _Worker, drained: float, elapsed: float) -> None:
        """One interval's sample: the rate is the moving average of the work drained over that of the
        time taken (a ratio of averages, not an average of ratios: an engine that prefills a batch in
        one step sends its first tokens a few microseconds apart, and each of those intervals alone
        would say the whole request took microseconds)."""
        old = state.rate
        if state.elapsed <= 0:
            state.drained, state.elapsed = drained, elapsed
        else:
            state.drained += self.alpha * (drained - state.drained)
            state.elapsed += self.alpha * (elapsed - state.elapsed)
        rate = state.drained / state.elapsed
        if not rate < math.inf:  # a vanishing interval (a subnormal step) would make it inf, then NaN
            return
        state.rate = rate
        self._rated += old <= 0
        self._rate_sum += state.rate - max(old, 0.0)
