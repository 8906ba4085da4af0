from __future__ import annotations

from typing import Any

from prefix_router.pool.engines import get_adapter


def test_tgi_page_gives_queue_and_batch_only(fixture_text: Any) -> None:
    load = get_adapter("tgi").parse_metrics(fixture_text("tgi_metrics.txt"))
    assert (load.queue_depth, load.running) == (2, 1)
    assert load.kv_usage is None and load.capacity_tokens is None and load.prefix_cache_hits is None


def test_tgi_has_no_flush_and_reads_the_standard_field_if_present() -> None:
    adapter = get_adapter("text-generation-inference")
    assert adapter.flush_request() is None
    assert adapter.cached_tokens({"usage": {"prompt_tokens": 3}}) is None
    assert adapter.cached_tokens({"usage": {"prompt_tokens_details": {"cached_tokens": 2}}}) == 2


def test_generic_adapter_scrapes_nothing() -> None:
    adapter = get_adapter("generic")
    assert adapter.metrics_path is None
    assert adapter.parse_metrics("vllm:num_requests_waiting 4\n").queue_depth is None
    assert adapter.cached_tokens({"usage": {"prompt_tokens_details": {"cached_tokens": True}}}) is None
