"""Precise mode in the simulator (simulated): each simulated engine's cache publishes KV cache events to
the router's event-fed views, as vLLM's do, and faults (restarts, cache resets) happen at given times.

The simulated engine names its blocks by hashes, not token ids, so every block is given the token ids
``pseudo_tokens(hash)`` (its 64-bit hash as two ids, then zeros, ``block_tokens`` in all); a request's
precise key is the same ids of its engine blocks cut by ``precise_chain``: the router's token parity is
exact, as with a local tokenizer. Events go through the real decoder's values (``prefix_router.events``)
and ``PreciseView``'s sequence checks; they are applied at the simulated time they happen (an event
round trip of 0), or ``lag_s`` later. A parent map (bounded by ``max_parents``) names each block's
parent, as an engine's ``BlockStored`` does.
"""

from __future__ import annotations

import dataclasses
from collections import OrderedDict
from collections.abc import Sequence

from prefix_router.events import AllBlocksCleared, BlockRemoved, BlockStored, EngineEvent
from prefix_router.lab.sim.engine import EngineRequest
from prefix_router.routing import Router, RouteRequest, precise_chain, precise_seed

MODEL = "sim"


def pseudo_tokens(block: int, block_tokens: int) -> list[int]:
    return [block & 0xFFFFFFFF, block >> 32 & 0xFFFFFFFF] + [0] * (block_tokens - 2)


class EventFeed:
    """Connects the engines' caches to the router's event-fed views (``attach``), and gives requests
    their precise keys (``with_precise``)."""

    def __init__(self, router: Router, names: Sequence[str], block_tokens: int, max_parents: int = 4_000_000):
        if block_tokens < 2:
            raise ValueError("pseudo tokens need blocks of at least 2 tokens")
        self.router, self.names, self.block_tokens = router, list(names), block_tokens
        self._parents: OrderedDict[int, int | None] = OrderedDict()
        self._max_parents = max_parents
        self._seq = [0] * len(self.names)
        self._seed = precise_seed(MODEL, None, None)
        self.now = 0.0
        for name in self.names:
            router.add_event_worker(name, MODEL)

    def attach(self, instance: int, cache: object) -> None:
        name = self.names[instance]

        def listener(kind: str, block: int) -> None:
            self._publish(instance, name, kind, block)

        cache.listener = listener  # type: ignore[attr-defined]

    def with_precise(self, route: RouteRequest, engine: EngineRequest) -> RouteRequest:
        """``route`` with the precise key of ``engine``'s blocks (and their parents remembered)."""
        self._remember(engine.extension or engine.blocks)
        ids: list[int] = []
        for block in engine.blocks:
            ids += pseudo_tokens(block, self.block_tokens)
        precise = precise_chain(ids, self.block_tokens, self._seed)
        return dataclasses.replace(route, precise_blocks=precise, precise_tokens=engine.prompt_tokens)

    def restart(self, instance: int) -> None:
        """The engine process restarted: its sequence starts at 0 again (the view clears at its first
        message); the caller resets the cache itself."""
        self._seq[instance] = 0

    def _remember(self, chain: Sequence[int]) -> None:
        parents, parent = self._parents, None
        for block in chain:
            if block not in parents:
                parents[block] = parent
                if len(parents) > self._max_parents:
                    parents.popitem(last=False)
            parent = block

    def _publish(self, instance: int, name: str, kind: str, block: int) -> None:
        event: EngineEvent
        if kind == "stored":
            tokens = tuple(pseudo_tokens(block, self.block_tokens))
            event = BlockStored((block,), self._parents.get(block), tokens, self.block_tokens)
        elif kind == "removed":
            event = BlockRemoved((block,))
        else:
            event = AllBlocksCleared()
        seq, self._seq[instance] = self._seq[instance], self._seq[instance] + 1
        precise = self.router.precise
        precise.observe_seq(name, seq, self.now)
        precise.apply(name, (event,), self.now)
