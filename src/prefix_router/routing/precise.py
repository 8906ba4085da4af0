"""Precise mode: what each event-fed worker's engine says it caches, as the router's own block keys.

An engine's KV cache events (``prefix_router.events``) name blocks by the engine's hashes, which depend on
the engine's hash function and a per-process random seed: never reproduced here. Instead every stored
block's ``token_ids`` are hashed again by the router's own chain (``routing/hashing.py``): a chain's first
block seeded by ``precise_seed(model, lora, salt)``, each next one by its parent's router key, the blocks
``block_tokens`` token ids each (the engine's block size, ``routing.events.block_tokens``). A request's
``precise_blocks`` are its exact token ids cut the same way (``routing/keys.py``), so a request's block
``i`` equals a stored block's key exactly when the engine holds that prefix. Per worker, a bounded map
``engine hash -> router key`` resolves parents and removals.

- Tiers: a block is held while some (medium, group) holds it ("GPU" for events without a medium); a
  removal drops one tier. ``AllBlocksCleared`` (any medium) forgets the worker's view.
- Extra keys: the first block's strings other than the LoRA name are the cache salt; anything else
  (multimodal ids, prompt-embedding digests) is folded into that block's key, which then no request
  matches (its media are not hashed by the router): under-predicted, never over.
- Sequence: ``observe_seq`` judges each message's sequence number: ``NEXT``; ``GAP`` (the caller replays
  or calls ``mark_stale``); ``RESTART`` (not above the last: a new engine process) clears the view, but
  only when the caller says the engine confirmed a restart (``confirmed``: its own health checks, not the
  stream); unconfirmed, ``REFUSED``: nothing applied, the last sequence kept, the view stale for
  ``stale_hold_s`` (counted ``refused_restarts``). A block size other than ``block_tokens`` switches the
  worker to the approximate view only when the engine's own metrics state that size (``apply``'s
  ``engine_block``); otherwise the event is dropped (counted ``block_size_mismatches``).
- Clears (a restart or ``AllBlocksCleared``): ``on_clear(name)`` is told (the router drops that worker's
  approximate index too: the engine said its cache is empty, and the index's fill steers the cost model).
- Speculative entries: at dispatch (``speculate``) a request's blocks are held for ``speculative_ttl_s``
  (so a burst of one new prefix does not scatter before the first event), and so are, when it finishes,
  the blocks of its reply that the next turn will carry (the engine caches them as it generates; their
  events may still be on the wire when that turn comes); confirmed (dropped from the speculative table)
  by a BlockStored of the same key, else they expire. They steer routing, and the router charges the
  load with them; predictions count confirmed blocks only.
- Freshness (``fresh``): a worker's view is used only while no gap left it stale (``stale_hold_s``), its
  events' block size is the configured one, and it has not gone silent: a dispatch that should have stored
  new blocks and no message for ``silence_s`` since. Otherwise the router uses its approximate index for
  that worker (kept up to date all along), and ``summary`` says why.
- Last homes (``home``): for each block a BlockRemoved took from a worker, that worker (the latest
  removal wins), until the worker has stored more blocks since than it holds now (a cache's worth: its
  place there is taken, as an approximate index forgets an entry after a capacity of newer ones). When a
  request's next block is held nowhere, the router prefers that engine, under the sessions' load cap
  (``routing.sessions.load_factor``, ``load_slack``; the ``home`` step of ``routing/placement.py``): a
  tenant whose prefix was evicted everywhere re-fills where it lived instead of displacing another
  tenant's prefix elsewhere, which would then move too; a home that turned its cache over since (more
  working set than cache) is no home, so an overloaded engine's tenants still spread.
- Bounds: ``max_blocks_per_worker`` engine hashes (the oldest stored goes first, with its key),
  ``max_speculative_per_worker`` speculative keys (the oldest go first), ``max_homes`` last homes (the
  least recently removed go first).
"""

from __future__ import annotations

from array import array
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, NamedTuple

from pydantic import Field

from prefix_router.events import AllBlocksCleared, BlockRemoved, BlockStored, EngineEvent
from prefix_router.routing.bounded import BoundedLRU
from prefix_router.routing.hashing import hash_bytes, namespace_seed
from prefix_router.settings import Section

BlockHash = int | bytes
_GPU = "GPU"


class PreciseSettings(Section):
    """``routing.events``: the event-fed view of workers configured with ``kv_events`` (key mode
    ``events``); its constants are ``PreciseTuning``'s."""

    block_tokens: int = Field(default=16, gt=0, le=1 << 20)  # the engines' KV block size (CPU vLLM: 128)
    # token parity without a local template: an event-fed engine renders the request (node/request/render.py)
    render: bool = True


class PreciseTuning(NamedTuple):
    """The event-fed view's bounds and timings: constants, each a constructor argument of ``PreciseView``
    for the tests that shorten them.

    ``max_blocks_per_worker``: engine hash -> key entries per worker, a memory bound (1 M blocks: 16 M
    tokens at vLLM's 16-token blocks, more than one engine's cache); ``speculative_ttl_s``: how long a
    dispatched prefix steers routing before its events must have come; ``silence_s``: five such TTLs with
    new blocks expected and no message; ``stale_hold_s``: the approximate view after an unrepaired gap;
    ``max_speculative_per_worker`` and ``max_homes``: 64 Ki blocks each (a 1 M-token prompt's blocks)."""

    max_blocks_per_worker: int = 1_000_000
    speculative_ttl_s: float = 2.0
    max_speculative_per_worker: int = 65_536
    silence_s: float = 10.0  # new blocks expected and no event this long: stale
    stale_hold_s: float = 30.0  # after an unrepaired gap: approximate this long
    max_homes: int = 65_536  # removed block key -> the worker that held it last


def precise_seed(model: str, lora: str | None, salt: str | None) -> int:
    """The namespace of a chain's first block: what the engine shares a cache across."""
    return namespace_seed(("precise", model if lora is None else lora, salt))


def precise_chain(
    ids: Sequence[int], block_tokens: int, seed: int, limit: int | None = None
) -> tuple[int, ...]:
    """The router keys of the full blocks of ``ids`` (what ``PreciseView`` computes from events)."""
    out: list[int] = []
    prev = seed
    end = len(ids) - len(ids) % block_tokens
    if limit is not None:
        end = min(end, limit - limit % block_tokens)
    data = array("I", ids[:end]).tobytes()
    size = block_tokens * 4
    for start in range(0, len(data), size):
        prev = hash_bytes(data[start : start + size], prev)
        out.append(prev)
    return tuple(out)


class SeqVerdict(StrEnum):
    FIRST = "first"
    NEXT = "next"
    GAP = "gap"
    RESTART = "restart"
    REFUSED = "refused"  # a restart the engine did not confirm: the message is not applied


class Staleness(StrEnum):
    FRESH = "fresh"
    GAP = "gap"  # a sequence gap not repaired by a replay
    SILENT = "silent"  # new blocks expected, no event for silence_s
    BLOCK_SIZE = "block_size"  # the events' block size is not routing.events.block_tokens


@dataclass(slots=True)
class PreciseStats:
    messages: int = 0
    events: int = 0
    stored_blocks: int = 0
    removed_blocks: int = 0
    orphan_blocks: int = 0  # stored under a parent this view does not know: not held
    unknown_removals: int = 0
    skipped_events: int = 0  # of a type the decoder does not know
    clears: int = 0  # AllBlocksCleared
    restarts: int = 0  # sequence not above the last
    refused_restarts: int = 0  # the same, the engine not confirming it: not applied
    gaps: int = 0
    replays: int = 0  # gaps repaired by a replay
    evicted_mappings: int = 0  # engine hashes dropped for the bound
    speculative_confirmed: int = 0
    speculative_expired: int = 0
    block_size_mismatches: int = 0
    # predictions on this view against the engine's reports
    reports: int = 0
    within_block: int = 0
    above_report: int = 0
    above_prompt: int = 0

    def as_dict(self) -> dict[str, int]:
        return {name: getattr(self, name) for name in self.__slots__}


@dataclass(slots=True)
class _Worker:
    bit: int
    model: str
    keys: OrderedDict[BlockHash, tuple[int, set[tuple[str, int | None]]]] = field(default_factory=OrderedDict)
    held: dict[int, int] = field(default_factory=dict)  # router key -> engine hashes naming it
    spec: OrderedDict[int, float] = field(default_factory=OrderedDict)  # key -> expiry
    last_seq: int | None = None
    last_message_at: float | None = None
    expect_since: float | None = None  # a dispatch expected new blocks, no message since
    stale_until: float = 0.0
    wrong_block_size: int | None = None
    stats: PreciseStats = field(default_factory=PreciseStats)


@dataclass(frozen=True, slots=True)
class PreciseMatch:
    fresh: list[str]
    steered: dict[str, int]
    confirmed: dict[str, int]


class PreciseView:
    def __init__(self, cfg: PreciseSettings, tuning: PreciseTuning | None = None) -> None:
        self.cfg = cfg
        self.tuning = tuning if tuning is not None else PreciseTuning()
        self._workers: dict[str, _Worker] = {}
        self._name: dict[int, str] = {}
        self._confirmed: dict[int, int] = {}  # router key -> bits of the workers holding it
        self._spec: dict[int, int] = {}  # router key -> bits of the workers it is speculated on
        # removed key -> (last holder, its stored_blocks count at the removal)
        self._homes: BoundedLRU[int, tuple[str, int]] = BoundedLRU(self.tuning.max_homes)
        self.on_clear: Callable[[str], None] | None = None  # the engine said its cache is empty

    # ------------------------------------------------------------ workers

    def add_worker(self, name: str, model: str) -> None:
        """``name`` publishes events; ``model``: the name its engine serves (the base of its seeds)."""
        if name in self._workers:
            self._workers[name].model = model
            return
        bit = min(set(range(len(self._name) + 1)) - set(self._name))
        self._workers[name] = _Worker(bit, model)
        self._name[bit] = name

    def remove_worker(self, name: str) -> None:
        worker = self._workers.pop(name, None)
        if worker is None:
            return
        self._forget(worker)
        self._drop_spec(worker, len(worker.spec))
        for key in [k for k, (home, _at) in self._homes.items() if home == name]:
            self._homes.pop(key)
        del self._name[worker.bit]

    def __contains__(self, name: object) -> bool:
        return name in self._workers

    def __bool__(self) -> bool:
        return bool(self._workers)

    def workers(self) -> list[str]:
        return list(self._workers)

    # ------------------------------------------------------------ freshness

    def staleness(self, name: str, now: float) -> Staleness:
        worker = self._workers[name]
        if worker.wrong_block_size is not None:
            return Staleness.BLOCK_SIZE
        if now < worker.stale_until:
            return Staleness.GAP
        if worker.expect_since is not None and now - worker.expect_since > self.tuning.silence_s:
            return Staleness.SILENT
        return Staleness.FRESH

    def fresh(self, name: str, now: float) -> bool:
        return name in self._workers and self.staleness(name, now) == Staleness.FRESH

    def mark_stale(self, name: str, now: float) -> None:
        """A gap the caller could not repair: the approximate view for ``stale_hold_s``."""
        worker = self._workers.get(name)
        if worker is not None:
            worker.stale_until = now + self.tuning.stale_hold_s

    # ------------------------------------------------------------ events

    def observe_seq(
        self, name: str, seq: int, now: float, reconnected: bool = False, *, confirmed: bool = True
    ) -> SeqVerdict:
        """Judge a live message's sequence number (before its events are applied). ``RESTART`` clears.

        A restart is a sequence not above the last, or, when the message is the first on a connection
        that replaced a dropped one (``reconnected``), any sequence but the next: a new engine process
        counts from 0, and by the time the router hears it again it may have passed the old one's last.
        ``confirmed``: whether the engine itself confirmed a restart (the caller's judgment, from outside
        the stream); when it did not, a restart is ``REFUSED``: the view kept but stale, the sequence and
        the silence clock unchanged, the message not to be applied."""
        worker = self._workers[name]
        last = worker.last_seq
        worker.stats.messages += 1
        restart = last is not None and seq != last + 1 and (seq <= last or reconnected)
        if restart and not confirmed:
            worker.stats.refused_restarts += 1
            self.mark_stale(name, now)
            return SeqVerdict.REFUSED
        worker.last_seq = seq
        worker.last_message_at, worker.expect_since = now, None
        if last is None:
            return SeqVerdict.FIRST
        if seq == last + 1:
            return SeqVerdict.NEXT
        if restart:
            worker.stats.restarts += 1
            self._cleared(name, worker)
            return SeqVerdict.RESTART
        worker.stats.gaps += 1
        return SeqVerdict.GAP

    def restore_seq(self, name: str, seq: int) -> None:
        """The message judged last was not the engine's (the caller found out): ``seq`` is the last
        sequence again."""
        worker = self._workers.get(name)
        if worker is not None:
            worker.last_seq = seq

    def count_replay(self, name: str) -> None:
        worker = self._workers.get(name)
        if worker is not None:
            worker.stats.replays += 1

    def apply(
        self,
        name: str,
        events: Sequence[EngineEvent],
        now: float,
        skipped: int = 0,
        engine_block: int | None = None,
    ) -> None:
        """Apply a message's events in order. ``engine_block``: the block size the engine's own metrics
        state (None: unknown); a stored event of another size than ``block_tokens`` switches the worker to
        the approximate view only when it is that one, else it is dropped."""
        worker = self._workers.get(name)
        if worker is None:
            return
        worker.stats.events += len(events)
        worker.stats.skipped_events += skipped
        for event in events:
            if isinstance(event, BlockStored):
                self._stored(worker, event, engine_block)
            elif isinstance(event, BlockRemoved):
                self._removed(worker, event)
            elif isinstance(event, AllBlocksCleared):
                worker.stats.clears += 1
                self._cleared(name, worker)

    def _stored(self, worker: _Worker, event: BlockStored, engine_block: int | None) -> None:
        if event.block_size != self.cfg.block_tokens:
            worker.stats.block_size_mismatches += 1
            if event.block_size == engine_block:  # the engine's metrics say so too
                worker.wrong_block_size = event.block_size
            return
        tier = (event.medium or _GPU, event.group_idx)
        if event.parent_block_hash is None:
            parent, salt, opaque = None, *_salt(event)
            prev = precise_seed(worker.model, event.lora_name, salt)
        else:
            known = worker.keys.get(event.parent_block_hash)
            if known is None:
                worker.stats.orphan_blocks += len(event.block_hashes)
                return
            parent, opaque, prev = known[0], None, known[0]
        size = event.block_size
        data = array("I", event.token_ids).tobytes()
        for i, engine_hash in enumerate(event.block_hashes):
            block = data[i * size * 4 : (i + 1) * size * 4]
            extra = _foreign_extra(event, i, parent is None and i == 0, opaque)
            if extra:
                block += b"\x00extra" + repr(extra).encode("utf-8", "backslashreplace")
            prev = hash_bytes(block, prev)
            self._hold(worker, engine_hash, prev, tier)
        worker.stats.stored_blocks += len(event.block_hashes)

    def _hold(self, worker: _Worker, engine_hash: BlockHash, key: int, tier: tuple[str, int | None]) -> None:
        entry = worker.keys.get(engine_hash)
        if entry is not None and entry[0] == key:
            entry[1].add(tier)
            return
        if entry is not None:  # the engine reused a hash for other tokens: the new one wins
            self._unhold(worker, engine_hash)
        while len(worker.keys) >= self.tuning.max_blocks_per_worker:
            self._unhold(worker, next(iter(worker.keys)))
            worker.stats.evicted_mappings += 1
        worker.keys[engine_hash] = (key, {tier})
        count = worker.held.get(key, 0)
        worker.held[key] = count + 1
        if not count:
            self._confirmed[key] = self._confirmed.get(key, 0) | 1 << worker.bit
        if worker.spec.pop(key, None) is not None:
            worker.stats.speculative_confirmed += 1
            self._unmask(self._spec, key, worker.bit)

    def _removed(self, worker: _Worker, event: BlockRemoved) -> None:
        tier = (event.medium or _GPU, event.group_idx)
        for engine_hash in event.block_hashes:
            entry = worker.keys.get(engine_hash)
            if entry is None:
                worker.stats.unknown_removals += 1
                continue
            entry[1].discard(tier)
            if not entry[1]:
                self._unhold(worker, engine_hash)
                self._homes.set(entry[0], (self._name[worker.bit], worker.stats.stored_blocks))
                worker.stats.removed_blocks += 1

    def _unhold(self, worker: _Worker, engine_hash: BlockHash) -> None:
        key, _ = worker.keys.pop(engine_hash)
        count = worker.held[key] - 1
        if count:
            worker.held[key] = count
        else:
            del worker.held[key]
            self._unmask(self._confirmed, key, worker.bit)

    def _cleared(self, name: str, worker: _Worker) -> None:
        """The engine's cache emptied (a reset, a new process): what it holds is what follows, so an
        earlier gap no longer leaves the view stale."""
        self._forget(worker)
        worker.stale_until = 0.0
        if self.on_clear is not None:
            self.on_clear(name)

    def _forget(self, worker: _Worker) -> None:
        for key in worker.held:
            self._unmask(self._confirmed, key, worker.bit)
        worker.keys.clear()
        worker.held.clear()

    def clear(self, name: str) -> None:
        """Forget what ``name`` holds (its engine was ejected: it probably restarted)."""
        worker = self._workers.get(name)
        if worker is not None:
            self._forget(worker)
            self._drop_spec(worker, len(worker.spec))

    # ------------------------------------------------------------ speculation

    def speculate(self, name: str, blocks: Sequence[int], confirmed: int, now: float) -> None:
        """A request of ``blocks`` was sent to ``name`` (or finished there: its prompt and reply),
        ``confirmed`` of them held: the rest not held yet are held speculatively until confirmed or
        ``speculative_ttl_s`` passes; when there are any, new full blocks are expected."""
        worker = self._workers.get(name)
        if worker is None or len(blocks) <= confirmed:
            return
        self._expire(worker, now)
        until = now + self.tuning.speculative_ttl_s
        bit, expected = 1 << worker.bit, False
        for key in blocks[confirmed:]:
            if key in worker.held:
                continue
            if key not in worker.spec:
                self._spec[key] = self._spec.get(key, 0) | bit
            worker.spec[key] = until
            worker.spec.move_to_end(key)
            expected = True
        extra = len(worker.spec) - self.tuning.max_speculative_per_worker
        if extra > 0:
            self._drop_spec(worker, extra)
        if expected and worker.expect_since is None:
            worker.expect_since = now

    def _expire(self, worker: _Worker, now: float) -> None:
        spec, expired = worker.spec, 0
        while spec:
            key, until = next(iter(spec.items()))
            if until > now:
                break
            del spec[key]
            self._unmask(self._spec, key, worker.bit)
            expired += 1
        worker.stats.speculative_expired += expired

    def _drop_spec(self, worker: _Worker, count: int) -> None:
        for _ in range(min(count, len(worker.spec))):
            key, _until = worker.spec.popitem(last=False)
            self._unmask(self._spec, key, worker.bit)

    # ------------------------------------------------------------ queries

    def match(self, blocks: Sequence[int], now: float) -> PreciseMatch:
        """The fresh workers, and per fresh worker the leading blocks held confirmed or speculatively
        (``steered``) and confirmed only (``confirmed``); workers with no match are absent."""
        fresh, names = 0, []
        for name, worker in self._workers.items():
            self._expire(worker, now)
            if self.staleness(name, now) == Staleness.FRESH:
                fresh |= 1 << worker.bit
                names.append(name)
        confirmed = self._walk(blocks, fresh, self._confirmed, None)
        steered = self._walk(blocks, fresh, self._confirmed, self._spec)
        return PreciseMatch(names, steered, confirmed)

    def _walk(
        self, blocks: Sequence[int], alive: int, first: dict[int, int], second: dict[int, int] | None
    ) -> dict[str, int]:
        result: dict[str, int] = {}
        for depth, key in enumerate(blocks):
            held = first.get(key, 0) | (second.get(key, 0) if second is not None else 0)
            gone = alive & ~held
            for bit in _bits(gone):
                if depth:
                    result[self._name[bit]] = depth
            alive &= held
            if not alive:
                return result
        for bit in _bits(alive):
            result[self._name[bit]] = len(blocks)
        return result

    def home(self, key: int) -> str | None:
        """The worker whose engine removed block ``key`` last (whether or not some worker holds it again)
        while it has stored at most as many blocks since as it holds now; None otherwise, or if no removal
        of it is remembered."""
        entry = self._homes.get(key)
        if entry is None:
            return None
        name, at = entry
        worker = self._workers.get(name)
        if worker is None or worker.stats.stored_blocks - at > len(worker.held):
            return None
        return name

    def homes(self) -> int:
        """How many last homes are remembered (at most ``max_homes``)."""
        return len(self._homes)

    def held_blocks(self, name: str) -> int:
        worker = self._workers.get(name)
        return 0 if worker is None else len(worker.held)

    def speculative_blocks(self, name: str) -> int:
        worker = self._workers.get(name)
        return 0 if worker is None else len(worker.spec)

    def mapped_hashes(self, name: str) -> int:
        worker = self._workers.get(name)
        return 0 if worker is None else len(worker.keys)

    def stats(self, name: str) -> PreciseStats:
        return self._workers[name].stats

    def report(self, name: str, predicted: int, reported: int, prompt: int | None) -> None:
        """The engine's cached tokens for a request predicted on this view: agreement counts."""
        worker = self._workers.get(name)
        if worker is None:
            return
        stats = worker.stats
        stats.reports += 1
        stats.within_block += abs(predicted - reported) <= self.cfg.block_tokens
        stats.above_report += predicted > reported
        stats.above_prompt += prompt is not None and predicted > prompt

    def summary(self, name: str, now: float) -> dict[str, Any]:
        worker = self._workers[name]
        return {
            "state": self.staleness(name, now).value,
            "blocks": {"events": len(worker.held), "speculative": len(worker.spec)},
            "mapped_hashes": len(worker.keys),
            "last_seq": worker.last_seq,
            "last_message_age_s": None if worker.last_message_at is None else now - worker.last_message_at,
            **worker.stats.as_dict(),
        }

    def _unmask(self, table: dict[int, int], key: int, bit: int) -> None:
        mask = table.get(key, 0) & ~(1 << bit)
        if mask:
            table[key] = mask
        else:
            table.pop(key, None)


def _salt(event: BlockStored) -> tuple[str | None, tuple[Any, ...] | None]:
    """The cache salt among a chain's first block's extra keys, and what else they hold (opaque)."""
    if not event.extra_keys or event.extra_keys[0] is None:
        return None, None
    first = event.extra_keys[0]
    items = first if isinstance(first, tuple) else (first,)
    strings = [x for x in items if isinstance(x, str) and x != event.lora_name]
    others = tuple(x for x in items if not isinstance(x, str))
    if len(strings) > 1:  # several strings (media ids besides the salt): the salt is the last
        others += tuple(strings[:-1])
    return (strings[-1] if strings else None), (others or None)


def _foreign_extra(event: BlockStored, i: int, first: bool, opaque: tuple[Any, ...] | None) -> Any:
    """What of block ``i``'s extra keys the router's request keys do not hold (folded into its key)."""
    if first:
        return opaque
    if not event.extra_keys or event.extra_keys[i] is None:
        return None
    items = event.extra_keys[i]
    items = items if isinstance(items, tuple) else (items,)
    rest = tuple(x for x in items if x != event.lora_name)
    return rest or None


def _bits(mask: int) -> Iterator[int]:
    while mask:
        low = mask & -mask
        yield low.bit_length() - 1
        mask ^= low
