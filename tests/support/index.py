"""The prefix index in tests: chained blocks from small ids, and the definition of a match to hold it to."""

from __future__ import annotations

from prefix_router.routing.hashing import chain_blocks
from prefix_router.routing.index import PrefixIndex


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
