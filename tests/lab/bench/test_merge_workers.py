from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from prefix_router.lab.bench import merge, workers
from prefix_router.lab.bench.workers import Counters

FIXTURES = Path(__file__).parents[2] / "pool" / "engines" / "fixtures"
PREEMPTED = 'vllm:num_preemptions_total{engine="0",model_name="smollm2-135m"}'


def _doc(label: str, p50: float, workers_: list[str] | None = None, simulated: bool = True) -> dict[str, Any]:
    summary = {"requests": 10, "errors": 0, "hit_rate": 0.5, "ttft_ms": {"p50": p50, "p90": p50, "p99": p50},
               "e2e_ms": {"p50": 2 * p50}, "throughput_rps": 5.0, "load_imbalance": 1.2}  # fmt: skip
    return {"simulated": simulated, "workload": "mixed", "workers": workers_ or ["a", "b"],
            "router": f"url-{label}", "policies": {label: summary}, "baseline": label}  # fmt: skip


def test_merge_keeps_every_label_and_picks_the_baseline() -> None:
    doc = merge.merge([_doc("ours", 20.0), _doc("theirs", 40.0)], baseline="theirs")
    assert list(doc["policies"]) == ["ours", "theirs"] and doc["baseline"] == "theirs"
    assert doc["policies"]["ours"]["router"] == "url-ours"
    assert doc["workers_match"] and doc["workload_match"] and doc["simulated"] is True
    table = merge.markdown(doc)
    lines = table.splitlines()
    assert len(lines) == 4 and lines[2].startswith("| ours |") and "2.00x" in lines[2]


def test_merge_flags_mismatches_and_duplicates() -> None:
    doc = merge.merge([_doc("x", 1.0), _doc("y", 1.0, ["c"], simulated=False)], baseline="absent")
    assert doc["baseline"] == "x" and not doc["workers_match"] and doc["simulated"] is False
    with pytest.raises(ValueError, match="twice"):
        merge.merge([_doc("x", 1.0), _doc("x", 2.0)])
    with pytest.raises(ValueError):
        merge.merge([])


def test_counter_deltas() -> None:
    before = {"a": Counters(10, 100, 50), "b": Counters(0, 0, 0)}
    after = {"a": Counters(15, 300, 100), "b": Counters(5, 100, 100)}
    assert workers.requests_delta(before, after) == {"a": 5, "b": 5}
    assert workers.prompt_tokens_delta(before, after) == {"a": 200, "b": 100}
    assert workers.engine_hit_rate(before, after) == pytest.approx(150 / 300, abs=1e-4)
    unknown = {"a": Counters(None, None, None), "b": Counters(5, 100, 100)}
    assert workers.requests_delta(before, unknown) is None
    assert workers.engine_hit_rate(before, unknown) is None
    reset = {"a": Counters(0, 0, 0), "b": Counters(5, 100, 100)}
    assert workers.requests_delta(before, reset) == {"a": 0, "b": 5}


def test_preemptions_are_read_from_a_vllm_page_and_counted_per_run() -> None:
    page = FIXTURES.joinpath("vllm_cpu_0.32_metrics.txt").read_text()
    idle = workers.from_page(page, "vllm")
    assert idle.preemptions == 0 and idle.prefix_queries is not None
    busy = workers.from_page(page.replace(PREEMPTED + " 0.0", PREEMPTED + " 7.0"), "vllm")
    assert busy.preemptions == 7
    assert workers.preemptions_delta({"a": idle}, {"a": busy}) == {"a": 7}
    assert workers.preemptions_delta({"a": Counters()}, {"a": busy}) is None  # an engine that does not say


def test_first_model() -> None:
    assert workers.first_model({"data": [{"id": "m1"}, {"id": "m2"}]}) == "m1"
    assert workers.first_model({"data": []}) is None and workers.first_model(None) is None


def test_busy_fraction_from_simulated_engines() -> None:
    page = (
        'prefix_router_sim:busy_seconds_total{engine="0",model_name="m"} 3.0\n'
        'prefix_router_sim:time_scale{engine="0",model_name="m"} 2.0\n'
    )
    assert workers.busy_wall_s(page) == 6.0  # model seconds x time scale
    assert workers.busy_wall_s('vllm:num_requests_running{engine="0"} 1\n') is None
    before = {"a": Counters(busy_s=1.0), "b": Counters(busy_s=0.0)}
    after = {"a": Counters(busy_s=9.0), "b": Counters(busy_s=4.0)}
    assert workers.busy_fraction(before, after, wall_s=10.0) == pytest.approx(0.6)
    assert workers.busy_fraction(before, {"a": Counters(busy_s=9.0), "b": Counters()}, 10.0) is None
    assert workers.busy_fraction(before, after, wall_s=0.0) is None
