"""EndpointSlice discovery with the official client against a loopback API server replaying recorded
responses."""

from __future__ import annotations

import time
from typing import Any

from prefix_router.pool.worker_discovery.kubernetes import EndpointSliceDiscovery
from prefix_router.pool.worker_discovery.membership import Membership
from support.waiting import wait_until

INITIAL = {"http://10.244.1.17:8000", "http://10.244.2.9:8000", "http://[fd00:10:244::5]:8000"}
AFTER_WATCH = {
    "http://10.244.1.17:8000",
    "http://10.244.2.9:8000",
    "http://10.244.3.4:8000",
    "http://10.244.4.2:8000",
}


def discovery(api_server: Any, recorder: Any, **kw: Any) -> EndpointSliceDiscovery:
    members = Membership(recorder, max_workers=16)
    kw = {"port_name": "http", "watch_timeout_s": 1, "backoff_initial_s": 0.01, "backoff_max_s": 0.05} | kw
    return EndpointSliceDiscovery(api_server.client(), "llm", "vllm", members, **kw)


async def test_list_then_watch(api_server: Any, recorder: Any, fixtures: Any) -> None:
    api_server.lists = [fixtures.json("endpointslice_list.json")]
    api_server.watches = [fixtures.lines("endpointslice_watch.jsonl")]
    found = discovery(api_server, recorder)
    found.start()
    try:
        await wait_until(
            lambda: found.membership.urls == AFTER_WATCH and len(api_server.watch_requests()) >= 2
        )
    finally:
        await found.stop()
    first, second = api_server.watch_requests()[:2]
    assert api_server.requests[0]["labelSelector"] == "kubernetes.io/service-name=vllm"
    assert first["resourceVersion"] == "48213" and second["resourceVersion"] == "48390"
    assert set(recorder.calls[:3]) == {("add", url) for url in INITIAL}
    assert recorder.calls[3:] == [
        ("add", "http://10.244.3.4:8000"),
        ("add", "http://10.244.4.2:8000"),
        ("remove", "http://[fd00:10:244::5]:8000"),
    ]
    assert found.failures == 0 and found.lists == 1


async def test_gone_relists(api_server: Any, recorder: Any, fixtures: Any) -> None:
    listed = fixtures.json("endpointslice_list.json")
    shrunk = {**listed, "metadata": {"resourceVersion": "48400"}, "items": listed["items"][:1]}
    api_server.lists = [listed, shrunk]
    api_server.watches = [fixtures.lines("watch_gone.jsonl")]
    found = discovery(api_server, recorder)
    found.start()

    def relisted() -> bool:
        versions = [r.get("resourceVersion") for r in api_server.watch_requests()]
        return found.lists == 2 and versions[:1] == ["48213"] and "48400" in versions

    try:
        await wait_until(relisted)
    finally:
        await found.stop()
    assert found.failures == 0
    assert found.membership.urls == INITIAL - {"http://[fd00:10:244::5]:8000"}


async def test_api_errors_back_off_and_keep_the_workers(
    api_server: Any, recorder: Any, fixtures: Any
) -> None:
    api_server.lists = [fixtures.json("endpointslice_list.json")]
    api_server.fail_next = 3
    found = discovery(api_server, recorder)
    found.start()
    try:
        await wait_until(lambda: found.membership.urls == INITIAL)
        assert found.failures == 3
        api_server.fail_next = 100  # the API goes away: the workers stay
        await wait_until(lambda: found.failures >= 6)
        assert found.membership.urls == INITIAL
    finally:
        await found.stop()


async def test_stop_interrupts_an_idle_watch(api_server: Any, recorder: Any, fixtures: Any) -> None:
    api_server.lists = [fixtures.json("endpointslice_list.json")]
    found = discovery(api_server, recorder, watch_timeout_s=30)
    found.start()
    await wait_until(lambda: len(api_server.watch_requests()) == 1)
    started = time.monotonic()
    await found.stop()
    assert time.monotonic() - started < 2.0
