from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from prefix_router.pool.engines import ENGINE_NAMES, ENGINES, EngineLoad, EngineSpec, detect, get_adapter
from prefix_router.pool.settings import WorkerSettings

DOCS = Path(__file__).resolve().parents[3] / "docs" / "engines.md"


@pytest.mark.parametrize(
    ("metrics", "models", "engine"),
    [
        ("vllm_v0.7_metrics.txt", "vllm_v0.7_models.json", "vllm"),
        ("vllm_nim_tp2_metrics.txt", None, "vllm"),
        (None, "vllm_v0.7_models.json", "vllm"),
        ("sglang_v0.4_metrics.txt", None, "sglang"),
        (None, "sglang_models.json", "sglang"),
        ("llamacpp_server_recent_metrics.txt", "llamacpp_server_models.json", "llama_cpp"),
        ("llamacpp_server_old_metrics.txt", None, "llama_cpp"),
        (None, "llamacpp_server_models.json", "llama_cpp"),
        ("llama_cpp_python_metrics.txt", "llama_cpp_python_models.json", "llama_cpp_python"),
        ("llama_cpp_python_metrics.txt", None, "llama_cpp_python"),
        (None, "llama_cpp_python_models.json", "llama_cpp_python"),
        ("tgi_metrics.txt", "tgi_models.json", "tgi"),
        (None, "tgi_models.json", "tgi"),
    ],
)
def test_detect_each_engine_from_its_recorded_outputs(
    metrics: str | None, models: str | None, engine: str, fixture_text: Any, fixture_json: Any
) -> None:
    text = fixture_text(metrics) if metrics else None
    body = fixture_json(models) if models else None
    assert detect(text, body) == engine


def test_unknown_shapes_are_generic() -> None:
    assert detect(None, None) == "generic"
    assert detect("python_gc_objects_collected_total 1\n", {"data": []}) == "generic"
    assert detect("", {"data": [{"id": "m", "owned_by": "openai", "created": 5}]}) == "generic"
    assert detect(None, {"data": "nope"}) == "generic"


def test_get_adapter_accepts_aliases_and_names_the_known_engines() -> None:
    assert get_adapter("LLAMA-CPP").name == "llama_cpp"
    assert get_adapter("llama.cpp").name == "llama_cpp"
    assert get_adapter("SGLang").name == "sglang"
    for name in ENGINE_NAMES:
        assert get_adapter(name).name == name
    with pytest.raises(KeyError, match="vllm"):
        get_adapter("ollama")


@pytest.mark.parametrize("spec", ENGINES, ids=lambda spec: spec.name)
def test_every_engine_row_builds_detects_and_is_documented(spec: EngineSpec) -> None:
    adapter = get_adapter(spec.name)
    assert adapter.name == spec.name and spec.summary
    assert isinstance(adapter.parse_metrics("# HELP nothing\n"), EngineLoad)
    assert adapter.cached_tokens({"usage": {"prompt_tokens_details": {"cached_tokens": 3}}}) in (3, None)
    flush = adapter.flush_request()
    assert flush is None or (flush.method in ("POST", "GET") and flush.path.startswith("/"))
    for spelling in (spec.name, spec.name.upper().replace("_", "-"), *spec.aliases):
        assert get_adapter(spelling).name == spec.name
        assert WorkerSettings(url="http://a:1", engine=spelling).engine == spec.name
    for prefix in spec.metric_prefixes:
        assert detect(f"# TYPE x gauge\n{prefix}some_series 1\n", None) == spec.name
    for owner in spec.owners:
        assert detect(None, {"data": [{"id": "m", "owned_by": owner, "created": 5}]}) == spec.name
    if spec.refines is not None:
        refined = get_adapter(spec.refines)
        assert refined.name == spec.refines
        page = "".join(
            f"{p}x 1\n" for p in next(s for s in ENGINES if s.name == spec.refines).metric_prefixes
        )
        assert detect(page, None) == spec.refines
        for marker in spec.metric_markers:
            assert detect(page + f"{marker} 4\n", None) == spec.name
    row = next(
        (line for line in DOCS.read_text().splitlines() if line.startswith(f"| `{spec.name}` |")), None
    )
    assert row is not None, f"docs/engines.md: no table row for engine {spec.name}"
    assert all(f"`{alias}`" in row for alias in spec.aliases)


def test_engine_names_are_the_rows_and_unique() -> None:
    assert tuple(spec.name for spec in ENGINES) == ENGINE_NAMES
    spellings = [s for spec in ENGINES for s in (spec.name, *spec.aliases)]
    assert len(spellings) == len(set(spellings))
    assert "## Extending: adding an engine" in DOCS.read_text()
