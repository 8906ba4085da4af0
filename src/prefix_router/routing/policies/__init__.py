"""Routing policies, one module each, all behind the small ``Policy`` contract."""

from __future__ import annotations

from prefix_router.routing.config import RoutingConfig
from prefix_router.routing.policies.consistent_hash import ConsistentHashPolicy
from prefix_router.routing.policies.least_load import LeastLoadPolicy
from prefix_router.routing.policies.power_of_two import PowerOfTwoPolicy
from prefix_router.routing.policies.prefix import PrefixPolicy
from prefix_router.routing.policies.random_pick import RandomPolicy
from prefix_router.routing.policies.round_robin import RoundRobinPolicy
from prefix_router.routing.policies.sglang_cache_aware import SGLangCacheAwareKnobs, SGLangCacheAwarePolicy
from prefix_router.routing.types import Policy

POLICY_NAMES = (
    "random",
    "round_robin",
    "least_load",
    "power_of_two",
    "consistent_hash",
    "prefix",
    "sglang_cache_aware",
)


def make_policy(name: str, cfg: RoutingConfig) -> Policy:
    """A fresh policy by name (KeyError for an unknown name)."""
    if name == "random":
        return RandomPolicy()
    if name == "round_robin":
        return RoundRobinPolicy()
    if name == "least_load":
        return LeastLoadPolicy()
    if name == "power_of_two":
        return PowerOfTwoPolicy()
    if name == "consistent_hash":
        return ConsistentHashPolicy(cfg.load_factor, load_slack=0)
    if name == "prefix":
        return PrefixPolicy(
            cfg.load_factor,
            cfg.load_slack,
            cfg.queue_penalty_tokens,
            cfg.in_flight_penalty_tokens,
            cfg.recompute_weight,
            cfg.saturation_weight,
            cfg.attention_tokens,
        )
    if name == "sglang_cache_aware":
        return SGLangCacheAwarePolicy(SGLangCacheAwareKnobs())
    raise KeyError(f"unknown policy {name!r}; choose from {', '.join(POLICY_NAMES)}")


__all__ = ["POLICY_NAMES", "make_policy"]
