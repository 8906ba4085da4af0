"""The prefix index in tests: chained blocks from small ids, and the definition of a match to hold it to."""

from __future__ import annotations

from collections.abc import Callable

from prefix_router.routing.hashing import chain_blocks
from prefix_router.routing.index import PrefixIndex

Operation = tuple[str, str, list[int], int]  # kind, worker, the chain's ids, a number (cut, capacity, ...)
Recent = list[tuple[str, list[int]]]  # recent inserts, newest first: (worker, ids)


def chain(*ids: int) -> tuple[int, ...]:
    """Chained block hashes of the ids, one 8-byte block each (a block names its whole prefix)."""
    return chain_blocks(b"".join(i.to_bytes(8, "little") for i in ids), 8, seed=7)


def walked_match(index: PrefixIndex, blocks: tuple[int, ...]) -> dict[str, int]:
    """The definition of a match: each worker's leading run of held blocks, block by block over its own
    entries (no masks, no bisection)."""
    out = {}
    for worker in index.workers():
        depth = 0
        while depth < len(blocks) and index.holds(worker, blocks[depth]):
            depth += 1
        if depth:
            out[worker] = depth
    return out


def apply_operation(
    index: PrefixIndex,
    step: int,
    operation: Operation,
    recent: Recent,
    insert: Callable[[str, tuple[int, ...], float], None],
) -> Recent:
    """One operation of a generated history at time ``step`` (the worker added first if unknown): a chain
    inserted by ``insert``, a replica's merged subset (``chained=False``), a trim (of a recent insert's
    prefix cut in its middle, which may leave another chain without its parent, or of this chain), a
    learned capacity, expiry, or the worker removed. Returns the recent inserts (at most 16)."""
    kind, worker, ids, keep = operation
    if worker not in index:
        index.add_worker(worker)
    blocks = chain(*ids)
    if kind == "insert":
        insert(worker, blocks, float(step))
        return [(worker, ids), *recent[:15]]
    if kind == "merged":
        index.insert(worker, blocks[keep // 2 :: 1 + keep % 3], now=float(step), chained=False)
    elif kind == "trim" and recent and keep % 3:
        owner, long = recent[keep % len(recent)]
        if owner in index:
            index.trim(owner, chain(*long[: len(ids)]), keep // 3)
    elif kind == "trim":
        index.trim(worker, blocks, keep)
    elif kind == "capacity":
        index.learn_capacity(worker, keep + 1)
    elif kind == "expire":
        index.expire(float(step) + keep)
    else:
        index.remove_worker(worker)
    return recent
