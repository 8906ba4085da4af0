from __future__ import annotations

from typing import Any

from prefix_router.pool.engines import get_adapter
from prefix_router.pool.engines.base import FlushRequest


def test_v0_4_page_gives_queue_running_usage_and_derived_capacity(fixture_text: Any) -> None:
    load = get_adapter("sglang").parse_metrics(fixture_text("sglang_v0.4_metrics.txt"))
    assert load.queue_depth == 2826
    assert load.running == 162
    assert load.kv_usage == 0.28
    assert load.capacity_tokens == round(123859.0 / 0.28)
    assert load.prefix_cache_hits is None and load.prefix_cache_queries is None


def test_tensor_parallel_repeats_are_not_counted_twice_and_capacity_is_stated() -> None:
    page = (
        'sglang:num_running_reqs{tp_rank="0"} 16.0\n'
        'sglang:num_running_reqs{tp_rank="1"} 16.0\n'
        'sglang:max_total_num_tokens{tp_rank="0"} 262144.0\n'
        'sglang:max_total_num_tokens{tp_rank="1"} 262144.0\n'
        'sglang:token_usage{tp_rank="0"} 0.915\n'
    )
    load = get_adapter("sglang").parse_metrics(page)
    assert load.running == 16
    assert load.capacity_tokens == 262144
    assert load.kv_usage == 0.915


def test_data_parallel_ranks_add_up() -> None:
    page = (
        'sglang:num_queue_reqs{dp_rank="0",tp_rank="0"} 1\n'
        'sglang:num_queue_reqs{dp_rank="1",tp_rank="0"} 2\n'
        'sglang:max_total_num_tokens{dp_rank="0"} 1000\n'
        'sglang:max_total_num_tokens{dp_rank="1"} 1000\n'
    )
    load = get_adapter("sglang").parse_metrics(page)
    assert load.queue_depth == 3
    assert load.capacity_tokens == 2000


def test_cached_token_counters_split_by_source_are_summed() -> None:
    page = (
        'sglang:prompt_tokens_total{is_streaming="true"} 600\n'
        'sglang:prompt_tokens_total{is_streaming="false"} 400\n'
        'sglang:cached_tokens_total{cache_source="device"} 300\n'
        'sglang:cached_tokens_total{cache_source="host"} 50\n'
    )
    load = get_adapter("sglang").parse_metrics(page)
    assert (load.prefix_cache_queries, load.prefix_cache_hits) == (1000.0, 350.0)


def test_cached_tokens_from_openai_usage_or_native_meta_info(fixture_json: Any) -> None:
    adapter = get_adapter("sglang")
    assert adapter.cached_tokens(fixture_json("sglang_chat_stream_usage_chunk.json")) is None
    assert adapter.cached_tokens({"usage": {"prompt_tokens_details": {"cached_tokens": 40}}}) == 40
    assert adapter.cached_tokens({"text": "x", "meta_info": {"cached_tokens": 12}}) == 12


def test_flush_is_flush_cache() -> None:
    assert get_adapter("sglang").flush_request() == FlushRequest("POST", "/flush_cache")
