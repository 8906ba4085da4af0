"""Chained block hashes (xxh3-64): ``h[i] = xxh3(block[i], seed=h[i-1])``, ``h[-1] = namespace``.

Because each hash seeds the next, ``h[i]`` identifies the whole prefix of the first ``i + 1`` blocks: two
inputs share their first k blocks exactly when their first k hashes are equal.

In the compiled build ``chain_blocks`` runs the C loop ``_chain.chain`` (the same xxh3 through libxxhash,
one pass); without it (pure build, or libxxhash missing) the Python loop below, the reference.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import xxhash

_Chain = Callable[[bytes, int, int, int], tuple[int, ...]]


def _load_chain() -> _Chain | None:
    try:
        from prefix_router.routing._chain import chain
    except ImportError:  # the pure build: the Python loop below
        return None
    return chain


_chain = _load_chain()

_MASK64 = (1 << 64) - 1


def hash_bytes(data: bytes, seed: int = 0) -> int:
    return xxhash.xxh3_64_intdigest(data, seed & _MASK64)


def namespace_seed(parts: Iterable[str | None]) -> int:
    """One 64-bit seed from the namespace parts (model, adapter, cache salt, tenant); None parts skipped."""
    text = "\x1f".join("" if p is None else p for p in parts)
    return hash_bytes(text.encode("utf-8", "surrogatepass"))


def chain_blocks(data: bytes, block_size: int, seed: int, limit: int | None = None) -> tuple[int, ...]:
    """Hashes of the full ``block_size`` blocks of ``data`` (a trailing partial block is not hashed)."""
    end = len(data) - len(data) % block_size
    if limit is not None:
        end = min(end, limit - limit % block_size)
    if _chain is not None:
        return _chain(data, block_size, seed, max(end, 0))
    return chain_blocks_py(data, block_size, seed, end)


def chain_blocks_py(data: bytes, block_size: int, seed: int, end: int) -> tuple[int, ...]:
    """The reference loop: the hashes of the full blocks of ``data[:end]`` (``end`` a block multiple)."""
    out: list[int] = []
    prev = seed & _MASK64
    digest = xxhash.xxh3_64_intdigest  # the seed passed by position: a keyword costs 13 % more per block
    for start in range(0, end, block_size):
        prev = digest(data[start : start + block_size], prev)
        out.append(prev)
    return tuple(out)
