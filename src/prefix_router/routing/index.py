"""The prefix index: which worker probably holds which prompt blocks in its KV cache.

``match(blocks)``: each worker's longest run of the request's leading blocks that it holds (blocks are
chained hashes: a block names its whole prefix). ``insert`` / ``insert_chain``: a dispatched request's
blocks, touched deepest first, so that its deepest block is the least recent and is evicted first, as an
engine's LRU evictor does; ``chained=False`` for block lists that need not be whole chains (other
replicas' merged changes). ``trim`` cuts a worker's chain; ``expire`` drops old entries;
``remove_worker`` purges a worker's entries.

Bounds: each worker holds at most ``capacity_tokens`` / block value blocks (its KV-cache size; a block is
worth ``block_tokens``, or for a worker keyed by text what its model's text is worth, ``set_block_value``;
below it the capacity learned from engine feedback, ``learn_capacity``); all workers together hold at
most ``max_total_blocks`` (the fullest worker gives way); entries older than ``ttl_s`` expire. Each
worker's entries are evicted least recent first.

How (data layout, chain-closed workers matched by bisection, loose workers walked, the fullest worker
in amortised O(1)): docs/routing.md, "The prefix index". ``tests/routing`` holds it to a block-by-block
walk (``support.index.walked_match``).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Sequence
from itertools import islice
from typing import Any, Protocol, cast

from mypy_extensions import mypyc_attr


class LRU(Protocol):
    """One worker's blocks and their stamps, least recent first, through the part of ``OrderedDict``'s
    interface the index uses: an ``OrderedDict`` in the pure build, a ``_lru.BlockLRU`` (the same order
    and stamps, unboxed; held to an ``OrderedDict`` by a property test) in the compiled build."""

    def __len__(self) -> int: ...
    def __contains__(self, block: object, /) -> bool: ...
    def __iter__(self) -> Iterator[int]: ...
    def __getitem__(self, block: int, /) -> float: ...
    def __setitem__(self, block: int, stamp: float, /) -> None: ...
    def get(self, block: int, /) -> float | None: ...
    def pop(self, block: int, default: None, /) -> float | None: ...
    def move_to_end(self, block: int, /) -> None: ...
    def popitem(self, last: bool = True) -> tuple[int, float]: ...
    def items(self) -> Iterable[tuple[int, float]]: ...
    def values(self) -> Iterable[float]: ...


# touches blocks in an LRU: (the LRU, the holder bit, the blocks, now)
_Touch = Callable[[LRU, int, Sequence[int], float], None]
# touches blocks in an LRU, the holders given: (the LRU, holders, the bit, the blocks, now)
_TouchBlocks = Callable[[LRU, dict[int, int], int, Sequence[int], float], None]
# touches one chain on a chain-closed worker: (the LRU, holders, the bit, the blocks, held, now) -> found
_TouchChain = Callable[[LRU, dict[int, int], int, Sequence[int], int, float], int]
# evicts the least recent blocks of an LRU: (the LRU, holders, the bit, how many)
_Evict = Callable[[LRU, dict[int, int], int, int], None]


def touch_py(lru: LRU, holders: dict[int, int], value: int, blocks: Sequence[int], now: float) -> None:
    """Touch ``blocks`` deepest first: each moved to the most recent end at ``now``, or added (its holders
    get ``value``) if absent. The reference of the compiled build's C loop (``_lru.touch``)."""
    stamp: Any = now  # boxed once (see touch_chain_py)
    newest: Iterator[Any] = reversed(blocks)
    for block in newest:
        if block in lru:
            lru.move_to_end(block)
        else:
            holders[block] = holders.get(block, 0) | value
        lru[block] = stamp


def unhold(holders: dict[int, int], block: int, value: int) -> None:
    """Clear the bit ``value`` of ``block``'s holders; a block no worker holds leaves ``holders``."""
    mask = holders.get(block, 0) & ~value
    if mask:
        holders[block] = mask
    else:
        holders.pop(block, None)


def evict_py(lru: LRU, holders: dict[int, int], value: int, count: int) -> None:
    """Evict the ``count`` least recent blocks of ``lru``, each one ``unhold``: the reference of the
    compiled build's C loop (``_lru.evict``)."""
    for _ in range(count):
        block, _ = lru.popitem(last=False)
        unhold(holders, block, value)


def touch_chain_py(
    lru: LRU,
    holders: dict[int, int],
    value: int,
    blocks: Sequence[int],
    held: int,
    now: float,
) -> int:
    """The touch of the chain ``blocks`` on a chain-closed worker whose bit is ``value`` and which holds its
    first ``held`` blocks: deepest first, the others added (their holders get ``value``) or, found held
    after all, moved; then the held ones moved to the most recent end; all stamped ``now``. Returns how
    many of the others were found held. The reference of the compiled build's C loop
    (``_lru.touch_chain``, on a ``BlockLRU``)."""
    move = lru.move_to_end
    # compiled: the float boxed once, the blocks kept boxed (a stored float or int is boxed per store)
    stamp: Any = now
    newest: Iterator[Any] = reversed(blocks)
    found = 0
    for block in islice(newest, len(blocks) - held):  # deepest first: not held (chain-closed), added
        mask = holders.get(block, 0)
        if mask & value:
            found += 1
            move(block)
        else:
            holders[block] = mask | value
        lru[block] = stamp
    for block in newest:  # then the held prefix: moved to the most recent end
        lru[block] = stamp
        move(block)
    return found


def _ordered_lru() -> LRU:
    """An empty ``OrderedDict`` as an ``LRU`` (the pure build's)."""
    lru: OrderedDict[int, float] = OrderedDict()
    return lru


def _load_lru() -> tuple[Callable[[], LRU], _TouchBlocks, _TouchChain, _Evict]:
    """The LRU type, its touches and its eviction: ``_lru``'s in the compiled build, else ``OrderedDict``
    and the Python loops above."""
    try:
        from prefix_router.routing._lru import BlockLRU, evict, touch, touch_chain
    except ImportError:  # the pure build
        return _ordered_lru, touch_py, touch_chain_py, evict_py
    # given BlockLRUs only: every LRU here is one
    return BlockLRU, cast(_TouchBlocks, touch), cast(_TouchChain, touch_chain), cast(_Evict, evict)


_new_lru, _blocks_touch, _chain_touch, _lru_evict = _load_lru()


def _bits(mask: int) -> Iterator[int]:
    while mask:
        low = mask & -mask
        yield low.bit_length() - 1
        mask ^= low


@mypyc_attr(allow_interpreted_subclasses=True)  # compiled (setup.py), a lab and a test index subclass it
class PrefixIndex:
    def __init__(
        self,
        *,
        block_tokens: int,
        default_capacity_tokens: int,
        max_total_blocks: int,
        ttl_s: float,
        max_prefix_blocks: int | None = None,
    ) -> None:
        if block_tokens <= 0 or default_capacity_tokens <= 0 or max_total_blocks <= 0 or ttl_s <= 0:
            raise ValueError("index bounds must be positive")
        self.block_tokens = block_tokens
        self.default_capacity_tokens = default_capacity_tokens
        self.max_total_blocks = max_total_blocks
        self.ttl_s = ttl_s
        self.max_prefix_blocks = max_prefix_blocks
        self._holders: dict[int, int] = {}
        self._lru: dict[str, LRU] = {}
        self._bit: dict[str, int] = {}
        self._name: dict[int, str] = {}
        self._cap_blocks: dict[str, int] = {}  # learned capacity (engine feedback), <= the ceiling
        self._ceiling: dict[str, int] = {}  # known capacity (configured or scraped), blocks
        self._known: dict[str, int] = {}  # known capacity, tokens
        self._value: dict[str, float] = {}  # tokens one block of the worker is worth (default block_tokens)
        self._default_value = float(block_tokens)  # a float in both builds (compiled, float is unboxed)
        self.fills: dict[str, float] = {}  # worker -> ``fill(worker)``, kept current (read per candidate)
        self._by_size: dict[int, dict[str, None]] = {}  # blocks held -> workers holding that many (> 0)
        self._fullest = 0  # an upper bound of the largest size in _by_size
        self._loose = 0  # bits of the workers that may hold a block without its parent (see ``match``)
        self._loose_left: dict[str, int] = {}  # loose worker -> entries to leave before it is closed again
        self._total = 0
        self._next_expiry = 0.0
        self.evictions = 0

    # ------------------------------------------------------------ workers

    def add_worker(self, name: str, capacity_tokens: int | None = None) -> None:
        if name not in self._lru:
            bit = min(set(range(len(self._bit) + 1)) - set(self._name))
            self._bit[name], self._name[bit] = bit, name
            self._lru[name] = _new_lru()
        if capacity_tokens or name not in self._ceiling:
            self.set_capacity(name, capacity_tokens or self.default_capacity_tokens)

    def set_capacity(self, name: str, capacity_tokens: int) -> None:
        """The worker's known KV-cache size (configured, or scraped from the engine): the ceiling of its
        learned capacity, which starts there again."""
        self._known[name] = capacity_tokens
        self._ceiling[name] = self.blocks_for(name, capacity_tokens)
        self.learn_capacity(name, self._ceiling[name])

    def set_block_value(self, name: str, tokens: float) -> None:
        """What one of ``name``'s blocks is worth in tokens (text keys: learned, ``routing/units.py``): its
        known and learned capacities keep their tokens and change their blocks. A move of less than 1/64
        changes nothing (the learned value moves a little with every report)."""
        old = self._value.get(name, self._default_value)
        if name not in self._lru or tokens <= 0 or abs(tokens - old) * 64 < old:
            return
        learned = self._cap_blocks[name] * old
        self._value[name] = tokens
        self._ceiling[name] = self.blocks_for(name, self._known[name])
        self.learn_capacity(name, self.blocks_for(name, learned))

    def block_value(self, worker: str) -> float:
        return self._value.get(worker, self._default_value)

    def blocks_for(self, worker: str, tokens: float) -> int:
        """``tokens`` of ``worker``'s cache in blocks (at least 1)."""
        return max(1, int(tokens / self._value.get(worker, self._default_value)))

    def learn_capacity(self, name: str, blocks: int) -> int:
        """Set the blocks ``name`` is believed to hold at most, within [1, its ceiling]; evicts LRU down to
        it. Returns the capacity set."""
        blocks = min(max(blocks, 1), self._ceiling[name])
        self._cap_blocks[name] = blocks
        self.fills[name] = len(self._lru[name]) / blocks
        self._shrink(name)
        return blocks

    def remove_worker(self, name: str) -> None:
        lru = self._lru.pop(name, None)
        if lru is None:
            return
        bit = self._bit.pop(name)
        del self._name[bit], self._cap_blocks[name], self._ceiling[name], self._known[name]
        self._loose &= ~(1 << bit)
        self._loose_left.pop(name, None)
        self._value.pop(name, None)
        self.fills.pop(name, None)
        for block in lru:
            self._unhold(block, bit)
        self._total -= len(lru)
        self._resized(name, len(lru), 0)

    def workers(self) -> list[str]:
        return list(self._lru)

    def __contains__(self, worker: object) -> bool:
        return worker in self._lru

    # ------------------------------------------------------------ queries

    def match(self, blocks: Sequence[int]) -> dict[str, int]:
        """Matched leading blocks per worker (workers with no match are absent); ``blocks`` a chain."""
        if self.max_prefix_blocks is not None:
            blocks = blocks[: self.max_prefix_blocks]
        alive = self._holders.get(blocks[0], 0) if blocks else 0
        if not alive:
            return {}
        loose = alive & self._loose
        result = self._bisect(blocks, alive & ~loose) if alive & ~loose else {}
        if loose:
            result.update(self._walk(blocks, loose))
        return result

    def _bisect(self, blocks: Sequence[int], alive: int) -> dict[str, int]:
        """The matches of chain-closed workers ``alive`` (each holds ``blocks[0]``): the depth where some of
        them stop matching, by bisection, as often as they drop out in groups."""
        get, name, result, end = self._holders.get, self._name, {}, len(blocks)
        last, low = blocks[-1], 1  # every worker of ``alive`` holds ``blocks[:low]``
        while alive:
            if get(last, 0) & alive == alive:
                depth = end
            else:
                high = end - 1  # not every worker of ``alive`` holds ``blocks[high]``
                while low < high:
                    mid = (low + high) // 2
                    if get(blocks[mid], 0) & alive == alive:
                        low = mid + 1
                    else:
                        high = mid
                depth = low
            held = get(blocks[depth], 0) & alive if depth < end else 0
            for bit in _bits(alive & ~held):
                result[name[bit]] = depth
            alive, low = held, depth + 1
        return result

    def _walk(self, blocks: Sequence[int], alive: int) -> dict[str, int]:
        """The matches of workers ``alive`` (each holds ``blocks[0]``), block by block."""
        holders, result = self._holders, {}
        for depth in range(1, len(blocks)):
            held = holders.get(blocks[depth], 0) & alive
            if held == alive:
                continue
            for bit in _bits(alive & ~held):
                result[self._name[bit]] = depth
            alive = held
            if not alive:
                return result
        for bit in _bits(alive):
            result[self._name[bit]] = len(blocks)
        return result

    def holds(self, worker: str, block: int) -> bool:
        bit = self._bit.get(worker)
        return bit is not None and bool(self._holders.get(block, 0) >> bit & 1)

    def last_access(self, worker: str, block: int) -> float | None:
        lru = self._lru.get(worker)
        return None if lru is None else lru.get(block)

    def blocks_of(self, worker: str) -> int:
        lru = self._lru.get(worker)
        return 0 if lru is None else len(lru)

    def tokens_of(self, worker: str) -> int:
        return round(self.blocks_of(worker) * self.block_value(worker))

    def is_loose(self, worker: str) -> bool:
        """Whether ``worker`` may hold a block without its parent (matched block by block, ``match``)."""
        return worker in self._loose_left

    def fill(self, worker: str) -> float:
        """The fraction of ``worker``'s capacity its entries use (1.0: full, an insert evicts)."""
        return self.fills.get(worker, 0.0)

    def turnover(self, worker: str, now: float) -> float | None:
        """How long an untouched block stays in ``worker``'s entries: the age of its least recent one (the
        next to be evicted). None while they are below its capacity (nothing was evicted for room)."""
        lru = self._lru.get(worker)
        if not lru or len(lru) < self._cap_blocks[worker]:
            return None
        return max(0.0, now - next(iter(lru.values())))

    def capacity_tokens(self, worker: str) -> int:
        """The learned capacity (what the index keeps for ``worker``)."""
        return round(self._cap_blocks.get(worker, 0) * self.block_value(worker))

    def capacity_blocks(self, worker: str) -> int:
        return self._cap_blocks.get(worker, 0)

    def ceiling_tokens(self, worker: str) -> int:
        """The known capacity (configured or scraped), the most the learned one may reach."""
        return round(self._ceiling.get(worker, 0) * self.block_value(worker))

    def __len__(self) -> int:
        return self._total

    def unique_blocks(self) -> int:
        return len(self._holders)

    # ------------------------------------------------------------ updates

    def insert(self, worker: str, blocks: Sequence[int], now: float, chained: bool = True) -> None:
        """Record that ``worker`` now caches ``blocks`` (a chained prefix), deepest touched first.
        ``chained=False``: blocks that need not be whole chains (the worker turns loose, see ``match``)."""
        self._insert(worker, blocks, now, chained, self._touch)

    def insert_chain(self, worker: str, blocks: Sequence[int], now: float) -> None:
        """``insert`` of one chain (``blocks[i]`` the parent of ``blocks[i + 1]``: a request's key, or its
        extension), the same index after it. A chain-closed worker holds a prefix of the chain (a held
        block's parent is held), found by bisection: the blocks before it are moved, those after it added,
        without ``insert``'s membership test per block (``_touch_chain``: an inline copy of ``_touch`` for
        speed, held equal to ``insert`` by ``tests/routing/test_index.py``). A loose worker is touched as
        ``insert`` does it."""
        self._insert(worker, blocks, now, True, self._touch_chain)

    def _insert(self, worker: str, blocks: Sequence[int], now: float, chained: bool, touch: _Touch) -> None:
        """``insert``'s steps, the blocks touched by ``touch`` (``_touch`` for a loose worker)."""
        self.expire(now)
        lru = self._lru.get(worker)
        if lru is None or not blocks:
            return
        if self.max_prefix_blocks is not None:
            blocks = blocks[: self.max_prefix_blocks]
        before, value = len(lru), 1 << self._bit[worker]
        (self._touch if self._loose & value else touch)(lru, value, blocks, now)
        self._grown(worker, lru, before, chained)

    def _touch_chain(self, lru: LRU, value: int, blocks: Sequence[int], now: float) -> None:
        """``_touch`` of a chain on a chain-closed worker: the held prefix (bisected) moved, the rest added,
        without a membership test per block (``touch_chain_py``, in the compiled build a C loop). Exact
        whatever ``blocks`` are: a deeper block found held is moved, and should the prefix have a hole (a
        list that was not one chain), its holders are set."""
        held = self._held(blocks, value)
        holders = self._holders
        expected = len(lru) + len(blocks) - held
        expected -= _chain_touch(lru, holders, value, blocks, held, now)
        if len(lru) != expected:  # a hole in the "held" prefix was added to the LRU: hold it too
            for block in blocks[:held]:
                holders[block] = holders.get(block, 0) | value

    def _touch(self, lru: LRU, value: int, blocks: Sequence[int], now: float) -> None:
        """Touch ``blocks`` deepest first (each moved to the most recent end at ``now``, added if absent):
        ``touch_py``, in the compiled build a C loop."""
        _blocks_touch(lru, self._holders, value, blocks, now)

    def _held(self, blocks: Sequence[int], value: int) -> int:
        """How many leading blocks of the chain ``blocks`` the chain-closed worker of bit ``value`` holds
        (its held blocks of a chain are a prefix of it): by bisection."""
        get = self._holders.get
        if get(blocks[-1], 0) & value:
            return len(blocks)
        if not get(blocks[0], 0) & value:
            return 0
        low, high = 1, len(blocks) - 1  # blocks[:low] held, blocks[high] not
        while low < high:
            mid = (low + high) // 2
            if get(blocks[mid], 0) & value:
                low = mid + 1
            else:
                high = mid
        return low

    def _grown(self, worker: str, lru: LRU, before: int, chained: bool) -> None:
        """After an insert into ``worker``'s ``lru`` (``before`` entries): counts, looseness and bounds."""
        self._total += len(lru) - before
        self._resized(worker, before, len(lru))
        if not chained:
            self._loosen(worker, lru)
        self._shrink(worker)
        self._enforce_total()

    def trim(self, worker: str, blocks: Sequence[int], keep: int) -> int:
        """Forget ``blocks[keep:]`` on ``worker`` (engine feedback); returns how many were removed."""
        lru = self._lru.get(worker)
        if lru is None:
            return 0
        removed = 0
        for block in blocks[max(keep, 0) :]:
            if lru.pop(block, None) is not None:
                self._unhold(block, self._bit[worker])
                removed += 1
        self._total -= removed
        self._resized(worker, len(lru) + removed, len(lru))
        if removed:
            self._loosen(worker, lru)
        return removed

    def forget_older(self, worker: str, cutoff: float) -> int:
        """Forget ``worker``'s entries last used at or before ``cutoff`` (its cache evicted them)."""
        lru = self._lru.get(worker)
        if lru is None:
            return 0
        return self._pop_front_while(worker, lru, lambda ts: ts <= cutoff)

    def expire(self, now: float) -> int:
        """Drop entries older than the TTL (checked at most once a second)."""
        if now < self._next_expiry:
            return 0
        self._next_expiry = now + 1.0
        cutoff = now - self.ttl_s
        return sum(self._pop_front_while(w, lru, lambda ts: ts < cutoff) for w, lru in self._lru.items())

    # ------------------------------------------------------------ internals

    def _pop_front_while(self, worker: str, lru: LRU, cond: Callable[[float], bool]) -> int:
        bit, removed = self._bit[worker], 0
        while lru:
            block, ts = next(iter(lru.items()))
            if not cond(ts):
                break
            lru.popitem(last=False)
            self._unhold(block, bit)
            removed += 1
        self._total -= removed
        self._resized(worker, len(lru) + removed, len(lru))
        if removed and worker in self._loose_left:
            self._left_front(worker, removed, lru)
        return removed

    def _evict(self, worker: str, count: int) -> None:
        """Evict ``worker``'s ``count`` least recent entries (it holds at least that many); its size bucket
        and looseness updated once, as ``count`` single evictions would leave them."""
        lru = self._lru[worker]
        _lru_evict(lru, self._holders, 1 << self._bit[worker], count)  # ``evict_py``, compiled a C loop
        self._total -= count
        self.evictions += count
        self._resized(worker, len(lru) + count, len(lru))
        if worker in self._loose_left:
            self._left_front(worker, count, lru)

    def _loosen(self, worker: str, lru: LRU) -> None:
        """``worker`` may now hold a block without its parent: walked, not bisected, until its present
        entries have left from the least recent end (``match``)."""
        if not lru:
            return
        self._loose |= 1 << self._bit[worker]
        self._loose_left[worker] = max(self._loose_left.get(worker, 0), len(lru))

    def _left_front(self, worker: str, removed: int, lru: LRU) -> None:
        """``removed`` of a loose worker's least recent entries left; closed again once enough did."""
        left = self._loose_left[worker] - removed
        if left > 0 and lru:
            self._loose_left[worker] = left
        else:
            del self._loose_left[worker]
            self._loose &= ~(1 << self._bit[worker])

    def _shrink(self, worker: str) -> None:
        excess = len(self._lru[worker]) - self._cap_blocks[worker]
        if excess > 0:  # in one go: a request of new blocks on a full worker evicts as many
            self._evict(worker, excess)

    def _enforce_total(self) -> None:
        while self._total > self.max_total_blocks:  # one at a time: the fullest worker may change
            self._evict(self._fullest_worker(), 1)

    def _resized(self, worker: str, old: int, new: int) -> None:
        """Move ``worker`` from the bucket of ``old`` blocks to that of ``new`` (O(1))."""
        if old == new:
            return
        cap = self._cap_blocks.get(worker)
        if cap is not None:
            self.fills[worker] = new / cap
        if old:
            bucket = self._by_size[old]
            del bucket[worker]
            if not bucket:
                del self._by_size[old]
        if new:
            self._by_size.setdefault(new, {})[worker] = None
            self._fullest = max(self._fullest, new)

    def _fullest_worker(self) -> str:
        """The worker holding the most blocks (the first to get there among equals); needs one."""
        while self._fullest not in self._by_size:
            self._fullest -= 1
        return next(iter(self._by_size[self._fullest]))

    def _unhold(self, block: int, bit: int) -> None:
        unhold(self._holders, block, 1 << bit)
