"""Engine feedback: judging a response's report of cached prompt tokens against the router's prediction.

Every routed request's prediction (the tokens its worker was expected to hold when it was dispatched) is
compared with what the engine reported (``usage.prompt_tokens_details.cached_tokens``). The report is
clamped to [0, prompt tokens] first (the engine's own ``usage.prompt_tokens`` when it is a sane count,
else the router's estimate), so a buggy or hostile engine cannot poison the tallies. Verdicts:

- ``agree``: within ``slack_pages`` engine pages of the prediction, or short of it but at least
  ``tolerance`` x the prediction (engines report whole pages and always recompute the last prompt token,
  so a one-page prediction can come back as 0; the character estimate of tokens is approximate).
- ``raced``: short, but the request was dispatched while some of its predicted blocks had been first
  inserted on that worker by a request still in its prefill: the engine could not serve them yet. Ignored.
- ``queued``: short, but the request waited so long between its dispatch and its first token that the
  index's own LRU, had it touched the matched blocks when the engine did (at admission, not at dispatch),
  would have evicted them too: the prefix was evicted while the request queued (overload), not
  mispredicted. Ignored (``queued_turnover``; ``explained_by_queueing``).
- ``miss``: short: the engine evicted what the index still holds.
- ``over``: more than the prediction by over ``slack_pages`` pages: the index gave up blocks the engine
  still holds (or the estimate under-counts).

What a verdict may change is the router's business (``router.py``): only the worker's learned capacity,
by at most ``capacity_step`` of it per report; never a prefix. Responses without a count are tallied
apart (``unreported``), so predicted and reported tokens are always summed over the same requests.

``PrefillTracker`` remembers, per worker, the prefixes a request in prefill inserted first (one entry per
request, bounded by the tracked requests: the oldest entry gives way).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from enum import StrEnum
from typing import NamedTuple

from prefix_router.routing.types import Outcome

# no KV cache holds this many tokens: a larger prompt count is not taken as the bound of a report
MAX_REPORT_TOKENS = 1 << 31


class FeedbackTuning(NamedTuple):
    """The verdicts' thresholds and the capacity learning's step: constants of this algorithm, passed to
    ``Router`` (its ``feedback`` argument) where a test or the simulator wants others.

    ``page_tokens``: an engine's KV page, vLLM's default block size (16), the unit of its reports;
    ``slack_pages``: two pages (a report rounds down to whole pages and the last prompt token is always
    recomputed: up to two pages below a prediction in tokens); ``tolerance``: a report at least half the
    prediction agrees with it (the character estimate of tokens is approximate); ``capacity_step``: a
    tenth of the learned capacity per report (0: never learn it); ``min_capacity_tokens``: 4 Ki tokens, the
    smallest KV cache an engine serves a long prompt with; ``queued_turnover``: one index turnover
    (``explained_by_queueing``; None: a queued request's report is a miss)."""

    tolerance: float = 0.5
    page_tokens: int = 16
    slack_pages: int = 2
    capacity_step: float = 0.1
    min_capacity_tokens: int = 4096
    queued_turnover: float | None = 1.0


class Verdict(StrEnum):
    """The verdict on one engine report (the ``verdict`` label of ``prefix_router_cache_reports_total``)."""

    AGREE = "agree"
    RACED = "raced"
    QUEUED = "queued"
    MISS = "miss"
    OVER = "over"


@dataclass(slots=True)
class FeedbackStats:
    """One worker's tally. Token sums cover only the requests whose engine reported (``reports``)."""

    reports: int = 0
    predicted_tokens: int = 0  # the router's predictions, for the reported requests only
    reported_tokens: int = 0  # the engines' reports, clamped to [0, prompt tokens]
    agree: int = 0
    raced: int = 0
    queued: int = 0
    miss: int = 0
    over: int = 0
    unreported: int = 0  # responses without a cached-token count (not in the sums)
    clamped: int = 0  # reports outside [0, prompt tokens], clamped before use
    capacity_changes: int = 0  # learned-capacity moves caused by these reports

    def count(self, verdict: Verdict, predicted: int, reported: int, clamped: bool) -> None:
        self.reports += 1
        self.predicted_tokens += predicted
        self.reported_tokens += reported
        self.clamped += clamped
        setattr(self, verdict.value, getattr(self, verdict.value) + 1)

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


def prompt_bound(estimate: int, outcome: Outcome) -> int:
    """The most a report may say: the engine's own prompt length when it is a sane count, else the
    router's estimate of it."""
    engine = outcome.reported_prompt_tokens
    return engine if engine is not None and 0 < engine <= MAX_REPORT_TOKENS else estimate


def clamp_report(reported: int, prompt_tokens: int) -> tuple[int, bool]:
    """``reported`` within [0, prompt tokens], and whether it had to be moved."""
    bounded = min(max(reported, 0), max(prompt_tokens, 0))
    return bounded, bounded != reported


def judge(cfg: FeedbackTuning, predicted: int, reported: int, raced: bool, queued: bool = False) -> Verdict:
    """The verdict on a (clamped) report of a request predicted at ``predicted`` tokens; ``queued``:
    the shortfall is explained by its wait in the engine's queue (``explained_by_queueing``)."""
    slack = cfg.slack_pages * cfg.page_tokens
    if reported - predicted > slack:
        return Verdict.OVER
    if predicted - reported <= slack or reported >= cfg.tolerance * predicted:
        return Verdict.AGREE
    if raced:
        return Verdict.RACED
    return Verdict.QUEUED if queued else Verdict.MISS


def explained_by_queueing(
    cfg: FeedbackTuning, last_touched: float | None, started: float | None, turnover: float | None
) -> bool:
    """Whether a short report is explained by the request's wait in the engine's queue.

    ``last_touched``: when the index last touched the deepest predicted block before this request's
    dispatch; ``started``: when its first token came (the engine computed the prompt by then);
    ``turnover``: how long an untouched block stays in the worker's index (the age of its LRU's oldest
    entry, None while the index is not full: it has evicted nothing). The engine touches the prefix when
    it admits the request, the index did at dispatch; when the prefix was already older than
    ``queued_turnover`` x the turnover at the first token, the index's own LRU would have evicted it as
    well, so the report says the request waited, not that the index holds more than the engine."""
    if cfg.queued_turnover is None or last_touched is None or started is None or turnover is None:
        return False
    return started - last_touched >= cfg.queued_turnover * turnover


class PrefillTracker:
    """Prefixes first inserted on a worker by requests still in their prefill (until their first token).

    Blocks are chained (a block hash names its whole prefix), so a request's first newly inserted block
    stands for all of them: a later request whose matched blocks include any block the earlier one
    inserted first includes that one too. One entry per request, O(1) to start and end."""

    def __init__(self, capacity: int) -> None:
        if capacity <= 0:
            raise ValueError("capacity must be positive")
        self.capacity = capacity
        # request -> (worker, that worker's pending table, its first new block); a table is replaced, not
        # reused, when its worker is forgotten: a late request of an old incarnation never touches a new one
        self._requests: OrderedDict[str, tuple[str, dict[int, int], int]] = OrderedDict()
        self._pending: dict[str, dict[int, int]] = {}  # worker -> first new block -> requests in prefill

    def started(self, route_id: str, worker: str, first: int) -> None:
        """``route_id`` began its prefill on ``worker``, ``first`` being the first block it inserted
        there (the shallowest block the worker did not hold)."""
        self.done(route_id)
        pending = self._pending.setdefault(worker, {})
        pending[first] = pending.get(first, 0) + 1
        self._requests[route_id] = (worker, pending, first)
        if len(self._requests) > self.capacity:
            self.done(next(iter(self._requests)))

    def done(self, route_id: str) -> None:
        """The prefill of ``route_id`` is over (first token, finish, or it was forgotten)."""
        entry = self._requests.pop(route_id, None)
        if entry is None:
            return
        worker, pending, first = entry
        left = pending.get(first, 0) - 1
        if left > 0:
            pending[first] = left
        else:
            pending.pop(first, None)
        if not pending and self._pending.get(worker) is pending:
            del self._pending[worker]

    def racing(self, worker: str, blocks: Sequence[int]) -> bool:
        """Whether any of ``blocks`` (a matched prefix) is still in another request's first prefill."""
        pending = self._pending.get(worker)
        return pending is not None and not pending.keys().isdisjoint(blocks)

    def forget_worker(self, worker: str) -> None:
        """Drop ``worker``'s pending prefixes (its requests' entries are dropped as they end)."""
        self._pending.pop(worker, None)

    def __len__(self) -> int:
        return len(self._requests)

    def pending_prefixes(self) -> int:
        return sum(len(p) for p in self._pending.values())
