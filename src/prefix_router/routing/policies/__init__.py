"""Routing policies, one module each, all behind the small ``Policy`` contract; one ``PolicySpec`` row each.

Adding a policy: write its module (header comment: algorithm, fallback, knobs; its knob group as a frozen
``Section``) and add its row to ``POLICIES``. Its name, knobs (``routing.policies.<name>``), session rule
and description follow from the row: the configuration, ``--policy``, the router and the simulator.
"""

from __future__ import annotations

from prefix_router.routing.policies.consistent_hash import ConsistentHashPolicy, ConsistentHashSettings
from prefix_router.routing.policies.dynamo_kv import DynamoKvPolicy, DynamoKvSettings
from prefix_router.routing.policies.least_load import LeastLoadPolicy
from prefix_router.routing.policies.power_of_two import PowerOfTwoPolicy
from prefix_router.routing.policies.prefix import PrefixPolicy, PrefixSettings
from prefix_router.routing.policies.random_pick import RandomPolicy
from prefix_router.routing.policies.round_robin import RoundRobinPolicy
from prefix_router.routing.policies.sglang_cache_aware import SGLangCacheAwarePolicy, SGLangCacheAwareSettings
from prefix_router.routing.policies.spec import AnySpec, NoSettings, PolicySpec, knobless
from prefix_router.routing.policies.ttft import TtftPolicy, TtftSettings
from prefix_router.routing.types import Policy
from prefix_router.settings import Section

POLICIES: tuple[AnySpec, ...] = (
    PolicySpec("random", NoSettings, knobless(RandomPolicy), False,
               "weighted random: the baseline, what a plain load balancer does"),
    PolicySpec("round_robin", NoSettings, knobless(RoundRobinPolicy), False,
               "each candidate in turn"),
    PolicySpec("least_load", NoSettings, knobless(LeastLoadPolicy), False,
               "fewest requests in flight + scraped queue depth, per unit of weight"),
    PolicySpec("power_of_two", NoSettings, knobless(PowerOfTwoPolicy), False,
               "the less loaded of two candidates drawn at random"),
    PolicySpec("consistent_hash", ConsistentHashSettings, ConsistentHashPolicy, True,
               "consistent hashing of the key's first characters with bounded loads (CHWBL)"),
    PolicySpec("prefix", PrefixSettings, PrefixPolicy, True,
               "lowest expected cost of this request and of the work it creates, under a bounded-load cap"),
    PolicySpec("ttft", TtftSettings, TtftPolicy, True,
               "lowest predicted first-token time (learned per worker) + the delay and eviction it causes"),
    PolicySpec("sglang_cache_aware", SGLangCacheAwareSettings, SGLangCacheAwarePolicy, False,
               "an emulation of SGLang router's cache_aware policy (a baseline)"),
    PolicySpec("dynamo_kv", DynamoKvSettings, DynamoKvPolicy, False,
               "an emulation of NVIDIA Dynamo's KV-router cost (a baseline)"),
)  # fmt: skip
POLICY_NAMES: tuple[str, ...] = tuple(spec.name for spec in POLICIES)
DEFAULT_POLICY = "prefix"


def policy_spec(name: str) -> AnySpec:
    """The row of policy ``name`` (KeyError naming the known policies)."""
    for spec in POLICIES:
        if spec.name == name:
            return spec
    raise KeyError(f"unknown policy {name!r}; choose from {', '.join(POLICY_NAMES)}")


def make_policy(name: str, knobs: Section | None = None) -> Policy:
    """A fresh policy by name, with its knob group (its defaults when None); KeyError for an unknown name."""
    return policy_spec(name).build(knobs)


__all__ = ["DEFAULT_POLICY", "POLICIES", "POLICY_NAMES", "PolicySpec", "make_policy", "policy_spec"]
