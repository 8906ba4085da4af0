from __future__ import annotations

import random
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from prefix_router.routing.policies import POLICIES, POLICY_NAMES, PolicySpec, make_policy, policy_spec
from prefix_router.routing.policies.consistent_hash import ConsistentHashSettings
from prefix_router.routing.router import Router
from prefix_router.routing.settings import RoutingSettings
from prefix_router.routing.types import Context, RouteRequest, WorkerSnapshot


def req(blocks: int = 10, prompt: int = 200, hash_key: int = 1, route_id: str = "r") -> RouteRequest:
    return RouteRequest(route_id, tuple(range(blocks)), 16, prompt, hash_key)


def snaps(*in_flight: int) -> list[WorkerSnapshot]:
    return [WorkerSnapshot(f"w{i}", in_flight=n) for i, n in enumerate(in_flight)]


def ctx(matches: dict[str, int] | None = None, seed: int = 0) -> Context:
    return Context(0.0, random.Random(seed), matches or {})


def test_every_policy_returns_a_candidate() -> None:
    for name in POLICY_NAMES:
        policy = make_policy(name)
        for n in (1, 2, 5):
            workers = snaps(*range(n))
            assert policy.select(req(), workers, ctx()).worker in {w.name for w in workers}


def test_random_is_spread_and_respects_weight() -> None:
    policy = make_policy("random")
    workers = [WorkerSnapshot("a", weight=3.0), WorkerSnapshot("b", weight=1.0)]
    c = ctx()
    counts = Counter(policy.select(req(), workers, c).worker for _ in range(4000))
    assert 2.4 < counts["a"] / counts["b"] < 3.8


def test_round_robin_cycles() -> None:
    policy = make_policy("round_robin")
    picks = [policy.select(req(route_id=str(i)), snaps(0, 0, 0), ctx()).worker for i in range(6)]
    assert picks == ["w0", "w1", "w2", "w0", "w1", "w2"]


def test_round_robin_retries_keep_their_request_s_turn() -> None:
    """A retry (same route id, the failed worker left out) takes no other request's turn."""
    policy = make_policy("round_robin")
    first = [w.name for w in snaps(0, 0, 0)]
    firsts = []
    for i in range(6):
        pick = policy.select(req(route_id=str(i)), snaps(0, 0, 0), ctx()).worker
        firsts.append(pick)
        if pick == "w0":  # w0 fails: retried on the others
            rest = [w for w in snaps(0, 0, 0) if w.name != "w0"]
            assert policy.select(req(route_id=str(i)), rest, ctx()).worker != "w0"
    assert firsts == first * 2


def test_least_load_picks_fewest_and_breaks_ties_at_random() -> None:
    policy = make_policy("least_load")
    assert policy.select(req(), snaps(3, 1, 2), ctx()).worker == "w1"
    picks = {policy.select(req(), snaps(1, 0, 0), ctx(seed=s)).worker for s in range(40)}
    assert picks == {"w1", "w2"}


def test_consistent_hash_is_sticky_and_bounded() -> None:
    policy = make_policy("consistent_hash")
    first = policy.select(req(hash_key=42), snaps(0, 0, 0, 0), ctx()).worker
    assert all(policy.select(req(hash_key=42), snaps(0, 0, 0, 0), ctx()).worker == first for _ in range(5))
    loads = [0, 0, 0, 0]
    loads[int(first[1:])] = 50  # the owner is far above the bounded-load cap
    overflow = policy.select(req(hash_key=42), snaps(*loads), ctx())
    assert overflow.worker != first and overflow.branch == "hash_overflow"


def test_prefix_prefers_the_longest_match_when_loads_are_equal() -> None:
    policy = make_policy("prefix")
    d = policy.select(req(), snaps(1, 1, 1), ctx({"w2": 8, "w0": 3}))
    assert (d.worker, d.branch) == ("w2", "prefix_hit")


def test_prefix_spreads_a_hot_prefix_past_the_load_cap() -> None:
    policy = make_policy("prefix")
    d = policy.select(req(), snaps(12, 0, 0, 0), ctx({"w0": 10}))
    assert d.worker != "w0" and d.branch == "load_fallback"


def test_prefix_without_match_balances_load() -> None:
    policy = make_policy("prefix")
    d = policy.select(req(), snaps(2, 0, 1), ctx())
    assert (d.worker, d.branch) == ("w1", "load_balance")


def test_prefix_weighs_pending_prefill_against_the_match() -> None:
    policy = make_policy("prefix")
    busy = [WorkerSnapshot("w0", pending_prefill_tokens=5_000, prefill_backlog=5_000), WorkerSnapshot("w1")]
    assert policy.select(req(prompt=200), busy, ctx({"w0": 10})).worker == "w1"


DOCS = Path(__file__).resolve().parents[2] / "docs" / "routing.md"


@pytest.mark.parametrize("spec", POLICIES, ids=lambda spec: spec.name)
def test_every_policy_row_builds_routes_and_is_documented(spec: PolicySpec[Any]) -> None:
    policy = spec.build()
    workers = snaps(0, 1, 2)
    assert policy.select(req(), workers, ctx()).worker in {w.name for w in workers}
    policy.on_worker_removed("w0")
    assert policy.select(req(), workers[1:], ctx()).worker in {"w1", "w2"}
    settings = RoutingSettings(policy=spec.name)
    assert type(settings.knobs(spec.name)) is spec.knobs and spec.summary
    # through the router: the row's session rule decides whether a session sticks
    router = Router(settings, random.Random(0))
    for name in ("a", "b", "c"):
        router.add_worker(name)
    first = RouteRequest("1", (1, 2), 16, 40, hash_key=1, session="s")
    decision = router.route(first, ["a", "b", "c"], 0.0)
    router.dispatched(first, decision, 0.0)
    again = router.route(RouteRequest("2", (9,), 16, 20, hash_key=9, session="s"), ["a", "b", "c"], 1.0)
    assert (again.branch == "session") is spec.honours_sessions
    # the docs: a row in the policies table, every knob under its key with its default
    lines = DOCS.read_text().splitlines()
    assert any(line.startswith(f"| `{spec.name}`") for line in lines), spec.name
    for knob, field in spec.knobs.model_fields.items():
        key = f"| `routing.policies.{spec.name}.{knob}` | "
        row = next((line for line in lines if line.startswith(key)), None)
        assert row is not None, key
        assert float(row[len(key) :].split("|")[0].replace(",", "")) == field.default


def test_policy_names_and_unknown_names() -> None:
    assert tuple(spec.name for spec in POLICIES) == POLICY_NAMES and len(set(POLICY_NAMES)) == len(POLICIES)
    with pytest.raises(KeyError, match="prefix"):
        make_policy("nope")
    with pytest.raises(TypeError, match="PrefixSettings"):
        policy_spec("prefix").build(ConsistentHashSettings())


def test_consistent_hash_slack_is_its_own_knob() -> None:
    """No silent forcing: consistent_hash defaults to no slack (CHWBL) and takes the slack it is given."""
    owner = make_policy("consistent_hash").select(req(hash_key=42), snaps(0, 0, 0, 0), ctx()).worker
    loads = [1, 1, 1, 1]
    loads[int(owner[1:])] = 3  # cap = ceil(1.25 x 7 / 4) = 3, + slack
    strict = make_policy("consistent_hash")
    assert strict.select(req(hash_key=42), snaps(*loads), ctx()).branch == "hash_overflow"
    slack = make_policy("consistent_hash", ConsistentHashSettings(load_slack=2))
    assert slack.select(req(hash_key=42), snaps(*loads), ctx()).worker == owner
