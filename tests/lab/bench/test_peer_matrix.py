"""The fair peer run's matrix: pooling repeats, the verdict against the peers, the Markdown tables."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from prefix_router.lab.bench import peer_matrix, plots

VLLM_PAGE = """# TYPE vllm_router_prefix_routing_decisions_total counter
vllm_router_prefix_routing_decisions_total{policy="cache_aware",stage="regular",outcome="prefix_hit"} 30
vllm_router_prefix_routing_decisions_total{policy="cache_aware",stage="regular",outcome="missing_tokens"} 10
vllm_router_kv_routing_inputs_total{transport="http",result="render"} 120
"""


def _summary(mean: float, p99: float, errors: int = 0) -> dict[str, Any]:
    return {"requests": 100, "errors": errors, "hit_rate": 0.5, "busy_fraction": 0.8,
            "ttft_ms": {"mean": mean, "p50": mean, "p90": p99, "p99": p99},
            "requests_per_worker": {"http://w2": 60, "w1": 40}, "machine_load_avg": 8.0}  # fmt: skip


def _cell(load: str, ours: dict[str, Any], **peers: dict[str, Any]) -> dict[str, Any]:
    policies = {"prefix-router prefix": ours, **{name.replace("_", "-"): s for name, s in peers.items()}}
    document = {"simulated": True, "policies": policies}
    return {"workload": "mixed", "load": load, "rate": 4.0, "document": document, "router_decisions": {}}


def test_router_decisions_and_missing_share() -> None:
    decisions = peer_matrix.router_decisions(VLLM_PAGE)
    assert decisions == {"prefix_hit": 30.0, "missing_tokens": 10.0, "render": 120.0}
    assert peer_matrix.missing_share(decisions) == pytest.approx(0.25)
    assert peer_matrix.router_decisions("prefix_router_requests_total 5\n") == {}
    assert peer_matrix.missing_share({}) is None


def test_pool_uses_every_request_of_every_repeat() -> None:
    records = [{"ok": True, "ttft_s": t / 1000, "prompt_tokens": 100, "cached_tokens": c} for t, c in
               [(10, 100), (20, 0), (30, 50), (40, 50)]] + [{"ok": False, "ttft_s": None}]  # fmt: skip
    first = {"requests_per_worker": {"a": 2, "b": 1}, "busy_fraction": 0.5, "ttft_ms": {"mean": 15.0}}
    second = {"requests_per_worker": {"a": 1, "b": 1}, "busy_fraction": 0.7, "ttft_ms": {"mean": 35.0}}
    pooled = peer_matrix.pool([first, second], records)
    assert pooled["requests"] == 5 and pooled["errors"] == 1 and pooled["repeats"] == 2
    assert (
        pooled["hit_rate"] == 0.5 and pooled["ttft_ms"]["mean"] == 25.0 and pooled["ttft_ms"]["p50"] == 25.0
    )
    assert pooled["requests_per_worker"] == {"a": 3, "b": 2} and pooled["busy_fraction"] == pytest.approx(0.6)
    assert pooled["repeat_ttft_mean_ms"] == [15.0, 35.0]


def test_verdict_needs_parity_when_cold_and_a_margin_when_hot() -> None:
    cold = _cell("cold", _summary(100, 300), sglang_router=_summary(100, 300), vllm_router=_summary(99, 400))
    hot = _cell("hot", _summary(84, 250), sglang_router=_summary(100, 300), vllm_router=_summary(90, 500))
    matrix = peer_matrix.build([cold, hot])
    by_peer = {(v["load"], v["peer"].split("-")[0]): v for v in matrix["verdicts"]}
    assert by_peer[("cold", "sglang")]["ok"]  # equal is no worse
    assert not by_peer[("cold", "vllm")]["ok"]  # mean 100 > 99
    assert by_peer[("hot", "sglang")]["ok"]  # 0.84 and 0.83 <= 0.85
    assert not by_peer[("hot", "vllm")]["ok"]  # mean 84/90 = 0.93 > 0.85
    assert not matrix["all_ok"] and matrix["simulated"] is True


def test_errors_fail_the_verdict() -> None:
    cell = _cell("cold", _summary(10, 10, errors=3), sglang_router=_summary(100, 300))
    assert [v["ok"] for v in peer_matrix.build([cell])["verdicts"]] == [False]


def test_markdown_tables() -> None:
    cell = _cell("hot", _summary(84, 250), vllm_router=_summary(100, 300))
    cell["router_decisions"] = {"vllm-router": peer_matrix.router_decisions(VLLM_PAGE)}
    text = peer_matrix.markdown(peer_matrix.build([cell]))
    lines = text.splitlines()
    assert lines[0].startswith("| workload | load (busy) | router / policy |")
    assert "| mixed | hot (4/s, 80 %) | prefix-router prefix | 100 | 0 | 50.0% | 84.0 |" in text
    assert lines[2].endswith("| 40 / 60 | 8.0 |")  # requests per worker in worker order (w1, w2), load
    assert "vllm-router (no token ids: 25 %)" in text
    assert "| mixed | hot | prefix-router prefix | vllm-router | 0.84 | 0.83 | <= 0.85 | yes |" in text


def test_each_row_of_ours_gets_its_own_verdict() -> None:
    cell = _cell("hot", _summary(84, 250), sglang_router=_summary(100, 300))
    cell["document"]["policies"]["prefix-router prefix 1 process"] = _summary(95, 250)
    verdicts = peer_matrix.build([cell])["verdicts"]
    assert [(v["ours"], v["ok"]) for v in verdicts] == [
        ("prefix-router prefix", True),
        ("prefix-router prefix 1 process", False),  # 95/100 misses the hot margin
    ]
    only_single = peer_matrix.build([cell], ours=["prefix-router prefix 1 process"])
    assert [v["ours"] for v in only_single["verdicts"]] == ["prefix-router prefix 1 process"]


def test_plot_of_the_matrix(tmp_path: Path) -> None:
    cold = _cell("cold", _summary(20, 80), sglang_router=_summary(25, 90))
    hot = _cell("hot", _summary(30, 120), vllm_router=_summary(35, 150))  # a router missing from a cell
    path = plots.peer_matrix(peer_matrix.build([cold, hot]), tmp_path / "peers.png")
    data = path.read_bytes()
    assert data.startswith(b"\x89PNG\r\n\x1a\n") and len(data) > 10_000
