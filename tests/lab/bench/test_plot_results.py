"""``benchmarks/plot_results.py``: the README's plot is drawn from the committed results files, with the
figures the docs quote, and every setting says whether its engines were simulated."""

from __future__ import annotations

from pathlib import Path

from support.scripts import benchmark_module


def test_the_settings_carry_the_figures_the_docs_quote() -> None:
    with benchmark_module("plot_results.py") as plot_results:
        settings = {s.label: s.figures for s in plot_results.settings()}
    assert len(settings) == 9
    assert all("SIMULATED" in label or "(real)" in label for label in settings)
    mooncake = settings["Mooncake trace,\n16 engines\n(SIMULATED)"]
    assert round(mooncake["prefix"].hit_rate * 100, 1) == 33.5
    assert round(mooncake["random"].hit_rate * 100, 1) == 7.0
    assert round(mooncake["prefix"].ttft_mean_ms) == 461
    shared = settings["vLLM x3,\nshared prompts\n(real)"]
    assert round(shared["prefix"].hit_rate * 100, 1) == 85.7
    assert round(shared["sglang"].ttft_mean_ms) == 390
    assert all("prefix" in figures for figures in settings.values())


def test_the_plot_is_a_png(tmp_path: Path) -> None:
    with benchmark_module("plot_results.py") as plot_results:
        out = plot_results.plot(plot_results.settings(), tmp_path / "plot.png")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
