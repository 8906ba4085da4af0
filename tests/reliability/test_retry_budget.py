"""``timeouts.first_byte_s`` is the request's first-byte budget, all attempts together: a non-streamed
generation slower than the budget runs once, not on up to ``retries.max_attempts`` workers in turn, while
failures that end early (a refused connection, a 5xx) are still retried within what is left of it."""

from __future__ import annotations

from typing import Any

import orjson


async def test_a_slow_generation_runs_once_then_504(fake_engine: Any, start_router: Any, kit: Any) -> None:
    engines = [await fake_engine(f"slow{i}", delay_s=1.0) for i in range(3)]
    settings = {"timeouts.first_byte_s": 0.4, "retries.max_attempts": 3}
    workers = [{"url": e.url, "name": e.name, "models": ["m"]} for e in engines]
    router = await start_router(*workers, settings=settings)
    status, _, body = await kit.post(router.url)
    assert status == 504 and orjson.loads(body)["error"]["code"] == "upstream_timeout"
    # one generation: before, each of the 3 workers got it in turn (0.4 s each, 3 generations)
    assert sum(len(e.generations) for e in engines) == 1
    assert router.state.metrics.retries.get() == 0
    await kit.wait_until(lambda: kit.quiescent(router))


async def test_early_failures_are_retried_within_the_budget(
    fake_engine: Any, start_router: Any, kit: Any
) -> None:
    flaky = await fake_engine("flaky", fail_next=10)
    slowish = await fake_engine("slowish", delay_s=0.2)
    settings = {"timeouts.first_byte_s": 2.0, "retries.max_attempts": 2}
    workers = [{"url": e.url, "name": e.name, "models": ["m"]} for e in (flaky, slowish)]
    router = await start_router(*workers, settings=settings)
    for _ in range(2):  # round robin: one of them starts on the engine answering 500
        status, headers, _ = await kit.post(router.url, headers=kit.RR)
        assert status == 200 and headers["x-prefix-router-worker"] == "slowish"
    assert len(flaky.generations) == router.state.metrics.retries.get() >= 1  # each 500 retried once


async def test_a_retry_gets_what_is_left_of_the_budget_not_a_fresh_one(
    fake_engine: Any, start_router: Any, kit: Any
) -> None:
    """A 500 after 0.6 s, then a worker that needs 0.6 s, within a 1 s budget: the retry has 0.4 s left and
    the answer is 504 (with a fresh budget per attempt, the mutation audit's survivor, it was 200)."""
    failing = await fake_engine("a-failing", delay_s=0.6, fail_next=10)
    slow = await fake_engine("b-slow", delay_s=0.6)
    settings = {"timeouts.first_byte_s": 1.0, "retries.max_attempts": 2}
    workers = [{"url": e.url, "name": e.name, "models": ["m"]} for e in (failing, slow)]
    router = await start_router(*workers, settings=settings)
    status, _, body = await kit.post(router.url, headers=kit.RR)  # round robin: the first turn is a-failing
    assert status == 504 and orjson.loads(body)["error"]["code"] == "upstream_timeout"
    assert len(failing.generations) == 1 and len(slow.generations) == 1
    await kit.wait_until(lambda: kit.quiescent(router))
