"""The decision feed: the node's last ``FEED_SIZE`` routing decisions, for the operator (``GET
/admin/decisions``, the dashboard, ``prefix-router top``) and for files the lab writes (the simulator's and
``bench``'s ``--decisions FILE``, replayed by ``prefix-router dashboard --replay``).

An entry holds what the decision was (worker, branch, policy, predicted cached tokens, the prompt's
estimated tokens, the predicted first-token time and each candidate's figures, ``CandidateEstimate``),
what came of it (the observed first-token time, the status) and, to place it on the prefix map, the
request's tenant namespace and its chained block hashes: hashes only, never text or keys. What leaves the
process (``view``) names tenants and prefixes by a salted hash (``Hasher``: a random salt per process, so
an id links nothing outside this feed) and workers by their public names (``names``: never an upstream
address). Recording costs the request path one small object and an append to a bounded deque.
"""

from __future__ import annotations

import hashlib
import re
import secrets
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from prefix_router.pool import Worker
from prefix_router.routing import CandidateEstimate, Decision, RouteRequest

FEED_SIZE = 2048  # decisions kept (the admin endpoint and the dashboard show the last ones of these)
NO_TENANT = 0  # the namespace of requests keyed without a tenant


class Hasher:
    """Salted short ids of integers (namespaces, block hashes): stable within one process or file."""

    def __init__(self, salt: bytes | None = None) -> None:
        self.salt = salt if salt is not None else secrets.token_bytes(16)

    def __call__(self, value: int, prefix: str) -> str:
        raw = (value & ((1 << 64) - 1)).to_bytes(8, "little")
        return prefix + hashlib.blake2b(raw, digest_size=5, key=self.salt).hexdigest()


class DecisionEntry:
    """One decision and its outcome: the engine's cached and prompt tokens once it answered, the observed
    first-token time and the status once the request closed."""

    __slots__ = (
        "at",
        "blocks",
        "branch",
        "cached_tokens",
        "estimates",
        "namespace",
        "observed_ttft_s",
        "policy",
        "predicted_tokens",
        "predicted_ttft_s",
        "prompt_tokens",
        "reported_prompt_tokens",
        "route_id",
        "seq",
        "status",
        "worker",
    )

    def __init__(self, seq: int, at: float, policy: str, decision: Decision, req: RouteRequest) -> None:
        self.seq = seq
        self.at = at
        self.policy = policy
        self.worker = decision.worker
        self.branch = str(decision.branch)
        self.predicted_tokens = decision.predicted_tokens
        self.prompt_tokens = decision.estimated_prompt_tokens
        self.predicted_ttft_s = decision.predicted_ttft_s
        self.estimates: tuple[CandidateEstimate, ...] = decision.estimates
        self.namespace = req.namespace
        self.blocks = req.blocks  # the request's own tuple, not a copy
        self.route_id = req.route_id
        self.observed_ttft_s: float | None = None
        self.status: int | None = None
        self.cached_tokens: int | None = None  # the engine's report
        self.reported_prompt_tokens: int | None = None

    @property
    def root(self) -> int | None:
        """The prefix this request belongs to: its first block (chained from its namespace)."""
        return self.blocks[0] if self.blocks else None

    def view(self, names: Callable[[str], str], hasher: Hasher, origin: float) -> dict[str, Any]:
        """What leaves the process: numbers, hashed ids and public worker names only."""
        root = self.root
        return {
            "seq": self.seq,
            "t": round(self.at - origin, 3),
            "worker": names(self.worker),
            "branch": self.branch,
            "policy": self.policy,
            "predicted_tokens": self.predicted_tokens,
            "prompt_tokens": self.prompt_tokens,
            "predicted_ttft_ms": _ms(self.predicted_ttft_s),
            "observed_ttft_ms": _ms(self.observed_ttft_s),
            "status": self.status,
            "cached_tokens": self.cached_tokens,
            "reported_prompt_tokens": self.reported_prompt_tokens,
            "tenant": None if self.namespace == NO_TENANT else hasher(self.namespace, "t-"),
            "prefix": None if root is None else hasher(root, "p-"),
            "prefix_blocks": len(self.blocks),
            "candidates": [estimate_view(e, names) for e in self.estimates],
        }


def estimate_view(estimate: CandidateEstimate, names: Callable[[str], str]) -> dict[str, Any]:
    return {
        "worker": names(estimate.worker),
        "ttft_ms": _ms(estimate.ttft_s),
        "wait_ms": _ms(estimate.wait_s),
        "prefill_ms": _ms(estimate.prefill_s),
        "decode_ms": _ms(estimate.decode_s),
        "added_ms": _ms(estimate.added_s),
        "cache_ms": _ms(estimate.cache_s),
    }


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1e3, 3)


class DecisionFeed:
    """The last ``size`` decisions, oldest first. ``origin``: the clock reading the views count from."""

    def __init__(self, size: int = FEED_SIZE, origin: float = 0.0, hasher: Hasher | None = None) -> None:
        self.entries: deque[DecisionEntry] = deque(maxlen=size)
        self.hasher = hasher if hasher is not None else Hasher()
        self.origin = origin
        self.total = 0  # decisions ever recorded (the sequence number of the next one)
        self._by_route: dict[str, DecisionEntry] = {}  # the entries held, by request

    def add(self, at: float, policy: str, decision: Decision, req: RouteRequest) -> DecisionEntry:
        entries = self.entries
        if len(entries) == entries.maxlen:
            gone = entries[0]
            if self._by_route.get(gone.route_id) is gone:
                del self._by_route[gone.route_id]
        entry = DecisionEntry(self.total, at, policy, decision, req)
        self.total += 1
        entries.append(entry)
        self._by_route[req.route_id] = entry
        return entry

    def reported(self, route_id: str, cached: int | None, prompt: int | None) -> None:
        """What the engine said it cached of the request ``route_id`` (its latest attempt's entry)."""
        entry = self._by_route.get(route_id)
        if entry is not None:
            entry.cached_tokens, entry.reported_prompt_tokens = cached, prompt

    def __len__(self) -> int:
        return len(self.entries)

    def __iter__(self) -> Iterator[DecisionEntry]:
        return iter(self.entries)

    def last(self, limit: int, after: int = -1) -> list[DecisionEntry]:
        """The newest ``limit`` entries with a sequence number above ``after``, oldest first."""
        out: list[DecisionEntry] = []
        for entry in reversed(self.entries):
            if len(out) >= limit or entry.seq <= after:
                break
            out.append(entry)
        out.reverse()
        return out

    def view(self, names: Callable[[str], str], limit: int, after: int = -1) -> list[dict[str, Any]]:
        return [e.view(names, self.hasher, self.origin) for e in self.last(limit, after)]


def closed(entry: DecisionEntry | None, ttft_s: float | None, status: int) -> None:
    """The request of ``entry`` ended (``status``) with its first byte ``ttft_s`` after it arrived."""
    if entry is not None:
        entry.observed_ttft_s, entry.status = ttft_s, status


_SAFE_NAME = re.compile(r"[A-Za-z0-9_\-]{1,64}")


def public_names(pool: Iterable[Worker], hasher: Hasher) -> Callable[[str], str]:
    """Workers' names as the feed and the dashboard show them: a name that gives away its upstream
    address (the default name is the URL's host:port; a configured one may be an address too) becomes
    ``w-`` and a salted hash of it; a worker no longer in the pool is shown by its name only when that is
    a plain word."""
    known = {w.name: w.url for w in pool}
    shown: dict[str, str] = {}

    def name(raw: str) -> str:
        out = shown.get(raw)
        if out is None:
            url = known.get(raw)
            plain = _SAFE_NAME.fullmatch(raw) is not None and raw not in _address(url)
            out = raw if plain else hasher(int.from_bytes(hashlib.sha256(raw.encode()).digest()[:8]), "w-")
            shown[raw] = out
        return out

    return name


def _address(url: str | None) -> tuple[str, ...]:
    """A URL's host:port and host (what a worker's default name is made of)."""
    if url is None:
        return ()
    netloc = url.split("://", 1)[-1].split("/", 1)[0].rsplit("@", 1)[-1]
    return (netloc, netloc.rsplit(":", 1)[0])
