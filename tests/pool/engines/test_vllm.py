from __future__ import annotations

import json
from typing import Any

from prefix_router.pool.engines import get_adapter
from prefix_router.pool.engines.base import FlushRequest
from prefix_router.pool.engines.registry import detect


def test_v0_page_gives_load_and_capacity_but_no_prefix_counters(fixture_text: Any) -> None:
    load = get_adapter("vllm").parse_metrics(fixture_text("vllm_v0.7_metrics.txt"))
    assert load.queue_depth == 0
    assert load.running == 0
    assert load.kv_usage == 0.0
    assert load.block_size == 16
    assert load.capacity_tokens == 16 * 81767
    assert load.prefix_cache_queries is None and load.prefix_cache_hits is None


def test_recent_page_capacity_comes_from_the_stated_token_count(fixture_text: Any) -> None:
    load = get_adapter("vllm").parse_metrics(fixture_text("vllm_nim_tp2_metrics.txt"))
    assert load.capacity_tokens == 551520
    assert load.block_size == 16
    assert load.kv_usage == 0.0


def test_v1_prefix_cache_counters_are_read(fixture_text: Any) -> None:
    load = get_adapter("vllm").parse_metrics(fixture_text("vllm_v1_counters_metrics.txt"))
    assert load.prefix_cache_queries == 413.0
    assert load.prefix_cache_hits == 96.0


def test_data_parallel_engines_add_up_and_the_fullest_sets_usage() -> None:
    page = (
        'vllm:num_requests_waiting{engine="0",model_name="m"} 2.0\n'
        'vllm:num_requests_waiting{engine="1",model_name="m"} 3.0\n'
        'vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.2\n'
        'vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.7\n'
        'vllm:cache_config_info{block_size="16",engine="0",num_gpu_blocks="100"} 1.0\n'
        'vllm:cache_config_info{block_size="16",engine="1",num_gpu_blocks="100"} 1.0\n'
    )
    load = get_adapter("vllm").parse_metrics(page)
    assert load.queue_depth == 5
    assert load.kv_usage == 0.7
    assert load.capacity_tokens == 3200


def test_deprecated_gpu_prefix_counters_are_a_fallback() -> None:
    page = "vllm:gpu_prefix_cache_queries_total 10\nvllm:gpu_prefix_cache_hits_total 4\n"
    load = get_adapter("vllm").parse_metrics(page)
    assert (load.prefix_cache_queries, load.prefix_cache_hits) == (10.0, 4.0)


def test_cached_tokens_need_prompt_tokens_details(fixture_json: Any) -> None:
    adapter = get_adapter("vllm")
    assert adapter.cached_tokens(fixture_json("vllm_chat_response_no_details.json")) is None
    assert adapter.cached_tokens(fixture_json("vllm_chat_response_cached_shape.json")) == 1024


def test_recorded_cpu_build_page(fixture_text: Any) -> None:
    """vLLM 0.32 CPU (recorded here, tests/pool/engines/fixtures/record_vllm_cpu.py): 64 blocks of 128."""
    load = get_adapter("vllm").parse_metrics(fixture_text("vllm_cpu_0.32_metrics.txt"))
    assert (load.capacity_tokens, load.block_size) == (8192, 128)
    assert (load.queue_depth, load.running) == (0, 0)
    assert load.kv_usage is not None and 0.0 <= load.kv_usage <= 1.0
    assert load.prefix_cache_queries is not None and load.prefix_cache_hits is not None
    assert load.prefix_cache_queries > load.prefix_cache_hits > 0
    assert load.prefix_cache_hits % 128 == 0  # the engine hits whole blocks only


def test_recorded_cpu_build_is_identified(fixture_text: Any, fixture_json: Any) -> None:
    metrics, models = fixture_text("vllm_cpu_0.32_metrics.txt"), fixture_json("vllm_cpu_0.32_models.json")
    assert detect(metrics, models) == "vllm"
    assert detect(None, models) == "vllm"


def test_recorded_cached_tokens_whole_and_streamed(fixture_json: Any, fixture_text: Any) -> None:
    adapter = get_adapter("vllm")
    assert adapter.cached_tokens(fixture_json("vllm_cpu_0.32_chat_cached_response.json")) == 128
    events = [line[6:] for line in fixture_text("vllm_cpu_0.32_chat_stream.txt").splitlines()
              if line.startswith("data: {")]  # fmt: skip
    last = json.loads(events[-1])
    assert last["choices"] == [] and adapter.cached_tokens(last) == 128
    assert all(adapter.cached_tokens(json.loads(e)) is None for e in events[:-1])


def test_flush_and_paths() -> None:
    adapter = get_adapter("vllm")
    assert adapter.flush_request() == FlushRequest("POST", "/reset_prefix_cache")
    assert (adapter.health_path, adapter.metrics_path) == ("/health", "/metrics")
