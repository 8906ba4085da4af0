"""Prefill/decode disaggregation: the two-stage choice and the decider (``Router.route_pd``).

Algorithm: the decode worker is chosen first, among the decode-capable workers (role ``decode`` or
``both``), by the decode policy (the configured one by default: with ``prefix``, load-, KV- and
prefix-aware, since a vLLM decode engine keeps what it loaded in its own prefix cache and the index
learns it there at dispatch). The decider then looks at that worker's prediction: when it holds all of the
prompt but at most ``skip_prefill_tokens`` (and holds some of it: a cold prompt always goes through the
prefill stage), the request runs on it alone, colocated. Otherwise the prefill worker is chosen among the
``prefill`` workers by the prefill policy (the configured one: prefix- and load-aware), so the prompt goes
where its prefix is cached. Anchor: llm-d's prefix-based P/D decider (a non-cached-tokens threshold); here
the prediction is the index's (or the engines' KV events in precise mode).

Fallback: no prefill worker available -> colocated on the decode worker (``NO_PREFILL_WORKER``); no
decode-capable worker available -> colocated on a prefill worker (``NO_DECODE_WORKER``: a vLLM producer
serves whole requests too). The edge adds ``PREFILL_FAILED`` when every prefill attempt failed.

Knobs (``disaggregation``, composed at the top of the configuration: an operator's choice of engines, not
of routing): ``flow``, how the engines hand the KV cache over (read by the node, never here), and
``skip_prefill_tokens``, the decider's threshold. A worker's ``role`` is a worker field (``pool``).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Literal

from pydantic import Field

from prefix_router.routing.types import Decision
from prefix_router.settings import Section

Role = Literal["prefill", "decode", "both"]
ROLES: tuple[Role, ...] = ("prefill", "decode", "both")
Flow = Literal["shared_storage", "kv_transfer_params", "sglang_bootstrap"]
FLOWS: tuple[Flow, ...] = ("shared_storage", "kv_transfer_params", "sglang_bootstrap")
DEFAULT_SKIP_PREFILL_TOKENS = 256  # two of vLLM's CPU blocks: what the decode engine recomputes itself


class DisaggregationSettings(Section):
    """``disaggregation``: how a fleet with ``prefill`` workers splits a request (docs/disaggregation.md).

    ``flow``: the engines' KV connector, so the request format of the two stages: ``shared_storage``
    (vLLM's ``ExampleConnector``, LMCache: the prefill with ``max_tokens: 1``, then the request),
    ``kv_transfer_params`` (vLLM's NIXL, P2P NCCL, Mooncake connectors: the prefill's returned
    ``kv_transfer_params`` passed to the decode), ``sglang_bootstrap`` (SGLang: both stages at once, paired
    by ``bootstrap_room``). ``skip_prefill_tokens``: the decider sends a request straight to its decode
    worker when that worker holds all of the prompt but at most this many tokens (never a cold prompt)."""

    flow: Flow = "shared_storage"
    skip_prefill_tokens: int = Field(default=DEFAULT_SKIP_PREFILL_TOKENS, ge=0)


class SkipReason(StrEnum):
    """Why a disaggregated request ran without a prefill stage (a metric label: never rename one)."""

    DECODE_HOLDS_PREFIX = "decode_holds_prefix"  # the decider: little of the prompt is uncached there
    NO_PREFILL_WORKER = "no_prefill_worker"  # none available: colocated on the decode worker
    NO_DECODE_WORKER = "no_decode_worker"  # none available: colocated on a prefill worker
    PREFILL_FAILED = "prefill_failed"  # every prefill attempt failed (the edge): colocated on decode


@dataclass(frozen=True, slots=True)
class PdDecision:
    """The two stages of a disaggregated request: ``prefill`` (None when ``skipped``) then ``decode``,
    the worker that answers the client; ``skipped``: why there is no prefill stage."""

    prefill: Decision | None
    decode: Decision
    skipped: SkipReason | None = None

    @property
    def colocated(self) -> bool:
        return self.prefill is None


def skip_prefill(decode: Decision, prompt_tokens: int, skip_prefill_tokens: int) -> bool:
    """The decider: ``decode`` holds some of the prompt, and all of it but at most
    ``skip_prefill_tokens``."""
    cached = decode.predicted_tokens
    return cached > 0 and prompt_tokens - cached <= skip_prefill_tokens


def splits(role: str) -> tuple[bool, bool]:
    """Whether a worker of ``role`` takes (prefill stages, decode stages)."""
    return role == "prefill", role != "prefill"
