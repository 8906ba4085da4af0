"""The decision feed: bounded, and what leaves the process is numbers, salted ids and public names."""

from __future__ import annotations

import orjson

from prefix_router.node.telemetry.decisions import DecisionFeed, Hasher, closed, public_names
from prefix_router.pool import Worker, WorkerSettings
from prefix_router.routing.types import Branch, CandidateEstimate, Decision, RouteRequest


def request(rid: str, namespace: int = 0, blocks: tuple[int, ...] = (11, 12, 13)) -> RouteRequest:
    return RouteRequest(rid, blocks, 16, 16 * len(blocks), hash_key=blocks[0] if blocks else 0,
                        namespace=namespace)  # fmt: skip


def decision(worker: str = "a", predicted_ttft_s: float | None = None) -> Decision:
    out = Decision(worker, Branch.PREFIX_HIT, 2, 32, 48)
    out.predicted_ttft_s = predicted_ttft_s
    out.estimates = (
        CandidateEstimate(worker, 0.05, 0.01, 0.03, 0.01, 0.002, 0.0),
        CandidateEstimate("b", 0.09, 0.05, 0.03, 0.01, 0.001, 0.004),
    )
    return out


def plain(name: str) -> str:
    return name


def test_the_feed_and_its_index_by_request_stay_bounded() -> None:
    feed = DecisionFeed(size=8)
    for i in range(100):
        entry = feed.add(float(i), "prefix", decision(), request(f"r{i}"))
    assert len(feed) == 8 and len(feed._by_route) == 8 and feed.total == 100
    assert [e.seq for e in feed] == list(range(92, 100))
    feed.reported("r3", 10, 40)  # gone: nothing to fill, nothing re-created
    feed.reported("r99", 10, 40)
    assert (entry.cached_tokens, entry.reported_prompt_tokens) == (10, 40) and len(feed._by_route) == 8


def test_last_and_after_select_the_newest() -> None:
    feed = DecisionFeed(size=16)
    for i in range(10):
        feed.add(float(i), "prefix", decision(), request(f"r{i}"))
    assert [e.seq for e in feed.last(3)] == [7, 8, 9]
    assert [e.seq for e in feed.last(50, after=6)] == [7, 8, 9]
    assert feed.last(5, after=9) == []


def test_a_view_holds_the_figures_and_hashed_ids_only() -> None:
    feed = DecisionFeed(hasher=Hasher(b"k" * 16), origin=100.0)
    entry = feed.add(101.5, "ttft", decision(predicted_ttft_s=0.05), request("r1", namespace=987654321))
    closed(entry, 0.0625, 200)
    [view] = feed.view(plain, 10)
    assert view["t"] == 1.5 and view["worker"] == "a" and view["branch"] == "prefix_hit"
    assert (view["predicted_tokens"], view["prompt_tokens"]) == (32, 48)
    assert (view["predicted_ttft_ms"], view["observed_ttft_ms"], view["status"]) == (50.0, 62.5, 200)
    assert [c["worker"] for c in view["candidates"]] == ["a", "b"]
    assert view["candidates"][1] == {"worker": "b", "ttft_ms": 90.0, "wait_ms": 50.0, "prefill_ms": 30.0,
                                     "decode_ms": 10.0, "added_ms": 1.0, "cache_ms": 4.0}  # fmt: skip
    text = orjson.dumps(view)
    assert b"987654321" not in text and b"11," not in text and b"r1" not in text  # no raw ids
    assert view["tenant"].startswith("t-") and view["prefix"].startswith("p-")
    other = DecisionFeed(hasher=Hasher(b"z" * 16))
    other.add(0.0, "ttft", decision(), request("r1", namespace=987654321))
    assert other.view(plain, 1)[0]["tenant"] != view["tenant"]  # salted: ids link nothing across feeds


def test_public_names_hide_addresses() -> None:
    workers = [
        Worker.from_config(WorkerSettings(url="http://10.1.2.3:8000")),  # named 10.1.2.3:8000
        Worker.from_config(WorkerSettings(url="http://gpu-7:8000", name="gpu-7")),  # its host
        Worker.from_config(WorkerSettings(url="http://10.1.2.4:8000", name="llama-a")),
    ]
    names = public_names(workers, Hasher(b"s" * 16))
    assert names("llama-a") == "llama-a"
    for raw in ("10.1.2.3:8000", "gpu-7", "10.9.9.9:1"):  # the last: a worker gone from the pool
        shown = names(raw)
        assert shown.startswith("w-") and raw not in shown and shown == names(raw)
    assert names("gone-worker") == "gone-worker"
