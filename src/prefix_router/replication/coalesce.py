"""Fewer, smaller index changes for the other replicas: runs of inserts merged per worker.

An insert touches its blocks deepest first (``PrefixIndex.insert``), so what a run of inserts leaves in a
worker's LRU is every block once, ordered by its last touch. One insert of
``dict.fromkeys(later blocks + earlier blocks)`` leaves exactly that order, each block touched once: a
system prompt shared by a batch's requests, or a request's prompt touched at dispatch and again with its
reply at the end, is sent and applied once instead of once per change.

Times: a merged insert carries the latest time of the inserts it stands for, so a run is merged only
over ``max_span_s`` (20 ms): a longer run (an outbox that filled while the other side was away) goes out
as one insert per span, each holding only the blocks not touched again in a later span, in time order;
the LRU order is the same and no time is off by more than the span (what ``forget_older`` cut-offs and
expiry compare).

Chains: the router's inserts are whole chains (``IndexChange.chained``). Their union, in the order above, is
whole chains too, each block after its parent (a block's parent comes before it in its own chain, or
earlier from a later insert), so the newest span's merged insert stays ``chained`` when it goes out in
one piece; an older span's (blocks touched later left out) or a piece of a split one does not, and the
receiver matches that worker block by block for a while (``PrefixIndex.match``).

A trim or forget-older of a worker is a barrier for that worker: its inserts before the barrier are
merged and emitted before it, those after it form a new run. Other workers' runs may pass a barrier
(their LRUs are independent). With ``max_prefix_blocks`` each insert is cut to it first, as the index
does. A merged insert longer than that cap or than ``max_blocks`` (what one message can carry) goes out
as several inserts, oldest touches first.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from itertools import chain

from prefix_router.routing import ChangeKind, IndexChange

INFINITE = 1 << 62
MAX_SPAN_S = 0.02


def coalesce(
    changes: Iterable[IndexChange],
    max_prefix_blocks: int | None = None,
    max_blocks: int | None = None,
    max_span_s: float = MAX_SPAN_S,
) -> list[IndexChange]:
    """``changes`` with each worker's runs of inserts merged (see the module doc)."""
    size = min(max_prefix_blocks or INFINITE, max_blocks or INFINITE)
    out: list[IndexChange] = []
    runs: dict[str, list[IndexChange]] = {}
    for change in changes:
        if change.kind == ChangeKind.INSERT:
            runs.setdefault(change.worker, []).append(change)
            continue
        run = runs.pop(change.worker, None)
        if run:
            out.extend(merged(run, max_prefix_blocks, size, max_span_s))
        out.append(change)
    for run in runs.values():
        out.extend(merged(run, max_prefix_blocks, size, max_span_s))
    return out


def merged(
    run: Sequence[IndexChange], max_prefix_blocks: int | None, size: int, max_span_s: float
) -> Iterator[IndexChange]:
    """One worker's inserts, in order, as the fewest inserts (of at most ``size`` blocks, each spanning at
    most ``max_span_s``) leaving the same LRU order."""
    if len(run) == 1 and len(run[0].blocks) <= size:
        yield run[0]
        return
    cut = slice(max_prefix_blocks)
    spans = _spans(run, max_span_s)
    later: set[int] = set()  # blocks touched again in a later span
    parts: list[tuple[tuple[int, ...], float, bool]] = []
    for span in reversed(spans):
        chained = all(c.chained for c in span)
        blocks = union([c.blocks[cut] for c in reversed(span)], chained)
        whole = not later and len(blocks) <= size and chained
        if later:
            blocks = tuple(b for b in blocks if b not in later)
        if len(spans) > 1:
            later.update(blocks)
        parts.append((blocks, max(c.at for c in span), whole))
    worker = run[0].worker
    for blocks, at, whole in reversed(parts):  # oldest first
        for end in range(len(blocks), 0, -size):  # the oldest touches are the last blocks: they go first
            yield IndexChange(
                ChangeKind.INSERT, worker, blocks[max(0, end - size) : end], at=at, chained=whole
            )


def union(lists: Sequence[tuple[int, ...]], chained: bool) -> tuple[int, ...]:
    """The blocks of ``lists``, in order, each once (``dict.fromkeys`` of them all). Whole chains
    (``chained``; each a prefix, as ``blocks[cut]`` is): a chain's blocks that an earlier chain brought are
    a prefix of it, since a chained hash names its whole prefix; their end is found by bisection and only
    the rest is walked (a request's prompt comes twice, at dispatch and with its reply, and a system prompt
    with every request of a batch: ``benchmarks/local_share.py`` prints the sender's cost)."""
    if not chained:
        return tuple(dict.fromkeys(chain.from_iterable(lists)))
    held: dict[int, None] = {}
    for blocks in lists:
        low, high = 0, len(blocks)
        while low < high:  # blocks[:low] held, blocks[high:] not
            middle = (low + high) // 2
            if blocks[middle] in held:
                low = middle + 1
            else:
                high = middle
        held.update(dict.fromkeys(blocks[low:]))  # blocks[0:] is blocks itself: no copy
    return tuple(held)


def _spans(run: Sequence[IndexChange], max_span_s: float) -> list[list[IndexChange]]:
    spans: list[list[IndexChange]] = []
    for change in run:
        if spans and change.at - spans[-1][0].at <= max_span_s:
            spans[-1].append(change)
        else:
            spans.append([change])
    return spans
