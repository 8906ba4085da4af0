"""Precise mode in the simulator (simulated): each simulated engine's cache publishes KV cache events to
the router's event-fed views, as vLLM's do, and faults (restarts, cache resets) happen at given times.

The simulated engine names its blocks by hashes, not token ids, so every block is given the token ids
``pseudo_tokens(hash)`` (its 64-bit hash as two ids, then zeros, ``block_tokens`` in all); a request's
precise key is the same ids of its engine blocks cut by ``precise_chain``: the router's token parity is
exact, as with a local tokenizer. Events go through the real decoder's values (``prefix_router.events``)
and ``PreciseView``'s sequence checks. Each message reaches the router ``lag_s`` of simulated time after
the engine published it (0: at once), in the order published: until then the router routes on the view
it had, as a real router does while the engine's message is on the wire. Messages in transit wait in a
FIFO (bounded by ``max_pending``; the caller ``deliver``s the due ones before each simulated event). A
restarted engine announces nothing (``restart``): the router learns of it from the new process's first
message, its sequence starting again; a cache reset is announced (``AllBlocksCleared``). A parent map
(bounded by ``max_parents``) names each block's parent, as an engine's ``BlockStored`` does.
"""

from __future__ import annotations

import dataclasses
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence

from prefix_router.events import AllBlocksCleared, BlockRemoved, BlockStored, EngineEvent
from prefix_router.lab.sim.engine import EngineRequest
from prefix_router.routing import Router, RouteRequest, SeqVerdict, precise_chain, precise_seed

MODEL = "sim"


def pseudo_tokens(block: int, block_tokens: int) -> list[int]:
    return [block & 0xFFFFFFFF, block >> 32 & 0xFFFFFFFF] + [0] * (block_tokens - 2)


class EventFeed:
    """Connects the engines' caches to the router's event-fed views (``attach``), and gives requests
    their precise keys (``with_precise``)."""

    def __init__(
        self,
        router: Router,
        names: Sequence[str],
        block_tokens: int,
        max_parents: int = 4_000_000,
        lag_s: float = 0.0,
        max_pending: int = 1_000_000,
    ):
        if block_tokens < 2:
            raise ValueError("pseudo tokens need blocks of at least 2 tokens")
        if lag_s < 0:
            raise ValueError("lag_s must not be negative")
        self.router, self.names, self.block_tokens = router, list(names), block_tokens
        self.lag_s = lag_s
        self._parents: OrderedDict[int, int | None] = OrderedDict()
        self._max_parents = max_parents
        # messages in transit: (due, instance, seq, event), in the order published (one lag: due in order)
        self._pending: deque[tuple[float, int, int, EngineEvent]] = deque()
        self._max_pending = max_pending
        self._seq = [0] * len(self.names)
        self._quiet: int | None = None  # restarting: its cache's reset is not announced
        self.cleared_at: list[float | None] = [None] * len(self.names)  # the router's last clear of each
        self._seed = precise_seed(MODEL, None, None)
        self.now = 0.0
        for name in self.names:
            router.add_event_worker(name, MODEL)

    def attach(self, instance: int, cache: object) -> None:
        def listener(kind: str, block: int) -> None:
            self._publish(instance, kind, block)

        cache.listener = listener  # type: ignore[attr-defined]

    def with_precise(self, route: RouteRequest, engine: EngineRequest) -> RouteRequest:
        """``route`` with the precise key of ``engine``'s blocks (and their parents remembered)."""
        self._remember(engine.extension or engine.blocks)
        precise = self.chain(engine.blocks)
        return dataclasses.replace(route, precise_blocks=precise, precise_tokens=engine.prompt_tokens)

    def extension(self, engine: EngineRequest) -> tuple[int, ...]:
        """The precise key of ``engine``'s prompt and reply as its next turn carries them (empty: no
        reply blocks), what the proxy computes in exact mode."""
        if len(engine.extension) <= len(engine.blocks):
            return ()
        return self.chain(engine.extension)

    def chain(self, blocks: Sequence[int]) -> tuple[int, ...]:
        ids: list[int] = []
        for block in blocks:
            ids += pseudo_tokens(block, self.block_tokens)
        return precise_chain(ids, self.block_tokens, self._seed)

    def restart(self, instance: int, reset: Callable[[], object]) -> None:
        """The engine process restarted: ``reset`` drops its cache, and the new process says nothing of it
        (a restarted vLLM publishes no ``AllBlocksCleared``): its sequence starts at 0 again with its
        first message, when it next stores a block, and the router's view clears when that arrives."""
        self._seq[instance] = 0
        self._quiet = instance
        try:
            reset()
        finally:
            self._quiet = None

    def _remember(self, chain: Sequence[int]) -> None:
        parents, parent = self._parents, None
        for block in chain:
            if block not in parents:
                parents[block] = parent
                if len(parents) > self._max_parents:
                    parents.popitem(last=False)
            parent = block

    def _publish(self, instance: int, kind: str, block: int) -> None:
        event: EngineEvent
        if kind == "cleared" and instance == self._quiet:
            return
        if kind == "stored":
            tokens = tuple(pseudo_tokens(block, self.block_tokens))
            event = BlockStored((block,), self._parents.get(block), tokens, self.block_tokens)
        elif kind == "removed":
            event = BlockRemoved((block,))
        else:
            event = AllBlocksCleared()
        seq, self._seq[instance] = self._seq[instance], self._seq[instance] + 1
        if self.lag_s <= 0:
            self._apply(instance, seq, event, self.now)
            return
        if len(self._pending) >= self._max_pending:
            raise OverflowError(f"more than {self._max_pending} KV event messages in transit")
        self._pending.append((self.now + self.lag_s, instance, seq, event))

    def deliver(self, now: float) -> int:
        """Apply every message in transit that is due by ``now``, each at its own due time; returns how
        many."""
        pending, done = self._pending, 0
        while pending and pending[0][0] <= now:
            due, instance, seq, event = pending.popleft()
            self._apply(instance, seq, event, due)
            done += 1
        return done

    def in_transit(self) -> int:
        return len(self._pending)

    def _apply(self, instance: int, seq: int, event: EngineEvent, at: float) -> None:
        precise, name = self.router.precise, self.names[instance]
        if precise.observe_seq(name, seq, at) == SeqVerdict.RESTART or isinstance(event, AllBlocksCleared):
            self.cleared_at[instance] = at
        precise.apply(name, (event,), at)
