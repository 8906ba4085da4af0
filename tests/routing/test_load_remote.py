"""Other replicas' in-flight counts (shared state) in the load view."""

from __future__ import annotations

from prefix_router.routing.load import LoadTracker


def make_tracker() -> LoadTracker:
    tracker = LoadTracker(max_tracked=10, engine_stale_s=5.0)
    tracker.add_worker("a")
    tracker.add_worker("b")
    return tracker


def test_remote_counts_add_to_the_snapshot_but_not_to_the_local_count() -> None:
    tracker = make_tracker()
    tracker.start("r1", "a", 10)
    tracker.set_remote_in_flight("a", 4)
    assert tracker.snapshot("a", 0.0).in_flight == 5
    assert tracker.in_flight("a") == 1
    assert tracker.snapshot("b", 0.0).in_flight == 0


def test_remote_counts_are_replaced_not_accumulated() -> None:
    tracker = make_tracker()
    tracker.set_remote_in_flight("b", 7)
    tracker.set_remote_in_flight("b", 2)
    assert tracker.snapshot("b", 0.0).in_flight == 2
    tracker.set_remote_in_flight("b", -3)
    assert tracker.snapshot("b", 0.0).in_flight == 0


def test_remote_counts_survive_local_finishes() -> None:
    tracker = make_tracker()
    tracker.start("r1", "a", 10)
    tracker.set_remote_in_flight("a", 3)
    tracker.finish("r1")
    assert tracker.snapshot("a", 0.0).in_flight == 3


def test_unknown_and_removed_workers_are_ignored() -> None:
    tracker = make_tracker()
    tracker.set_remote_in_flight("ghost", 9)
    assert tracker.snapshot("ghost", 0.0).in_flight == 0
    tracker.set_remote_in_flight("a", 5)
    tracker.remove_worker("a")
    tracker.add_worker("a")
    assert tracker.snapshot("a", 0.0).in_flight == 0
