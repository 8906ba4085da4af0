from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from prefix_router.lab.sim.kvcache import PrefixCache


def blocks(tag: int, n: int) -> tuple[int, ...]:
    return tuple(tag * 1000 + i for i in range(n))


def test_a_released_prefix_is_a_hit_for_the_next_request() -> None:
    cache = PrefixCache(capacity_blocks=100, block_tokens=16)
    first = cache.allocate(blocks(1, 5), 6)
    assert first is not None and first.hit_blocks == 0
    cache.mark_computed(blocks(1, 5))
    cache.release(blocks(1, 5), 1)
    again = cache.allocate(blocks(1, 3) + blocks(2, 2), 5)
    assert again is not None and again.hit_blocks == 3


def test_blocks_not_computed_yet_are_not_hits() -> None:
    cache = PrefixCache(capacity_blocks=100, block_tokens=16)
    assert cache.allocate(blocks(1, 4), 4) is not None
    second = cache.allocate(blocks(1, 4), 4)
    assert second is not None and second.hit_blocks == 0
    cache.mark_computed(blocks(1, 4))
    assert cache.match(blocks(1, 4)) == 4


def test_eviction_takes_the_least_recently_used_prefix_first() -> None:
    cache = PrefixCache(capacity_blocks=8, block_tokens=16)
    for tag in (1, 2):  # two 4-block prefixes fill the cache; 1 is older
        assert cache.allocate(blocks(tag, 4), 4) is not None
        cache.mark_computed(blocks(tag, 4))
        cache.release(blocks(tag, 4), 0)
    reuse = cache.allocate(blocks(1, 4), 4)  # touch 1: now 2 is the LRU
    assert reuse is not None and reuse.hit_blocks == 4
    cache.release(blocks(1, 4), 0)
    assert cache.allocate(blocks(3, 4), 4) is not None
    assert cache.match(blocks(1, 4)) == 4
    assert cache.match(blocks(2, 4)) == 0
    assert cache.evictions == 4


def test_tail_blocks_are_evicted_before_the_head() -> None:
    cache = PrefixCache(capacity_blocks=6, block_tokens=16)
    assert cache.allocate(blocks(1, 6), 6) is not None
    cache.mark_computed(blocks(1, 6))
    cache.release(blocks(1, 6), 0)
    assert cache.allocate(blocks(2, 2), 2) is not None
    assert cache.match(blocks(1, 6)) == 4  # the two deepest blocks went first


def test_held_blocks_are_never_evicted() -> None:
    cache = PrefixCache(capacity_blocks=6, block_tokens=16)
    assert cache.allocate(blocks(1, 4), 4) is not None
    assert cache.allocate(blocks(2, 4), 4) is None  # would need a held block
    assert cache.used_blocks == 4


def test_extension_blocks_are_cached_in_place_of_private_ones() -> None:
    cache = PrefixCache(capacity_blocks=20, block_tokens=16)
    prompt = blocks(1, 3)
    assert cache.allocate(prompt, 6) is not None
    cache.mark_computed(prompt)
    cache.release(prompt, 3, blocks(1, 5)[3:])
    assert cache.match(blocks(1, 5)) == 5
    assert cache.used_blocks == 5


def test_reset_drops_every_cached_block_held_ones_when_released() -> None:
    """After a reset nothing is a hit (the engine's AllBlocksCleared is true): blocks a running request
    holds stay in memory until it ends, then are freed, not cached."""
    cache = PrefixCache(capacity_blocks=20, block_tokens=16)
    assert cache.allocate(blocks(1, 3), 3) is not None
    cache.mark_computed(blocks(1, 3))
    cache.release(blocks(1, 3), 0)
    assert cache.allocate(blocks(2, 2), 2) is not None
    cache.mark_computed(blocks(2, 2))
    assert cache.reset() == 5
    assert cache.cached_blocks == 0 and cache.used_blocks == 2  # the running request's two blocks
    assert cache.match(blocks(1, 3)) == 0 and cache.match(blocks(2, 2)) == 0
    assert cache.allocate(blocks(2, 2), 2) is not None  # the same prefix again: a copy, computed anew
    assert cache.used_blocks == 4 and cache.match(blocks(2, 2)) == 0
    cache.release(blocks(2, 2), 0)  # the first holder ends: its detached copy is freed
    assert cache.used_blocks == 2 and cache.match(blocks(2, 2)) == 0
    cache.mark_computed(blocks(2, 2))
    cache.release(blocks(2, 2), 0)
    assert cache.used_blocks == 2 and cache.cached_blocks == 2 and cache.match(blocks(2, 2)) == 2


ops = st.lists(st.tuples(st.integers(0, 5), st.integers(1, 8), st.integers(0, 3), st.booleans()), max_size=60)


@settings(max_examples=150, deadline=None)
@given(ops, st.integers(4, 24))
def test_capacity_bound_holds_under_random_operations(
    script: list[tuple[int, int, int, bool]], capacity: int
) -> None:
    cache = PrefixCache(capacity_blocks=capacity, block_tokens=16)
    held: list[tuple[tuple[int, ...], int]] = []
    for tag, length, private, release_one in script:
        prompt = blocks(tag, length)
        if cache.allocate(prompt, length + private) is not None:
            cache.mark_computed(prompt)
            held.append((prompt, private))
        if release_one and held:
            done, extra = held.pop(0)
            cache.release(done, extra)
        assert cache.used_blocks <= capacity
        assert 0 <= cache.active_blocks <= cache.used_blocks
    for done, extra in held:
        cache.release(done, extra)
    assert cache.active_blocks == 0
