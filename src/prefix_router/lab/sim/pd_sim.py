"""Prefill/decode disaggregation in the cluster simulator (simulated): the fleet's roles, one request's
two stages in flight, and what the run counts about them.

``ClusterSimulation`` with a ``PdSpec`` routes every request with the routing core's two-stage choice
(``Router.route_pd``: the decode worker first, the decider, then the prefill worker). A request that
keeps its prefill stage runs its prompt on the prefill engine (``max_tokens: 1``); then, as the edge
does, its decode stage is dispatched (``Router.handed_over``) and its KV cache moves to the decode
engine, which takes the engine model's transfer time for the blocks it does not hold
(``EngineModel.transfer_time``: the profile's ``kv_transfer_s_per_token``), loads them as cached
blocks and serves the request; its TTFT runs from arrival to the decode engine's first token. A
skipped prefill runs on the decode engine alone, as colocated.

``PdStats`` also judges the decider against the engines' truth at routing time: a turn is *held* when
the chosen decode engine holds all of its prompt but at most ``skip_prefill_tokens`` (and some of it),
*cold* when no engine holds any block of it.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from prefix_router.lab.sim.requests import SimRequest
from prefix_router.routing import Decision, DisaggregationSettings, Role, RouteRequest

DEFAULT_SKIP_PREFILL_TOKENS: int = DisaggregationSettings().skip_prefill_tokens

PREFILL_SUFFIX = "/prefill"  # the prefill stage's request id: the request's own, plus this


@dataclass(frozen=True, slots=True)
class PdSpec:
    """Instance i plays ``roles[i]``; the decider's threshold; the decode stage's policy (None: the run's)."""

    roles: tuple[Role, ...]
    skip_prefill_tokens: int = DEFAULT_SKIP_PREFILL_TOKENS
    decode_policy: str | None = None

    @classmethod
    def split(cls, prefill: int, decode: int, **knobs: Any) -> PdSpec:
        """``prefill`` prefill instances, then ``decode`` decode instances."""
        first: Role = "prefill"
        then: Role = "decode"
        return cls((first,) * prefill + (then,) * decode, **knobs)

    def names(self, names: list[str]) -> tuple[list[str], list[str]]:
        """(the prefill workers, the decode-capable workers) among ``names``."""
        prefill = [n for n, r in zip(names, self.roles, strict=True) if r == "prefill"]
        decode = [n for n, r in zip(names, self.roles, strict=True) if r != "prefill"]
        return prefill, decode


@dataclass(slots=True)
class Stage:
    """A request whose prefill stage runs: where each stage goes, and the decode's decision."""

    request: SimRequest
    route: RouteRequest
    prefill_route: RouteRequest
    prefill: int
    decode: int
    decode_decision: Decision


@dataclass(slots=True)
class PdStats:
    prefills: int = 0
    skipped: Counter[str] = field(default_factory=Counter)  # by SkipReason
    held_turns: int = 0
    held_skipped: int = 0
    cold_turns: int = 0
    cold_skipped: int = 0
    prefill_prompt_tokens: int = 0  # on the prefill engines
    prefill_cached_tokens: int = 0
    transferred_tokens: int = 0
    transfer_s: float = 0.0

    def judged(self, held: bool, cold: bool, skipped: bool) -> None:
        self.held_turns += held
        self.held_skipped += held and skipped
        self.cold_turns += cold
        self.cold_skipped += cold and skipped

    def summary(self) -> dict[str, Any]:
        prompt = self.prefill_prompt_tokens
        return {
            "prefills": self.prefills,
            "skipped": dict(sorted(self.skipped.items())),
            "held_turns": self.held_turns,
            "held_skipped_fraction": self.held_skipped / self.held_turns if self.held_turns else 0.0,
            "cold_turns": self.cold_turns,
            "cold_skipped": self.cold_skipped,
            "prefill_hit_rate": self.prefill_cached_tokens / prompt if prompt else 0.0,
            "transferred_tokens": self.transferred_tokens,
            "transfer_s": self.transfer_s,
        }
