"""The routing core: keys, the prefix index, load, feedback and the policies behind one ``Router``.

Pure: no event loop, HTTP, metrics or Redis (import-linter holds it); time and the rng are passed in. Every
edge (the HTTP proxy, the simulator, the benchmarks) drives the same ``Router``: ``route`` a
``RouteRequest`` built by ``KeyBuilder``, then ``dispatched``, ``first_token`` and ``finished`` with an
``Outcome``. Other packages import only the names below.
"""

from __future__ import annotations

from prefix_router.routing.feedback import FeedbackStats, FeedbackTuning, Verdict
from prefix_router.routing.index import PrefixIndex
from prefix_router.routing.keys import InvalidRequest, KeyBuilder
from prefix_router.routing.pd import (
    FLOWS,
    ROLES,
    DisaggregationSettings,
    Flow,
    PdDecision,
    Role,
    SkipReason,
    skip_prefill,
    splits,
)
from prefix_router.routing.policies import DEFAULT_POLICY, POLICY_NAMES
from prefix_router.routing.precise import (
    PreciseMatch,
    PreciseSettings,
    PreciseStats,
    PreciseTuning,
    PreciseView,
    SeqVerdict,
    Staleness,
    precise_chain,
    precise_seed,
)
from prefix_router.routing.record import record_hash_ids
from prefix_router.routing.router import ChangeHook, ChangeKind, IndexChange, Router
from prefix_router.routing.settings import IndexSettings, KeySettings, RoutingSettings, UnitSettings
from prefix_router.routing.types import CandidateEstimate, Decision, Outcome, RouteRequest
from prefix_router.routing.units import UnitTuning, count_marks

__all__ = [
    "DEFAULT_POLICY",
    "FLOWS",
    "POLICY_NAMES",
    "ROLES",
    "CandidateEstimate",
    "ChangeHook",
    "ChangeKind",
    "Decision",
    "DisaggregationSettings",
    "FeedbackStats",
    "FeedbackTuning",
    "Flow",
    "IndexChange",
    "IndexSettings",
    "InvalidRequest",
    "KeyBuilder",
    "KeySettings",
    "Outcome",
    "PdDecision",
    "PreciseMatch",
    "PreciseSettings",
    "PreciseStats",
    "PreciseTuning",
    "PreciseView",
    "PrefixIndex",
    "Role",
    "RouteRequest",
    "Router",
    "RoutingSettings",
    "SeqVerdict",
    "SkipReason",
    "Staleness",
    "UnitSettings",
    "UnitTuning",
    "Verdict",
    "count_marks",
    "precise_chain",
    "precise_seed",
    "record_hash_ids",
    "skip_prefill",
    "splits",
]
