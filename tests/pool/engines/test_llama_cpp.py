from __future__ import annotations

from typing import Any

from prefix_router.pool.engines import get_adapter
from prefix_router.pool.engines.base import FlushRequest


def test_old_llama_server_page_gives_load_but_no_reuse(fixture_text: Any) -> None:
    load = get_adapter("llama.cpp").parse_metrics(fixture_text("llamacpp_server_old_metrics.txt"))
    assert (load.queue_depth, load.running) == (0, 0)
    assert load.prefix_cache_hits is None and load.prefix_cache_queries is None


def test_recent_llama_server_queries_are_evaluated_plus_cached(fixture_text: Any) -> None:
    load = get_adapter("llama_cpp").parse_metrics(fixture_text("llamacpp_server_recent_metrics.txt"))
    assert load.prefix_cache_hits == 2.16578e06
    assert load.prefix_cache_queries == 2.16578e06 + 96641
    assert load.kv_usage is None


def test_pre_unified_cache_builds_report_kv_usage() -> None:
    page = "llamacpp:kv_cache_usage_ratio 0.5\nllamacpp:requests_deferred 3\n"
    load = get_adapter("llama_cpp").parse_metrics(page)
    assert load.kv_usage == 0.5
    assert load.queue_depth == 3


def test_cached_tokens_from_timings(fixture_json: Any) -> None:
    adapter = get_adapter("llama_cpp")
    assert adapter.cached_tokens(fixture_json("llamacpp_server_b7634_chat_response.json")) == 0
    assert adapter.cached_tokens(fixture_json("llamacpp_server_b6510_stream_end_chunk.json")) == 13
    assert adapter.cached_tokens({"usage": {"prompt_tokens_details": {"cached_tokens": 9}}}) == 9


def test_llama_cpp_python_through_the_shim(fixture_text: Any, fixture_json: Any) -> None:
    adapter = get_adapter("llama-cpp-python")
    assert (adapter.health_path, adapter.metrics_path) == ("/health", "/metrics")
    load = adapter.parse_metrics(fixture_text("llama_cpp_python_metrics.txt"))
    assert (load.prefix_cache_hits, load.prefix_cache_queries) == (29.0, 80.0)
    assert (load.running, load.queue_depth) == (0, 0)
    # llama-cpp-python itself reports no cached tokens in its responses
    assert adapter.cached_tokens(fixture_json("llama_cpp_python_chat_response.json")) is None


def test_flush_only_where_the_engine_has_one() -> None:
    assert get_adapter("llama_cpp").flush_request() is None
    assert get_adapter("llama_cpp_python").flush_request() == FlushRequest("POST", "/reset_prefix_cache")
