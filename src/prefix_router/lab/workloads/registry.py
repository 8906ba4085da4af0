"""The named workloads: ``get_workload(name, requests=..., seed=..., model=...)`` and ``workload_names()``.

Each workload is a request shape (one module each) combined with an arrival process (``arrivals``);
every shape has its own default size and arrivals, and validated options (a ``WorkloadSettings`` model,
see ``settings``) that may be given as keyword arguments, as strings too (from the command line:
``--workload-opt tenants=32``); a bad or unknown option is a ``WorkloadOptionError`` (one line).

Adding a workload: write its module (options model, ``build(options, requests, seed)``) and add its
``WorkloadSpec`` row to ``WORKLOADS``; the commands (``simulate``, ``bench``) follow from the row.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from prefix_router.lab.workloads import (
    agents,
    bursty,
    chatbots,
    mixed,
    mooncake,
    multiturn,
    presets,
    rag,
    trace_file,
    unique,
)
from prefix_router.lab.workloads.arrivals import Arrivals, apply_arrivals
from prefix_router.lab.workloads.settings import WorkloadSettings, make_settings
from prefix_router.lab.workloads.types import Session, Workload


@dataclass(frozen=True, slots=True)
class WorkloadSpec:
    """One workload: its name, one-line description, options class (a ``WorkloadSettings`` model, every
    field with a default), ``build(options, requests, seed)``, default size and default arrival process."""

    name: str
    description: str
    options: type[WorkloadSettings]
    build: Callable[[Any, int, int], list[Session]]
    default_requests: int
    default_arrivals: Arrivals


_POISSON = Arrivals("poisson", rate=8.0)
_CLOSED = Arrivals("closed", concurrency=32)
_TRACE = Arrivals("trace")
WORKLOADS: tuple[WorkloadSpec, ...] = (
    WorkloadSpec("chatbots", "N tenants, fixed system prompts, Zipf popularity, short questions",
                 chatbots.ChatbotSettings, chatbots.build, 400, _POISSON),
    WorkloadSpec("multi-turn", "ShareGPT conversations, each turn with its full generated history",
                 multiturn.MultiTurnSettings, multiturn.build, 400, _POISSON),
    WorkloadSpec("agents", "tool list + tool-call loop with growing tool outputs",
                 agents.AgentSettings, agents.build, 400, _POISSON),
    WorkloadSpec("rag", "a few long shared documents, different questions",
                 rag.RagSettings, rag.build, 200, _POISSON),
    WorkloadSpec("bursty", "tenants' system prompts and conversations, traffic in per-tenant bursts",
                 bursty.BurstySettings, bursty.build, 1000, _TRACE),
    WorkloadSpec("unique", "no sharing at all (negative control)",
                 unique.UniqueSettings, unique.build, 400, _POISSON),
    WorkloadSpec("mooncake", "Mooncake conversation trace replay (hash ids -> text blocks)",
                 mooncake.MooncakeSettings, mooncake.build, 1000, _TRACE),
    WorkloadSpec("sglang-gsp", "SGLang generated-shared-prefix preset (64 groups x 16 prompts)",
                 presets.GspSettings, presets.build_gsp, 1024, _CLOSED),
    WorkloadSpec("vllm-prefix-repetition", "vLLM prefix_repetition preset (10 prefixes of 256 tokens)",
                 presets.PrefixRepetitionSettings, presets.build_prefix_repetition, 1000, _CLOSED),
    WorkloadSpec("mixed", "chatbots + multi-turn conversations (the demo)",
                 mixed.MixedSettings, mixed.build, 400, _POISSON),
    WorkloadSpec("trace", "your own JSONL request trace (path=FILE)",
                 trace_file.TraceFileSettings, trace_file.build, 1_000_000, _TRACE),
)  # fmt: skip


def workload_specs() -> dict[str, WorkloadSpec]:
    return {spec.name: spec for spec in WORKLOADS}


def workload_names() -> list[str]:
    return [spec.name for spec in WORKLOADS]


def get_workload(
    name: str,
    *,
    requests: int | None,
    seed: int,
    model: str,
    arrivals: Arrivals | None = None,
    **options: Any,
) -> Workload:
    """Build workload ``name``: ``requests`` turns in all (None: its default), deterministic for ``seed``.

    ``model`` replaces the model of recorded bodies (the trace workload); ``arrivals`` overrides the
    workload's default arrival process; ``options`` are the shape's options (see each module).
    """
    spec = workload_specs().get(name)
    if spec is None:
        raise KeyError(f"unknown workload {name!r}; known: {', '.join(workload_names())}")
    opts = make_settings(spec.options, options, name)
    count = spec.default_requests if requests is None else requests
    if count < 0:
        raise ValueError("requests must be >= 0")
    chosen = arrivals or spec.default_arrivals
    sessions = apply_arrivals(
        _with_model(spec.build(opts, count, seed), model), chosen, random.Random(f"arr:{seed}")
    )
    return Workload(name, sessions, spec.description, concurrency=chosen.closed_concurrency)


def _with_model(sessions: list[Session], model: str) -> list[Session]:
    """Recorded bodies keep their own model unless one is given."""
    if not model:
        return sessions
    return [dataclasses.replace(s, turns=tuple(_turn_model(t, model) for t in s.turns)) for s in sessions]


def _turn_model(turn: Any, model: str) -> Any:
    return turn if turn.body is None else dataclasses.replace(turn, body={**turn.body, "model": model})
