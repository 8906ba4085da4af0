"""dynamo_kv: an EMULATION of NVIDIA Dynamo's KV-router cost function, as a baseline.

Written from Dynamo's documentation of its KV router (the cost it states and its two knobs), not from its
code; it lets the simulator compare with Dynamo's rule on exactly the same requests and engines.

Algorithm, per request, for each candidate (blocks of the request's routing key):

    logit = overlap_score_weight x prefill_blocks + decode_blocks
    prefill_blocks = the request's blocks minus those the worker already holds (``ctx.matches``, the
                     router's index: where Dynamo reads its engines' KV events)
    decode_blocks  = the blocks of the requests active on the worker (``in_flight`` x the mean blocks of
                     the requests this policy sent there: Dynamo counts each active sequence's blocks)

lower is better. ``temperature`` 0: the lowest (ties broken at random, seeded); above 0: the logits are
scaled to [0, 1] across the candidates and a worker drawn with probability proportional to
``exp(-scaled / temperature)``. Branches: ``prefix_hit`` (the chosen worker has the longest match),
``load_fallback`` (a longer match passed over), ``load_balance`` (no match anywhere). No load cap and no
session affinity (Dynamo's cost is the whole rule). Fallback: none needed.
Knobs (Dynamo's defaults): ``overlap_score_weight`` 1.0, ``temperature`` 0.0. Bounded: one mean per
worker (dropped with it); ``BLOCKS_ALPHA`` is the weight of one request in that mean.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from pydantic import Field

from prefix_router.routing.types import Branch, Context, Decision, RouteRequest, WorkerSnapshot
from prefix_router.settings import Section

BLOCKS_ALPHA = 0.05  # weight of one request in a worker's mean request blocks (about 20 requests)


class DynamoKvSettings(Section):
    """``dynamo_kv``'s knobs: Dynamo's KV router's, with its defaults."""

    overlap_score_weight: float = Field(default=1.0, ge=0)  # x the blocks to prefill, against active blocks
    temperature: float = Field(default=0.0, ge=0)  # 0: the lowest cost; above: softmax sampling


class DynamoKvPolicy:
    def __init__(self, knobs: DynamoKvSettings) -> None:
        self.overlap_score_weight = knobs.overlap_score_weight
        self.temperature = knobs.temperature
        self._blocks: dict[str, float] = {}  # per worker: mean blocks of the requests sent there

    def logit(self, req: RouteRequest, w: WorkerSnapshot, ctx: Context) -> float:
        """``w``'s cost for ``req`` in blocks (see the module doc)."""
        prefill = max(0, len(req.blocks) - ctx.matches.get(w.name, 0))
        active = w.in_flight * self._blocks.get(w.name, float(len(req.blocks)))
        return self.overlap_score_weight * prefill + active

    def select(self, req: RouteRequest, workers: Sequence[WorkerSnapshot], ctx: Context) -> Decision:
        logits = [self.logit(req, w, ctx) for w in workers]
        chosen = self._draw(workers, logits, ctx)
        mean = self._blocks.get(chosen.name)
        size = float(len(req.blocks))
        self._blocks[chosen.name] = size if mean is None else mean + BLOCKS_ALPHA * (size - mean)
        longest = max((ctx.matches.get(w.name, 0) for w in workers), default=0)
        matched = ctx.matches.get(chosen.name, 0)
        if longest == 0:
            return Decision(chosen.name, Branch.LOAD_BALANCE)
        return Decision(chosen.name, Branch.PREFIX_HIT if matched == longest else Branch.LOAD_FALLBACK)

    def _draw(self, workers: Sequence[WorkerSnapshot], logits: list[float], ctx: Context) -> WorkerSnapshot:
        low, high = min(logits), max(logits)
        if self.temperature <= 0 or high <= low:
            tied = [w for w, x in zip(workers, logits, strict=True) if x <= low]
            return tied[0] if len(tied) == 1 else ctx.rng.choice(tied)
        weights = [math.exp(-(x - low) / (high - low) / self.temperature) for x in logits]
        return ctx.rng.choices(list(workers), weights)[0]

    def on_worker_removed(self, worker: str) -> None:
        self._blocks.pop(worker, None)
