"""EndpointSlices (recorded API shapes) to worker URLs, and the membership diff."""

from __future__ import annotations

from typing import Any

import pytest

from prefix_router.pool.worker_discovery.membership import Membership
from prefix_router.pool.worker_discovery.slices import SliceTable, slice_urls


def test_only_ready_non_terminating_endpoints_on_the_named_port(fixtures: Any) -> None:
    first, second = fixtures.json("endpointslice_list.json")["items"]
    assert slice_urls(first, "http") == {"http://10.244.1.17:8000", "http://10.244.2.9:8000"}
    assert slice_urls(second, "http", scheme="https") == {"https://[fd00:10:244::5]:8000"}


def test_without_a_port_name_the_first_tcp_port_is_used(fixtures: Any) -> None:
    first = fixtures.json("endpointslice_list.json")["items"][0]
    assert slice_urls(first) == {"http://10.244.1.17:9090", "http://10.244.2.9:9090"}
    assert slice_urls(first, "grpc") == set()
    assert slice_urls({"endpoints": [{"addresses": ["1.2.3.4"]}]}) == set()


def test_the_table_follows_watch_events(fixtures: Any) -> None:
    table = SliceTable(max_slices=8, port_name="http")
    table.reset(fixtures.json("endpointslice_list.json")["items"])
    assert len(table.urls()) == 3
    import json

    for line in fixtures.lines("endpointslice_watch.jsonl"):
        event = json.loads(line)
        table.apply(event["type"], event["object"])
    assert table.urls() == {
        "http://10.244.1.17:8000",
        "http://10.244.2.9:8000",
        "http://10.244.3.4:8000",
        "http://10.244.4.2:8000",
    }


def test_the_table_is_bounded(fixtures: Any) -> None:
    table = SliceTable(max_slices=1, port_name="http")
    table.reset(fixtures.json("endpointslice_list.json")["items"])
    assert len(table.slices) == 1 and table.ignored == 1
    assert not table.apply("BOOKMARK", {"metadata": {"resourceVersion": "1"}})
    assert table.apply("DELETED", {"metadata": {"name": "vllm-7xk2p"}}) and table.urls() == set()
    with pytest.raises(ValueError):
        SliceTable(0)


def test_membership_reports_differences_in_order(recorder: Any) -> None:
    members = Membership(recorder, max_workers=10)
    members.replace(["http://b:1", "http://a:1"])
    members.replace(["http://b:1", "http://c:1"])
    members.replace(["http://b:1", "http://c:1"])
    assert recorder.calls == [
        ("add", "http://a:1"),
        ("add", "http://b:1"),
        ("remove", "http://a:1"),
        ("add", "http://c:1"),
    ]


def test_membership_is_bounded(recorder: Any) -> None:
    members = Membership(recorder, max_workers=2)
    members.replace([f"http://w{i}:1" for i in range(5)])
    assert members.urls == {"http://w0:1", "http://w1:1"} and members.over_limit == 3
    with pytest.raises(ValueError):
        Membership(recorder, 0)
