from __future__ import annotations

from typing import Any

import pytest

from prefix_router.pool.engines import ENGINE_NAMES, detect, get_adapter


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
