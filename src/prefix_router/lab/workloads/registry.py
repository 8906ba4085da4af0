"""The named workloads: ``get_workload(name, requests=..., seed=..., model=...)`` and ``workload_names()``.

Each workload is a request shape (one module each) combined with an arrival process (``arrivals``);
every shape has its own default size and arrivals, and typed options (a frozen dataclass) that may be
given as keyword arguments, as strings too (from the command line: ``--workload-opt tenants=32``).

Adding a workload: write its module (options dataclass, ``build(options, requests, seed)``) and add its
``WorkloadSpec`` row to ``WORKLOADS``; the commands (``simulate``, ``bench``) follow from the row.
"""

from __future__ import annotations

import dataclasses
import random
import types
import typing
from collections.abc import Callable, Mapping
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
from prefix_router.lab.workloads.types import Session, Workload


@dataclass(frozen=True, slots=True)
class WorkloadSpec:
    """One workload: its name, one-line description, options class (a frozen dataclass, every field with
    a default), ``build(options, requests, seed)``, default size and default arrival process."""

    name: str
    description: str
    options: type[Any]
    build: Callable[[Any, int, int], list[Session]]
    default_requests: int
    default_arrivals: Arrivals


_POISSON = Arrivals("poisson", rate=8.0)
_CLOSED = Arrivals("closed", concurrency=32)
_TRACE = Arrivals("trace")
WORKLOADS: tuple[WorkloadSpec, ...] = (
    WorkloadSpec("chatbots", "N tenants, fixed system prompts, Zipf popularity, short questions",
                 chatbots.ChatbotOptions, chatbots.build, 400, _POISSON),
    WorkloadSpec("multi-turn", "ShareGPT conversations, each turn with its full generated history",
                 multiturn.MultiTurnOptions, multiturn.build, 400, _POISSON),
    WorkloadSpec("agents", "tool list + tool-call loop with growing tool outputs",
                 agents.AgentOptions, agents.build, 400, _POISSON),
    WorkloadSpec("rag", "a few long shared documents, different questions",
                 rag.RagOptions, rag.build, 200, _POISSON),
    WorkloadSpec("bursty", "tenants' system prompts and conversations, traffic in per-tenant bursts",
                 bursty.BurstyOptions, bursty.build, 1000, _TRACE),
    WorkloadSpec("unique", "no sharing at all (negative control)",
                 unique.UniqueOptions, unique.build, 400, _POISSON),
    WorkloadSpec("mooncake", "Mooncake conversation trace replay (hash ids -> text blocks)",
                 mooncake.MooncakeOptions, mooncake.build, 1000, _TRACE),
    WorkloadSpec("sglang-gsp", "SGLang generated-shared-prefix preset (64 groups x 16 prompts)",
                 presets.GspOptions, presets.build_gsp, 1024, _CLOSED),
    WorkloadSpec("vllm-prefix-repetition", "vLLM prefix_repetition preset (10 prefixes of 256 tokens)",
                 presets.PrefixRepetitionOptions, presets.build_prefix_repetition, 1000, _CLOSED),
    WorkloadSpec("mixed", "chatbots + multi-turn conversations (the demo)",
                 mixed.MixedOptions, mixed.build, 400, _POISSON),
    WorkloadSpec("trace", "your own JSONL request trace (path=FILE)",
                 trace_file.TraceFileOptions, trace_file.build, 1_000_000, _TRACE),
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
    opts = make_options(spec.options, options)
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


def make_options(cls: type[Any], values: Mapping[str, Any]) -> Any:
    """An instance of the options dataclass ``cls`` from ``values`` (strings coerced to the field types)."""
    hints = typing.get_type_hints(cls)
    unknown = sorted(set(values) - set(hints))
    if unknown:
        raise ValueError(f"unknown option(s) {', '.join(unknown)}; valid: {', '.join(hints)}")
    return cls(**{key: coerce(value, hints[key]) for key, value in values.items()})


def coerce(value: Any, hint: Any) -> Any:
    """``value`` converted to ``hint`` (int, float, bool, str or one of them | None) when it is a string."""
    if not isinstance(value, str):
        return value
    args = typing.get_args(hint) if isinstance(hint, types.UnionType) else (hint,)
    if type(None) in args and value.lower() in ("none", "null", ""):
        return None
    target = next(a for a in args if a is not type(None))
    if target is bool:
        return value.lower() in ("1", "true", "yes", "on")
    return target(value)
