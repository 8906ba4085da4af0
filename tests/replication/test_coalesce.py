"""Merged runs of inserts leave every replica's index as the original changes would, with fewer touches."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from prefix_router.replication.coalesce import MAX_SPAN_S, coalesce, union
from prefix_router.routing.index import PrefixIndex
from prefix_router.routing.router import ChangeKind, IndexChange
from support.index import chain, walked_match

WORKERS = ("a", "b", "c")


def index(capacity_blocks: int, max_prefix_blocks: int | None) -> PrefixIndex:
    idx = PrefixIndex(
        block_tokens=1,
        default_capacity_tokens=capacity_blocks,
        max_total_blocks=10_000,
        ttl_s=1e9,
        max_prefix_blocks=max_prefix_blocks,
    )
    for worker in WORKERS:
        idx.add_worker(worker)
    return idx


def apply(idx: PrefixIndex, changes: list[IndexChange]) -> None:
    for change in changes:
        if change.kind == ChangeKind.INSERT:
            idx.insert(change.worker, change.blocks, change.at)
        elif change.kind == ChangeKind.TRIM:
            idx.trim(change.worker, change.blocks, change.keep)
        else:
            idx.forget_older(change.worker, change.at)


def view(idx: PrefixIndex) -> dict[str, list[int]]:
    """Each worker's blocks in LRU order (least recent first)."""
    return {w: list(idx._lru[w]) for w in WORKERS}


blocks = st.lists(st.integers(0, 40), min_size=1, max_size=12).map(tuple)
workers = st.sampled_from(WORKERS)
# chains of few ids share and extend each other's prefixes, as requests do
chained_blocks = st.lists(st.integers(0, 2), min_size=1, max_size=12).map(lambda ids: chain(*ids))
# an insert is a whole chain (the router's own) or any list of blocks marked as not one (``chained``)
inserts = st.one_of(
    st.builds(lambda w, b: IndexChange(ChangeKind.INSERT, w, b), workers, chained_blocks),
    st.builds(lambda w, b: IndexChange(ChangeKind.INSERT, w, b, chained=False), workers, blocks),
)
trims = st.builds(lambda w, b, k: IndexChange(ChangeKind.TRIM, w, b, k), workers, blocks, st.integers(0, 6))
forgets = st.builds(
    lambda w, at: IndexChange(ChangeKind.FORGET_OLDER, w, at=at), workers, st.sampled_from([1.5, 2.5])
)
# times: 1.0 and 1.004 fall in one merging span, the others apart; forget-older cut-offs lie between spans
times = st.lists(st.sampled_from([1.0, 1.004, 2.0, 3.0, 3.002]), min_size=30, max_size=30).map(sorted)
mixed = st.lists(st.one_of(inserts, inserts, inserts, trims, forgets), max_size=30)


def timed(changes: list[IndexChange], at: list[float]) -> list[IndexChange]:
    return [
        c
        if c.kind == ChangeKind.FORGET_OLDER
        else IndexChange(c.kind, c.worker, c.blocks, c.keep, t, chained=c.chained)
        for c, t in zip(changes, at, strict=False)
    ]


@settings(max_examples=300, deadline=None)
@given(
    changes=mixed,
    at=times,
    capacity=st.integers(3, 200),
    max_prefix=st.one_of(st.none(), st.integers(1, 8)),
    seeded=st.lists(inserts, max_size=5),
)
def test_the_merged_changes_leave_the_same_index(
    changes: list[IndexChange],
    at: list[float],
    capacity: int,
    max_prefix: int | None,
    seeded: list[IndexChange],
) -> None:
    changes = timed(changes, at)
    original, merged = index(capacity, max_prefix), index(capacity, max_prefix)
    for idx in (original, merged):  # what the replica held before (older entries, forget_older's victims)
        apply(idx, [IndexChange(c.kind, c.worker, c.blocks, at=0.25) for c in seeded])
    apply(original, changes)
    apply(merged, coalesce(changes, max_prefix))
    assert view(merged) == view(original)
    assert original._holders == merged._holders
    for worker in WORKERS:  # no time off by more than the merging span
        for block, when in original._lru[worker].items():
            assert 0 <= merged._lru[worker][block] - when <= MAX_SPAN_S


def test_a_shared_prompt_is_sent_once_and_a_barrier_splits_the_run() -> None:
    system = tuple(range(100, 130))
    changes = [IndexChange(ChangeKind.INSERT, "a", (*system, i), at=1 + i / 1000) for i in range(4)]
    changes.append(IndexChange(ChangeKind.FORGET_OLDER, "a", at=0.5))
    changes.append(IndexChange(ChangeKind.INSERT, "a", (*system, 9), at=5.0))
    out = coalesce(changes)
    assert [c.kind for c in out] == [ChangeKind.INSERT, ChangeKind.FORGET_OLDER, ChangeKind.INSERT]
    assert out[0].blocks == (*system, 3, 2, 1, 0) and out[0].at == 1.003  # each block once, latest time
    assert out[2] is changes[-1]
    assert sum(len(c.blocks) for c in out) == 34 + 31  # instead of 5 x 31


def test_long_merged_inserts_respect_the_prefix_cap() -> None:
    changes = [
        IndexChange(ChangeKind.INSERT, "a", tuple(range(i * 10, i * 10 + 10)), at=1.0) for i in range(3)
    ]
    out = coalesce(changes, max_prefix_blocks=4)
    assert all(len(c.blocks) <= 4 for c in out)
    assert sorted(b for c in out for b in c.blocks) == sorted([*range(4), *range(10, 14), *range(20, 24)])


def test_a_long_run_keeps_its_times_span_by_span() -> None:
    """An outbox that filled over seconds: each span keeps its time; a block touched again later is sent
    once, with the later span."""
    changes = [
        IndexChange(ChangeKind.INSERT, "a", (1, 2), at=2.0),
        IndexChange(ChangeKind.INSERT, "a", (3, 4), at=3.0),
        IndexChange(ChangeKind.INSERT, "a", (3, 4, 5), at=10.0),
    ]
    out = coalesce(changes)
    assert [(c.blocks, c.at) for c in out] == [((1, 2), 2.0), ((3, 4, 5), 10.0)]


chains = st.lists(st.integers(0, 2), min_size=1, max_size=10)  # few ids: chains share and extend prefixes


@settings(max_examples=300, deadline=None)
@given(
    requests=st.lists(st.tuples(workers, chains), min_size=1, max_size=24),
    at=times,
    capacity=st.integers(3, 40),
    max_blocks=st.one_of(st.none(), st.integers(2, 6)),
)
def test_chained_merged_inserts_keep_the_bisected_match_exact(
    requests: list[tuple[str, list[int]]], at: list[float], capacity: int, max_blocks: int | None
) -> None:
    """The router's inserts are whole chains; what ``coalesce`` still marks ``chained`` (sent as such to the
    other processes, which then match that worker by bisection) must leave every worker's held blocks
    chain-closed: after every applied change, the index's match equals the block-by-block walk."""
    timed_requests = zip(requests, at, strict=False)  # at most 30 times
    changes = [IndexChange(ChangeKind.INSERT, w, chain(*ids), at=t) for (w, ids), t in timed_requests]
    idx = index(capacity, None)
    for worker, ids in requests:  # the roots held before: a later block lacking its parent would show
        idx.insert(worker, chain(ids[0]), 0.5)
    probes = [chain(*ids) for _, ids in requests]
    for change in coalesce(changes, max_blocks=max_blocks):
        idx.insert(change.worker, change.blocks, change.at, chained=change.chained)
        for probe in probes:
            assert idx.match(probe) == walked_match(idx, probe)


def test_only_whole_chains_go_out_chained() -> None:
    one_span = [IndexChange(ChangeKind.INSERT, "a", chain(1, i), at=1 + i / 1000) for i in range(3)]
    assert [c.chained for c in coalesce(one_span)] == [True]
    two_spans = [*one_span, IndexChange(ChangeKind.INSERT, "a", chain(1, 2, 3), at=2.0)]
    assert [c.chained for c in coalesce(two_spans)] == [False, True]  # the older span lacks what came later
    assert [c.chained for c in coalesce(one_span, max_blocks=2)] == [False, False]  # split: children first


@settings(max_examples=500, deadline=None)
@given(lists=st.lists(chained_blocks, max_size=12), cut=st.one_of(st.none(), st.integers(1, 8)))
def test_the_union_of_whole_chains_is_every_block_once_in_order(
    lists: list[tuple[int, ...]], cut: int | None
) -> None:
    """The bisected union of whole chains (prefixes of them, as ``blocks[cut]``) is the plain one."""
    lists = [blocks[:cut] for blocks in lists]
    assert union(lists, chained=True) == tuple(dict.fromkeys(b for blocks in lists for b in blocks))
    assert union(lists, chained=False) == tuple(dict.fromkeys(b for blocks in lists for b in blocks))
