"""DNS discovery against the system resolver (localhost) and an injected one."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from prefix_router.pool.worker_discovery.dns import DnsDiscovery, address_url, system_resolver
from prefix_router.pool.worker_discovery.membership import Membership


async def test_localhost_resolves_through_the_system_resolver(recorder: Any) -> None:
    assert "127.0.0.1" in await system_resolver("localhost", 8000)
    found = DnsDiscovery("localhost", 8000, Membership(recorder, 8))
    assert await found.refresh()
    assert "http://127.0.0.1:8000" in found.membership.urls


def test_address_urls() -> None:
    assert address_url("10.0.0.1", 80) == "http://10.0.0.1:80"
    assert address_url("fd00::1", 80, "https") == "https://[fd00::1]:80"
    assert address_url("vllm-0.vllm", 80) == "http://vllm-0.vllm:80"


class Script:
    """A resolver answering from a list (an exception instance is raised)."""

    def __init__(self, *answers: Any) -> None:
        self.answers = list(answers)
        self.calls = 0

    async def __call__(self, host: str, port: int) -> list[str]:
        self.calls += 1
        answer = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        if isinstance(answer, BaseException):
            raise answer
        if answer == "hang":
            await asyncio.sleep(10)
        return list(answer)


async def test_workers_follow_the_records_and_failures_keep_them(recorder: Any) -> None:
    script = Script(["10.0.0.1", "10.0.0.2"], ["10.0.0.2", "10.0.0.3"], OSError("SERVFAIL"), [])
    found = DnsDiscovery("vllm.llm.svc", 8000, Membership(recorder, 8), resolver=script)
    assert [await found.refresh() for _ in range(4)] == [True, True, False, True]
    assert recorder.calls == [
        ("add", "http://10.0.0.1:8000"),
        ("add", "http://10.0.0.2:8000"),
        ("remove", "http://10.0.0.1:8000"),
        ("add", "http://10.0.0.3:8000"),
        ("remove", "http://10.0.0.2:8000"),
        ("remove", "http://10.0.0.3:8000"),
    ]
    assert found.failures == 1


async def test_a_slow_resolver_times_out(recorder: Any) -> None:
    found = DnsDiscovery("x", 1, Membership(recorder, 8), resolver=Script("hang"), timeout_s=0.05)
    assert not await found.refresh() and found.failures == 1


async def test_the_interval_loop_runs_until_stopped(recorder: Any) -> None:
    script = Script(["10.0.0.1"])
    found = DnsDiscovery("x", 1, Membership(recorder, 8), resolver=script, interval_s=0.01)
    found.start()
    await asyncio.sleep(0.1)
    await found.stop()
    calls = script.calls
    await asyncio.sleep(0.05)
    assert calls >= 3 and script.calls == calls


def test_bad_intervals_are_refused(recorder: Any) -> None:
    with pytest.raises(ValueError):
        DnsDiscovery("x", 1, Membership(recorder, 8), interval_s=0)
