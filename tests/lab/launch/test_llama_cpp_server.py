"""The shim's counting and endpoints, without the engine (it only imports the stdlib at module level)."""

from __future__ import annotations

from collections.abc import Iterator, MutableMapping, Sequence
from typing import Any

from prefix_router.lab.launch import llama_cpp_server as shim
from prefix_router.pool.engines import detect, get_adapter


class FakeLlama:
    """Stands in for ``llama_cpp.Llama``: ``generate`` keeps ``reuse`` tokens, then evals the rest."""

    def __init__(self, reuse: int) -> None:
        self.reuse = reuse
        self.n_tokens = 0
        self.cache: Any = None
        self.evals: list[int] = []

    def generate(self, tokens: Sequence[int]) -> Iterator[int]:
        self.n_tokens = self.reuse
        rest = list(tokens)[self.reuse :]
        if rest:
            self.eval(rest)
        for token in (1, 2, 3):
            self.eval([token])
            yield token

    def eval(self, tokens: Sequence[int]) -> None:
        self.evals.append(len(tokens))
        self.n_tokens += len(tokens)


def patched(reuse: int) -> tuple[FakeLlama, shim.PromptStats]:
    cls = type("PatchedLlama", (FakeLlama,), {})
    stats = shim.PromptStats()
    shim.patch_llama(cls, stats)
    llama: FakeLlama = cls(reuse)
    return llama, stats


def test_reused_prefix_and_evaluated_suffix_are_counted_once() -> None:
    llama, stats = patched(reuse=30)
    assert list(llama.generate(range(100))) == [1, 2, 3]
    assert stats.snapshot()[:2] == (70, 30)
    assert llama.evals == [70, 1, 1, 1]


def test_cold_prompt_counts_everything_as_evaluated() -> None:
    llama, stats = patched(reuse=0)
    list(llama.generate(range(50)))
    list(llama.generate(range(20)))
    assert stats.snapshot()[:2] == (70, 0)


def test_fully_cached_prompt_with_no_prompt_eval_counts_as_cached() -> None:
    llama, stats = patched(reuse=40)
    list(llama.generate(range(40)))
    assert stats.snapshot()[:2] == (0, 40)


def test_metrics_page_reads_back_through_the_adapter_and_is_detected() -> None:
    stats = shim.PromptStats()
    stats.record(cached=300, evaluated=100)
    stats.add_in_flight(3)
    page = shim.metrics_text(stats)
    load = get_adapter("llama_cpp_python").parse_metrics(page)
    assert (load.prefix_cache_hits, load.prefix_cache_queries) == (300.0, 400.0)
    assert (load.running, load.queue_depth) == (1, 2)
    assert detect(page, None) == "llama_cpp_python"


def test_cache_facts_counts_entries_and_bytes() -> None:
    class State:
        def __init__(self, size: int) -> None:
            self.llama_state_size = size

    class Cache:
        def __init__(self) -> None:
            self.cache_state = {(1,): State(10), (2,): State(5)}

    assert shim.cache_facts(Cache()) == (2, 15)
    assert shim.cache_facts(None) == (0, 0)
    assert shim.cache_facts(object()) == (0, 0)


async def test_in_flight_counts_generation_requests_until_their_response_ends() -> None:
    stats = shim.PromptStats()
    seen: list[int] = []

    async def app(scope: MutableMapping[str, Any], receive: Any, send: Any) -> None:
        seen.append(stats.snapshot()[2])

    wrapped = shim.in_flight_middleware(app, stats)
    await wrapped({"type": "http", "path": "/v1/chat/completions"}, None, None)
    await wrapped({"type": "http", "path": "/metrics"}, None, None)
    assert seen == [1, 0]
    assert stats.snapshot()[2] == 0


def test_reset_replaces_the_cache_with_an_empty_one_of_the_same_size() -> None:
    class Cache:
        def __init__(self, capacity_bytes: int) -> None:
            self.capacity_bytes = capacity_bytes

    class Llama:
        def __init__(self) -> None:
            self.cache: Any = Cache(123)
            self.was_reset = False

        def set_cache(self, cache: Any) -> None:
            self.cache = cache

        def reset(self) -> None:
            self.was_reset = True

    llama = Llama()
    old = llama.cache
    shim.reset_llama(llama)
    assert llama.cache is not old and llama.cache.capacity_bytes == 123 and llama.was_reset
