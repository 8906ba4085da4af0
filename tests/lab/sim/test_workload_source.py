from __future__ import annotations

from prefix_router.lab.sim.openai_api import EngineLimits
from prefix_router.lab.sim.profiles import get_profile
from prefix_router.lab.sim.requests import SimRequest
from prefix_router.lab.sim.run import simulate, workload_scenario
from prefix_router.lab.sim.simulator import ClusterSpec
from prefix_router.lab.sim.workload_source import WorkloadSource
from prefix_router.lab.workloads.types import Session, Turn, Workload
from prefix_router.routing.settings import RoutingSettings

LIMITS = EngineLimits("sim-demo", 16, 32_768)
SYSTEM = ({"role": "system", "content": "You are a careful assistant. " * 30},)


def conversation(sid: str, arrival: float, turns: int = 3) -> Session:
    asks = tuple(
        Turn(max_tokens=40, messages=({"role": "user", "content": f"{sid} asks {i}"},)) for i in range(turns)
    )
    return Session(sid, arrival, asks, preamble=SYSTEM)


def drain(source: WorkloadSource) -> list[SimRequest]:
    """Run the source as if every request finished instantly at its arrival time."""
    pending = list(source.initial())
    seen: list[SimRequest] = []
    while pending:
        pending.sort(key=lambda r: r.arrival)
        done = pending.pop(0)
        seen.append(done)
        pending.extend(source.followups(done, done.arrival + 1.0))
    return seen


def test_turns_carry_the_generated_reply_forward() -> None:
    source = WorkloadSource(Workload("w", (conversation("s", 0.0),)), RoutingSettings(), LIMITS)
    first, second, third = drain(source)
    assert second.route.blocks[: len(first.extension_blocks)] == first.extension_blocks
    assert third.route.blocks[: len(second.extension_blocks)] == second.extension_blocks
    assert second.engine.blocks[: len(first.engine.extension)] == first.engine.extension
    assert second.arrival == first.arrival + 1.0
    assert first.route.session is None


def test_session_ids_only_when_asked() -> None:
    workload = Workload("w", (conversation("s", 0.0),))
    requests = drain(WorkloadSource(workload, RoutingSettings(), LIMITS, sessions=True))
    assert {r.route.session for r in requests} == {"s"}


def test_closed_loop_keeps_concurrency_sessions_in_flight() -> None:
    sessions = tuple(conversation(f"s{i}", 0.0, turns=1) for i in range(3))
    source = WorkloadSource(Workload("w", sessions, concurrency=1), RoutingSettings(), LIMITS)
    arrivals = [r.arrival for r in drain(source)]
    assert arrivals == [0.0, 1.0, 2.0]


def test_multi_turn_simulation_hits_the_cache_on_later_turns() -> None:
    workload = Workload("w", tuple(conversation(f"s{i}", i * 0.5) for i in range(4)))
    spec = ClusterSpec(1, get_profile("cpu-demo"), 65_536)
    from prefix_router.lab.sim.run import Scenario

    scenario = Scenario(
        "w",
        spec,
        lambda: WorkloadSource(workload, RoutingSettings(), LIMITS),
        lambda p: RoutingSettings(policy=p),
    )
    report = simulate(scenario, ["round_robin"])
    row = report["policies"]["round_robin"]
    assert row["requests"] == 12 and row["errors"] == 0
    assert row["hit_rate"] > 0.5


def test_named_benchmark_workloads_run() -> None:
    spec = ClusterSpec(2, get_profile("cpu-demo"), 65_536, seed=1)
    report = simulate(workload_scenario("chatbots", spec, limit=30), ["random", "prefix"])
    assert all(row["requests"] + row["errors"] == 30 for row in report["policies"].values())
