"""Value types shared by the routing core, the proxy and the simulator.

The routing core is pure: no asyncio, HTTP or metrics imports. Time (``now``, seconds, any monotonic
origin) and randomness (``random.Random``) are always passed in by the caller.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Protocol


class InvalidRequest(ValueError):
    """The body is not a valid request for its endpoint; the proxy answers 400 naming ``param``."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param


# RouteRequest, Decision and Outcome are values, never changed once made, but not ``frozen``: a frozen
# dataclass's __init__ sets each field through ``object.__setattr__`` (1.7 against 0.4 us for a
# RouteRequest). The per-request values' ``__init__`` is written out (``init=False``; eq, repr and
# ``dataclasses.replace`` stay the dataclass's): mypyc compiles a written method but leaves a
# dataclass-made one interpreted, about 0.5 against 0.06 us a call, and a request makes about ten.
@dataclass(init=False, slots=True)
class RouteRequest:
    """What the router knows about one request, already reduced to hashes.

    ``blocks`` are chained block hashes of the canonical routing key: ``blocks[i]`` identifies the whole
    prefix made of the first ``i + 1`` blocks (seeded with the namespace), so two requests share their
    first k blocks exactly when their first k hashes are equal. Only full blocks are listed; ``tail``
    holds the bytes of the trailing partial block, so the key can be extended without rehashing it.
    """

    route_id: str
    blocks: tuple[int, ...]
    block_tokens: int
    key_tokens: int  # the key's length: nominal for a text key, characters / chars_per_token (``text_model``)
    hash_key: int
    namespace: int = 0
    session: str | None = None
    output_tokens_hint: int = 0
    tail: bytes = b""  # the key's bytes after the last full block (lets extensions continue the chain)
    exact: bool = False  # blocks of the model's own chat template and tokenizer (exact mode)
    # a key of text blocks: its model, whose learned token value (routing/units.py) scales the nominal
    # ``key_tokens`` and ``block_tokens``; None: token ids, counted exactly
    text_model: str | None = None
    # a text key's bytes (kept, not copied: a match's own first blocks are valued by their content) and
    # their counts by class (word, punctuation, whitespace, images), cumulative at every 16 KiB and the
    # whole last (``routing/units.py``, ``count_marks``); empty for token ids
    text: bytes = b""
    counts: tuple[tuple[int, int, int, int], ...] = ()
    # precise mode (``routing/precise.py``): the exact token ids' chain at the engines' block size, seeded
    # by what the engine shares a cache across (model or LoRA, cache salt); empty: no token parity
    precise_blocks: tuple[int, ...] = ()
    precise_tokens: int = 0  # the exact token ids' count (the prompt's length, for the engine)

    def __init__(
        self,
        route_id: str,
        blocks: tuple[int, ...],
        block_tokens: int,
        key_tokens: int,
        hash_key: int,
        namespace: int = 0,
        session: str | None = None,
        output_tokens_hint: int = 0,
        tail: bytes = b"",
        exact: bool = False,
        text_model: str | None = None,
        text: bytes = b"",
        counts: tuple[tuple[int, int, int, int], ...] = (),
        precise_blocks: tuple[int, ...] = (),
        precise_tokens: int = 0,
    ) -> None:
        self.route_id = route_id
        self.blocks = blocks
        self.block_tokens = block_tokens
        self.key_tokens = key_tokens
        self.hash_key = hash_key
        self.namespace = namespace
        self.session = session
        self.output_tokens_hint = output_tokens_hint
        self.tail = tail
        self.exact = exact
        self.text_model = text_model
        self.text = text
        self.counts = counts
        self.precise_blocks = precise_blocks
        self.precise_tokens = precise_tokens


@dataclass(slots=True)
class WorkerSnapshot:
    """The load of one candidate worker at decision time (a copy; policies must not keep it)."""

    name: str
    weight: float = 1.0
    in_flight: int = 0
    decoding: int = 0  # this router's requests there past their first token (of ``in_flight``)
    pending_prefill_tokens: int = 0
    prefill_backlog: float = 0.0  # estimated prefill work still to compute, token-equivalents (backlog.py)
    queue_depth: int = 0
    kv_usage: float | None = None


class Branch(StrEnum):
    """The routing branch a decision took: the ``branch`` label of ``prefix_router_route_branch_total``.

    A policy with a branch of its own adds it here (the values are metric labels: never rename one).
    """

    SESSION = "session"  # session affinity (applied by the router before the policy)
    HOME = (
        "home"  # precise: a prefix held nowhere, sent back to its last home (the router, before the policy)
    )
    PREFIX_HIT = "prefix_hit"  # prefix: the chosen worker has the longest match
    LOAD_FALLBACK = "load_fallback"  # prefix: a longer match passed over for load; consistent_hash: all full
    LOAD_BALANCE = "load_balance"  # prefix: no match anywhere
    HASH = "hash"  # consistent_hash: the key's node on the ring
    HASH_OVERFLOW = "hash_overflow"  # consistent_hash: a later node (the key's node was at its cap)
    LEAST_LOAD = "least_load"
    POWER_OF_TWO = "power_of_two"
    RANDOM = "random"
    ROUND_ROBIN = "round_robin"
    SMALLEST_TREE = "smallest_tree"  # sglang_cache_aware: a weak match goes to the smallest tree


@dataclass(frozen=True, slots=True)
class CandidateEstimate:
    """One candidate's predicted time to first token for a request, in seconds, and its parts (an
    explanation of a decision: made only by a policy that predicts first-token time, for at most
    ``MAX_ESTIMATES`` candidates, the lowest cost first).

    ``ttft_s``: the predicted first-token time there, ``wait_s + prefill_s + decode_s``; ``wait_s``: before
    its prefill starts (prefill queued ahead, admission); ``prefill_s``: its own uncached prefill;
    ``decode_s``: what the running decode batch adds to its steps; ``added_s``: the delay it adds to the
    requests already there; ``cache_s``: the value of the cache it evicts (a prefix recomputed later).
    The policy ranks candidates by ``ttft_s + added_s + cache_s``."""

    worker: str
    ttft_s: float
    wait_s: float
    prefill_s: float
    decode_s: float
    added_s: float
    cache_s: float


MAX_ESTIMATES = 8  # candidates explained per decision (the lowest costs)


@dataclass(init=False, slots=True)
class Decision:
    """A policy's choice. ``branch`` names the routing branch taken, for metrics. ``Router.route`` adds
    (``routing/placement.py``) the prediction and the prompt's estimated engine tokens
    (``estimated_prompt_tokens``; None: not estimated yet, ``Router.dispatched`` then estimates it).
    ``expected_cached_tokens``: the cached tokens the load tracker charges the request's prefill with,
    when not the prediction (precise mode: the prediction counts the blocks the engine confirmed, the
    load also those speculated there). ``predicted_ttft_s``: the chosen worker's predicted first-token
    time, seconds (None: the policy predicts none); ``estimates``: the candidates' predictions and their
    parts, at most ``MAX_ESTIMATES``, the lowest cost first (empty: none made)."""

    worker: str
    branch: Branch
    matched_blocks: int = 0
    predicted_tokens: int = 0
    estimated_prompt_tokens: int | None = None
    expected_cached_tokens: int | None = None
    predicted_ttft_s: float | None = None
    estimates: tuple[CandidateEstimate, ...] = ()

    def __init__(
        self,
        worker: str,
        branch: Branch,
        matched_blocks: int = 0,
        predicted_tokens: int = 0,
        estimated_prompt_tokens: int | None = None,
        expected_cached_tokens: int | None = None,
        predicted_ttft_s: float | None = None,
        estimates: tuple[CandidateEstimate, ...] = (),
    ) -> None:
        self.worker = worker
        self.branch = branch
        self.matched_blocks = matched_blocks
        self.predicted_tokens = predicted_tokens
        self.estimated_prompt_tokens = estimated_prompt_tokens
        self.expected_cached_tokens = expected_cached_tokens
        self.predicted_ttft_s = predicted_ttft_s
        self.estimates = estimates


@dataclass(init=False, slots=True)
class Outcome:
    """What happened to a dispatched request, reported back by the proxy or the simulator.

    ``cached_tokens`` is the engine-reported count of prompt tokens served from its cache (None when the
    engine does not report it); ``reported_prompt_tokens`` the engine-reported prompt length, when known
    (the bound of ``cached_tokens``). ``extension_blocks`` is the full chained block list of the prompt
    extended with the generated assistant turn as the next request of the conversation will carry it
    (empty when unknown); the index then learns that the worker caches those blocks too.
    ``precise_extension_blocks``: the same in precise keys (exact tokens at the engines' block size;
    empty when unknown): on an event-fed worker the blocks not reported yet are held speculatively until
    the engine's events confirm them, so that the next turn, sent before they arrive, still finds its
    whole history there. ``ok`` False:
    the request failed or was aborted (before or after its first token: the router knows which).
    """

    ok: bool = True
    cached_tokens: int | None = None
    extension_blocks: tuple[int, ...] = ()
    reported_prompt_tokens: int | None = None
    precise_extension_blocks: tuple[int, ...] = ()

    def __init__(
        self,
        ok: bool = True,
        cached_tokens: int | None = None,
        extension_blocks: tuple[int, ...] = (),
        reported_prompt_tokens: int | None = None,
        precise_extension_blocks: tuple[int, ...] = (),
    ) -> None:
        self.ok = ok
        self.cached_tokens = cached_tokens
        self.extension_blocks = extension_blocks
        self.reported_prompt_tokens = reported_prompt_tokens
        self.precise_extension_blocks = precise_extension_blocks


class CacheView(Protocol):
    """What the router's prefix index says about a worker's cache (read-only)."""

    def fill(self, worker: str) -> float:
        """The fraction of the worker's cache in use (0: empty, 1: full, inserting evicts)."""
        ...

    def capacity_tokens(self, worker: str) -> int:
        """The tokens the worker's cache is known to hold (0: unknown)."""
        ...


class LatencyView(Protocol):
    """What the router's first-token model says of a worker (``routing/latency.py``, read-only)."""

    def rates(
        self, worker: str, prior: tuple[float, float, float, float]
    ) -> tuple[float, float, float, float]:
        """(overhead s, prefill s per token-equivalent, s per decoding request, s per request queued
        ahead), fitted towards ``prior``."""
        ...

    def uncertainty(self) -> float:
        """The fleet's median relative prediction error lately (1.0: no trust yet)."""
        ...


@dataclass(init=False, slots=True)
class Context:
    """Everything a policy may read besides the request and the candidates: the time, the seeded rng,
    the matched blocks per worker, the index's view of the caches, the prefill work of a typical request
    (token-equivalents, a moving average over dispatched requests; 0 before any), the context length
    at which a prompt token's attention costs as much as its linear layers (``backlog.prefill_work``) and
    the engine tokens per token of the request's key (``routing/units.py``: 1 for token ids; a policy
    that counts tokens multiplies ``key_tokens`` and ``block_tokens`` by it). ``fills``: what
    ``cache.fill`` says of every worker it knows, as one live mapping that a policy reads per candidate
    without a call (None: call ``cache.fill``; a worker absent from it is empty). ``latency``: the
    workers' first-token models (None: a policy that reads them uses its prior)."""

    now: float
    rng: random.Random
    matches: dict[str, int] = field(default_factory=dict)
    cache: CacheView | None = None
    request_work: float = 0.0
    attention_tokens: float = 32_768.0
    token_scale: float = 1.0
    fills: Mapping[str, float] | None = None
    latency: LatencyView | None = None

    def __init__(
        self,
        now: float,
        rng: random.Random,
        matches: dict[str, int] | None = None,
        cache: CacheView | None = None,
        request_work: float = 0.0,
        attention_tokens: float = 32_768.0,
        token_scale: float = 1.0,
        fills: Mapping[str, float] | None = None,
        latency: LatencyView | None = None,
    ) -> None:
        self.now = now
        self.rng = rng
        self.matches = {} if matches is None else matches
        self.cache = cache
        self.request_work = request_work
        self.attention_tokens = attention_tokens
        self.token_scale = token_scale
        self.fills = fills
        self.latency = latency


class Policy(Protocol):
    """The one small contract every routing policy implements (one module per policy).

    ``select`` must return one of ``workers`` (never empty). The hooks are optional no-ops.
    ``select`` is one step of the router's pipeline (``routing/placement.py``): session affinity (and
    in precise mode the last home) may decide before it, only for policies whose row
    (``policies.spec.PolicySpec``) honours sessions (the baselines do not, so that they stay honest
    baselines); the prediction is made after it.
    """

    def select(self, req: RouteRequest, workers: Sequence[WorkerSnapshot], ctx: Context) -> Decision: ...

    def on_worker_removed(self, worker: str) -> None: ...
