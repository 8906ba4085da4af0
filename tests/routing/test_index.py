from __future__ import annotations

import copy

from hypothesis import example, given, settings
from hypothesis import strategies as st

from prefix_router.routing.index import PrefixIndex
from support.index import Operation, Recent, apply_operation, chain, walked_match


def make_index(cap_tokens: int = 1_000, total: int = 10_000, ttl: float = 1e9) -> PrefixIndex:
    return PrefixIndex(block_tokens=10, default_capacity_tokens=cap_tokens, max_total_blocks=total, ttl_s=ttl)


def reference_match(held: dict[str, set[int]], blocks: tuple[int, ...]) -> dict[str, int]:
    out = {}
    for worker, have in held.items():
        depth = 0
        while depth < len(blocks) and blocks[depth] in have:
            depth += 1
        if depth:
            out[worker] = depth
    return out


def test_longest_leading_run_per_worker() -> None:
    index = make_index()
    for w in ("a", "b", "c"):
        index.add_worker(w)
    index.insert("a", chain(1, 2, 3), now=1)
    index.insert("b", chain(1, 2), now=1)
    index.insert("c", chain(9), now=1)
    assert index.match(chain(1, 2, 3, 4)) == {"a": 3, "b": 2}
    assert index.match(chain(1, 5)) == {"a": 1, "b": 1}
    assert index.match(chain(8)) == {}
    assert index.match(()) == {}


def test_lru_eviction_is_per_worker_and_deepest_first() -> None:
    index = make_index(cap_tokens=30)  # 3 blocks of 10 tokens
    index.add_worker("a")
    index.insert("a", chain(1, 2), now=1)
    index.insert("a", chain(5, 6), now=2)  # 4 blocks > 3: the oldest request's deepest block goes
    assert index.blocks_of("a") == 3
    assert index.match(chain(1, 2)) == {"a": 1}
    assert index.match(chain(5, 6)) == {"a": 2}


def test_removing_a_worker_purges_its_entries() -> None:
    index = make_index()
    index.add_worker("a")
    index.add_worker("b")
    index.insert("a", chain(1, 2), now=1)
    index.insert("b", chain(1), now=1)
    index.remove_worker("a")
    assert index.match(chain(1, 2)) == {"b": 1}
    assert len(index) == 1
    index.remove_worker("b")
    assert len(index) == 0 and index.unique_blocks() == 0


def test_ttl_expires_entries() -> None:
    index = make_index(ttl=10)
    index.add_worker("a")
    index.insert("a", chain(1), now=0)
    index.insert("a", chain(2), now=5)
    assert index.expire(now=12) == 1
    assert index.match(chain(1)) == {}
    assert index.match(chain(2)) == {"a": 1}


def test_global_cap_bounds_total_entries() -> None:
    index = make_index(cap_tokens=10_000, total=5)
    for w in ("a", "b"):
        index.add_worker(w)
    index.insert("a", chain(1, 2, 3, 4), now=1)
    index.insert("b", chain(5, 6, 7), now=2)
    assert len(index) == 5


def test_trim_and_forget_older() -> None:
    index = make_index()
    index.add_worker("a")
    index.insert("a", chain(1, 2, 3), now=1)
    assert index.trim("a", chain(1, 2, 3), keep=1) == 2
    assert index.match(chain(1, 2, 3)) == {"a": 1}
    index.insert("a", chain(7), now=5)
    assert index.forget_older("a", cutoff=1) == 1
    assert index.match(chain(1)) == {}
    assert index.match(chain(7)) == {"a": 1}


def test_worker_bits_are_reused_after_removal() -> None:
    index = make_index()
    for i in range(100):
        index.add_worker(f"w{i}")
        index.insert(f"w{i}", chain(i), now=1)
        if i % 2:
            index.remove_worker(f"w{i}")
    index.add_worker("late")
    index.insert("late", chain(3), now=1)
    assert index.match(chain(3)) == {"late": 1}


ops = st.lists(
    st.tuples(
        st.sampled_from(["insert", "remove", "trim", "expire"]),
        st.sampled_from(["a", "b", "c"]),
        st.lists(st.integers(0, 4), min_size=0, max_size=6),
        st.integers(0, 5),
    ),
    max_size=80,
)


class ReferenceLRU:
    """An independent model of one worker's cache: LRU of blocks, deepest touched first, TTL."""

    def __init__(self, cap_blocks: int, ttl: float) -> None:
        self.cap, self.ttl = cap_blocks, ttl
        self.order: list[tuple[int, float]] = []  # oldest first

    def insert(self, blocks: tuple[int, ...], now: float) -> None:
        for block in reversed(blocks):
            self.order = [(b, t) for b, t in self.order if b != block] + [(block, now)]
        self.order = self.order[max(0, len(self.order) - self.cap) :]

    def trim(self, blocks: tuple[int, ...], keep: int) -> None:
        gone = set(blocks[keep:])
        self.order = [(b, t) for b, t in self.order if b not in gone]

    def expire(self, cutoff: float) -> None:
        self.order = [(b, t) for b, t in self.order if t >= cutoff]

    def blocks(self) -> set[int]:
        return {b for b, _ in self.order}


@settings(max_examples=150, deadline=None)
@given(ops)
def test_matches_brute_force_and_bounds_hold(operations: list[tuple[str, str, list[int], int]]) -> None:
    """Random operation sequences: longest match equals an independent reference; bounds hold."""
    index = make_index(cap_tokens=40, total=1_000, ttl=5)
    ref: dict[str, ReferenceLRU] = {}
    now = 0.0
    for op, worker, ids, keep in operations:
        now += 1
        blocks = chain(*ids)
        if worker not in ref:
            index.add_worker(worker)
            ref[worker] = ReferenceLRU(4, 5)
        if op == "insert":
            index.insert(worker, blocks, now)
            ref[worker].insert(blocks, now)
            for r in ref.values():  # inserting also sweeps expired entries (TTL 5)
                r.expire(now - 5)
        elif op == "remove":
            index.remove_worker(worker)
            del ref[worker]
        elif op == "trim":
            index.trim(worker, blocks, keep)
            ref[worker].trim(blocks, keep)
        assert all(index.blocks_of(w) <= 4 for w in index.workers())
        assert len(index) == sum(len(r.blocks()) for r in ref.values())
        probe = chain(*ids)
        assert index.match(probe) == reference_match({w: r.blocks() for w, r in ref.items()}, probe)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from("abcd"), st.lists(st.integers(0, 50), max_size=8)), max_size=40))
def test_global_cap_holds_under_random_inserts(inserts: list[tuple[str, list[int]]]) -> None:
    index = make_index(cap_tokens=10_000, total=12)
    for i, (worker, ids) in enumerate(inserts):
        index.add_worker(worker)
        index.insert(worker, chain(*ids), now=float(i))
        assert len(index) <= 12
        assert index.unique_blocks() <= len(index)


class FullestChecked(PrefixIndex):
    """Checks, at every global-cap eviction, that the victim is a worker holding the most blocks."""

    victims: list[str]

    def _fullest_worker(self) -> str:
        worker = super()._fullest_worker()
        assert self.blocks_of(worker) == max(self.blocks_of(w) for w in self.workers())
        self.victims.append(worker)
        return worker


def test_the_global_cap_takes_from_the_fullest_worker() -> None:
    index = FullestChecked(block_tokens=10, default_capacity_tokens=10_000, max_total_blocks=18, ttl_s=1e9)
    index.victims = []
    for worker in "abc":
        index.add_worker(worker)
    index.insert("a", chain(*range(10)), now=1)
    index.insert("b", chain(*range(100, 105)), now=2)
    index.insert("c", chain(*range(200, 205)), now=3)  # 20 > 18: a (10 blocks) gives 2 up
    assert [index.blocks_of(w) for w in "abc"] == [8, 5, 5] and index.victims == ["a", "a"]


capped_ops = st.lists(
    st.tuples(
        st.sampled_from(["insert", "insert", "insert", "trim", "remove", "capacity", "forget"]),
        st.sampled_from("abcde"),
        st.lists(st.integers(0, 30), max_size=12),
        st.integers(0, 12),
    ),
    max_size=80,
)


@settings(max_examples=150, deadline=None)
@given(capped_ops)
def test_the_global_cap_always_evicts_a_fullest_worker(
    operations: list[tuple[str, str, list[int], int]],
) -> None:
    index = FullestChecked(block_tokens=10, default_capacity_tokens=200, max_total_blocks=25, ttl_s=1e9)
    index.victims = []
    for step, (op, worker, ids, keep) in enumerate(operations):
        if worker not in index:
            index.add_worker(worker)
        blocks = chain(*ids)
        if op == "insert":
            index.insert(worker, blocks, now=float(step))
        elif op == "trim":
            index.trim(worker, blocks, keep)
        elif op == "remove":
            index.remove_worker(worker)
        elif op == "capacity":
            index.learn_capacity(worker, keep + 1)
        else:
            index.forget_older(worker, float(step - keep))
        sizes = [index.blocks_of(w) for w in index.workers()]
        assert len(index) == sum(sizes) <= 25
        assert all(index.blocks_of(w) <= index.capacity_blocks(w) for w in index.workers())


shared_ops = st.lists(
    st.tuples(
        st.sampled_from(
            ["insert", "insert", "insert", "trim", "trim", "merged", "capacity", "expire", "remove"]
        ),
        st.sampled_from("abc"),
        st.lists(st.integers(0, 2), max_size=14),  # few ids: chains share prefixes and extend each other
        st.integers(0, 14),
    ),
    max_size=120,
)


@settings(max_examples=300, deadline=None)
@example([("insert", "a", [0, 1, 2, 0, 1], 0), ("trim", "a", [5, 5, 5], 4)], [[0]])
@given(shared_ops, st.lists(st.lists(st.integers(0, 2), min_size=1, max_size=16), min_size=1, max_size=6))
def test_bisected_matches_equal_the_block_by_block_walk(
    operations: list[Operation], probes: list[list[int]]
) -> None:
    """Long chains sharing prefixes, trims that cut others' chains in the middle (holes), replicas' merged
    block lists (any subset, ``chained=False``), evictions by capacity, expiry and global cap: the
    bisected match always equals the walk over each worker's own entries (and ``fills`` the entries)."""
    index = make_index(cap_tokens=120, total=40, ttl=30)
    inserted: Recent = []  # recent inserts: probed after every later operation
    for step, operation in enumerate(operations):
        inserted = apply_operation(index, step, operation, inserted, index.insert)
        ids = operation[2]
        for w in index.workers():  # the live fill map, kept by every change, says what the entries say
            assert index.fill(w) == index.fills[w] == index.blocks_of(w) / index.capacity_blocks(w)
        for ids_probe in [ids, *(long for _, long in inserted), *probes]:
            probe = chain(*ids_probe)
            assert index.match(probe) == walked_match(index, probe)


def test_a_trim_that_cuts_another_chain_is_matched_block_by_block() -> None:
    """b's trim of the shared middle leaves a's longer chain without a parent: a's match stops there."""
    index = make_index()
    index.add_worker("a")
    index.insert("a", chain(1, 2, 3, 4), now=1)
    assert index.match(chain(1, 2, 3, 4)) == {"a": 4}
    index.trim("a", chain(1, 2, 3), keep=1)  # a request sharing the prefix failed: its blocks 2.. go
    assert index.match(chain(1, 2, 3, 4)) == {"a": 1}  # block 4 is still held, but not its parents
    assert index.holds("a", chain(1, 2, 3, 4)[-1])
    index.insert("a", chain(1, 2, 3), now=2)  # the parents again: the whole chain matches
    assert index.match(chain(1, 2, 3, 4)) == {"a": 4}


def index_state(index: PrefixIndex) -> tuple[object, ...]:
    """Everything an insert may change, orders included (LRU order, size buckets' order)."""
    lrus = {w: list(lru.items()) for w, lru in index._lru.items()}
    buckets = {size: list(workers) for size, workers in index._by_size.items()}
    return (index._holders, lrus, len(index), index.fills, buckets, index.evictions, index._loose,
            index._loose_left)  # fmt: skip


@settings(max_examples=300, deadline=None)
@example([("insert", "a", [0, 1, 2, 0, 1], 0), ("trim", "a", [5, 5, 5], 4)], [[0, 1, 2, 0, 1, 2]], None)
@example([("insert", "a", [0, 1, 2], 0)], [[0, 1, 2, 1], [0, 1], [2, 2]], 2)
@given(
    shared_ops,
    st.lists(st.lists(st.integers(0, 2), min_size=1, max_size=16), min_size=1, max_size=6),
    st.sampled_from([None, None, 3]),
)
def test_inserting_one_chain_changes_the_index_as_insert_does(
    operations: list[Operation], probes: list[list[int]], max_prefix: int | None
) -> None:
    """``insert_chain`` (the held prefix found by bisection, no membership test per block) leaves exactly
    the index ``insert`` leaves, on chain-closed and loose workers, whatever the history (holes by trims,
    merged block lists, evictions by capacity and the global cap, expiry), and for lists that are not one
    chain (a chain's tail, reversed, behind another block) too."""
    index = PrefixIndex(block_tokens=10, default_capacity_tokens=120, max_total_blocks=40, ttl_s=30,
                        max_prefix_blocks=max_prefix)  # fmt: skip
    recent: Recent = []
    for step, operation in enumerate(operations):
        recent = apply_operation(index, step, operation, recent, index.insert_chain)
    inserted = [ids for _, ids in recent[:8]]
    now = float(len(operations))
    chains = [chain(*ids) for ids in [*probes, *(old + new for old in inserted[:3] for new in probes[:2])]]
    chains += [chain(*ids) for ids in inserted]
    not_chains = [blocks[1:] for blocks in chains] + [blocks[::-1] for blocks in chains]  # exact too
    not_chains += [(*chain(9), *blocks) for blocks in chains]  # an unheld block before a held chain
    for blocks in chains + not_chains:
        for worker in index.workers():
            one, other = copy.deepcopy(index), copy.deepcopy(index)
            one.insert(worker, blocks, now)
            other.insert_chain(worker, blocks, now)
            assert index_state(other) == index_state(one)


class OneAtATime(PrefixIndex):
    """The index with a worker over its capacity shrunk one eviction at a time (the reference of
    ``_shrink``'s single ``_evict`` of all the excess)."""

    def _shrink(self, worker: str) -> None:
        while self.blocks_of(worker) > self.capacity_blocks(worker):
            self._evict(worker, 1)


def capped(kind: type[PrefixIndex], cut: int | None) -> PrefixIndex:
    """An index of ``kind`` holding 6 blocks per worker and 40 in all (``cut``: its prefix cap)."""
    return kind(
        block_tokens=10, default_capacity_tokens=60, max_total_blocks=40, ttl_s=30, max_prefix_blocks=cut
    )


@settings(max_examples=300, deadline=None)
@given(shared_ops, st.sampled_from([None, 3]))
def test_the_excess_evicted_in_one_go_leaves_the_index_single_evictions_leave(
    operations: list[Operation], max_prefix: int | None
) -> None:
    """Whatever the history (inserts over capacity, lowered capacities, trims, merged lists that loosen a
    worker, the global cap), evicting a worker's excess in one go leaves the same entries, orders, size
    buckets (their order too), counts and looseness as one eviction at a time."""
    batched, single = capped(PrefixIndex, max_prefix), capped(OneAtATime, max_prefix)
    recent: Recent = []
    for step, operation in enumerate(operations):
        apply_operation(single, step, operation, recent, single.insert_chain)
        recent = apply_operation(batched, step, operation, recent, batched.insert_chain)
        assert index_state(batched) == index_state(single)
    assert batched.evictions == single.evictions
