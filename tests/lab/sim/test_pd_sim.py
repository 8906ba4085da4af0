"""The cluster simulator with prefill/decode disaggregation (simulated): the two stages, the KV
transfer's cost, and the decider judged against the engines' truth."""

from __future__ import annotations

import dataclasses

import pytest

from prefix_router.lab.sim.pd_sim import PdSpec
from prefix_router.lab.sim.profiles import get_profile
from prefix_router.lab.sim.run import Scenario, workload_scenario
from prefix_router.lab.sim.simulator import ClusterSimulation, ClusterSpec, RunResult

PROFILE = get_profile("cpu-demo")


def scenario(workload: str, requests: int, profile: object = PROFILE, **options: object) -> Scenario:
    spec = ClusterSpec(4, profile, 65_536)  # type: ignore[arg-type]
    return workload_scenario(workload, spec, limit=requests, options=dict(options))


def run(sc: Scenario, pd: PdSpec | None) -> tuple[ClusterSimulation, RunResult]:
    sim = ClusterSimulation(sc.spec, "prefix", sc.make_source(), sc.routing("prefix"), pd=pd)
    return sim, sim.run()


def result(sc: Scenario, pd: PdSpec | None) -> RunResult:
    return run(sc, pd)[1]


def test_cold_prompts_go_through_a_prefill_engine_then_decode_with_the_prompt_loaded() -> None:
    sc = scenario("unique", 40, prompt_tokens=512, output_tokens=16)
    sim, done = run(sc, PdSpec.split(2, 2))
    pd = done.pd
    assert pd is not None
    assert pd["prefills"] == 40 and pd["skipped"] == {} and pd["cold_turns"] == 40 and pd["cold_skipped"] == 0
    stats = done.stats
    assert stats.completed == 40 and stats.errors == 0
    assert sum(stats.per_instance[:2]) == 40 and sum(stats.per_instance[2:]) == 40  # one stage each
    assert all(c >= p // 16 * 16 - 16 for c, p in zip(stats.cached, stats.prompt, strict=True))  # loaded
    assert pd["transferred_tokens"] > 0 and pd["transfer_s"] > 0
    assert sum(sim.engines[i].stats.prefill_computed for i in (2, 3)) < 40 * 16  # no prompt recomputed


def test_the_transfer_costs_its_time_per_token() -> None:
    slow = dataclasses.replace(PROFILE, kv_transfer_s_per_token=1e-3)
    sc = scenario("unique", 20, slow, prompt_tokens=512, output_tokens=8)
    fast = scenario("unique", 20, dataclasses.replace(PROFILE, kv_transfer_s_per_token=0.0),
                    prompt_tokens=512, output_tokens=8)  # fmt: skip
    slow_run, fast_run = result(sc, PdSpec.split(2, 2)), result(fast, PdSpec.split(2, 2))
    assert min(slow_run.stats.ttft) >= 0.49  # at least 31 blocks of 16 tokens moved at 1 ms a token
    assert max(fast_run.stats.ttft) < 0.4
    assert slow_run.pd is not None and slow_run.pd["transfer_s"] == pytest.approx(
        slow_run.pd["transferred_tokens"] * 1e-3
    )


def test_the_decider_skips_the_prefill_of_turns_the_decode_engine_holds() -> None:
    sc = scenario("mixed", 200)
    pd = result(sc, PdSpec.split(2, 2)).pd
    assert pd is not None and pd["held_turns"] > 50
    assert pd["held_skipped_fraction"] >= 0.8 and pd["cold_turns"] > 0 and pd["cold_skipped"] == 0
    assert pd["skipped"]["decode_holds_prefix"] + pd["prefills"] == 200


def test_the_threshold_bounds_what_is_skipped() -> None:
    sc = scenario("mixed", 120)
    never = result(sc, PdSpec.split(2, 2, skip_prefill_tokens=0)).pd
    always = result(sc, PdSpec.split(2, 2, skip_prefill_tokens=10**9)).pd
    assert never is not None and always is not None
    assert always["cold_skipped"] == 0  # a cold prompt keeps its prefill, whatever the threshold
    assert sum(always["skipped"].values()) > sum(never["skipped"].values())


def test_colocated_runs_count_no_stages() -> None:
    sc = scenario("unique", 10, prompt_tokens=256, output_tokens=4)
    assert result(sc, None).pd is None
    both = result(sc, PdSpec(("both",) * 4)).pd
    assert both is not None and both["prefills"] == 0 and both["skipped"] == {"no_prefill_worker": 10}


def test_roles_must_match_the_instances() -> None:
    sc = scenario("unique", 1)
    with pytest.raises(ValueError, match="3 roles for 4 instances"):
        ClusterSimulation(sc.spec, "prefix", sc.make_source(), sc.routing("prefix"), pd=PdSpec.split(1, 2))


def test_the_decode_charged_at_the_choice_spreads_the_decodes() -> None:
    # long prompts arriving faster than one prefill: each decode is charged to its worker at the choice
    # (as the edge does), so the requests arriving while a prefill runs do not herd onto one decode worker
    profile = get_profile("llama-3.1-8b-h100")
    spec = ClusterSpec(8, profile, profile.kv_capacity_tokens)
    options = {"prompt_tokens": 4096, "output_tokens": 64}
    sc = workload_scenario("unique", spec, rate_scale=4.0, limit=240, options=options)
    counts = result(sc, PdSpec.split(4, 4)).stats.per_instance[4:]
    assert sum(counts) == 240
    assert max(counts) - min(counts) <= 4
