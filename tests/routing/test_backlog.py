from __future__ import annotations

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from prefix_router.routing.backlog import PrefillBacklog, prefill_work
from prefix_router.routing.types import WorkerSnapshot


def test_prefill_work_is_linear_for_short_prompts_and_grows_with_context() -> None:
    assert prefill_work(0, 5_000, 32_768) == 0.0
    assert prefill_work(100, 0, 32_768) == pytest.approx(100, rel=0.01)
    # the same 1,000 new tokens cost more after a long cached context (attention over it)
    assert prefill_work(1_000, 64_000, 32_768) > 2.9 * prefill_work(1_000, 0, 32_768)
    # a whole 128k prompt costs about 3x its token count
    assert prefill_work(131_072, 0, 32_768) == pytest.approx(3 * 131_072)


def test_without_samples_the_estimate_is_the_pending_work() -> None:
    drain = PrefillBacklog()
    drain.add_worker("a")
    drain.dispatched("a", 5_000, now=0.0)
    assert drain.rate("a") == 0.0
    assert drain.remaining("a", now=100.0) == 5_000
    assert drain.remaining("unknown", now=1.0) == 0.0


def test_the_rate_is_learned_from_first_tokens_and_drains_the_estimate() -> None:
    drain = PrefillBacklog()
    drain.add_worker("a")
    drain.dispatched("a", 1_000, now=0.0)
    drain.first_token("a", 1_000, now=0.5)  # 1,000 work drained in 0.5 s
    assert drain.rate("a") == pytest.approx(2_000)
    drain.dispatched("a", 4_000, now=1.0)
    assert drain.remaining("a", now=1.0) == pytest.approx(4_000)
    assert drain.remaining("a", now=2.0) == pytest.approx(2_000)
    assert drain.remaining("a", now=10.0) == 0.0  # never below zero
    assert drain.pending("a") == 4_000  # the exact count is kept


def test_a_first_token_resynchronises_with_the_exact_pending_work() -> None:
    drain = PrefillBacklog(alpha=1.0)
    drain.add_worker("a")
    drain.dispatched("a", 1_000, now=0.0)
    drain.dispatched("a", 3_000, now=0.0)
    drain.first_token("a", 1_000, now=1.0)  # 1,000 drained in 1 s; 3,000 still pending, none started
    assert drain.rate("a") == pytest.approx(1_000)
    assert drain.remaining("a", now=1.0) == pytest.approx(3_000)
    assert drain.remaining("a", now=2.5) == pytest.approx(1_500)


def test_workers_without_samples_use_the_fleet_average() -> None:
    drain = PrefillBacklog()
    for name in ("a", "b", "c"):
        drain.add_worker(name)
    drain.dispatched("a", 1_000, now=0.0)
    drain.first_token("a", 1_000, now=1.0)
    drain.dispatched("b", 3_000, now=0.0)
    drain.first_token("b", 3_000, now=1.0)
    assert drain.rate("c") == pytest.approx(2_000)
    drain.remove_worker("b")
    assert drain.rate("c") == pytest.approx(1_000)


def test_first_tokens_of_one_batch_microseconds_apart_do_not_inflate_the_rate() -> None:
    """An engine prefills 4 requests of 1,000 in one 1-second step and sends their first tokens a few
    microseconds apart: the rate is the work over the time, about 4,000/s, never the 10^9 of an interval
    of a microsecond taken alone."""
    drain = PrefillBacklog()
    drain.add_worker("a")
    seen = []
    for batch in range(20):
        start = 2.0 * batch
        for _ in range(4):
            drain.dispatched("a", 1_000, now=start)
        for i in range(4):
            drain.first_token("a", 1_000, now=start + 1.0 + i * 1e-6)
            seen.append(drain.rate("a"))
    assert max(seen) < 10_000
    assert drain.rate("a") == pytest.approx(4_000, rel=0.2)


def test_abandoned_work_is_dropped_without_learning() -> None:
    drain = PrefillBacklog()
    drain.add_worker("a")
    drain.dispatched("a", 2_000, now=0.0)
    drain.abandoned("a", 2_000, now=5.0)
    assert drain.rate("a") == 0.0
    assert drain.pending("a") == 0.0 and drain.remaining("a", now=5.0) == 0.0


def test_the_table_holds_one_entry_per_known_worker() -> None:
    drain = PrefillBacklog()
    drain.dispatched("ghost", 1_000, now=0.0)  # unknown workers are not added
    assert drain.pending("ghost") == 0.0
    drain.add_worker("a")
    drain.remove_worker("a")
    assert drain.pending("a") == 0.0
    with pytest.raises(ValueError):
        PrefillBacklog(alpha=0.0)


@settings(max_examples=100, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(["d", "f", "a"]), st.sampled_from(["w0", "w1", "w2"]), st.floats(1, 5000)),
        max_size=30,
    ),
    st.floats(0, 10),
)
def test_the_one_pass_backlogs_equal_remaining(events: list[tuple[str, str, float]], later: float) -> None:
    """``refresh`` (the per-request pass over the busy workers' live snapshots) says what ``remaining``
    says, of every worker (an unknown one's snapshot stays idle)."""
    drain = PrefillBacklog()
    snaps = [WorkerSnapshot(w) for w in ("w0", "w1", "w2", "unknown")]
    for snap in snaps[:3]:
        drain.add_worker(snap.name, snap)
    now = 0.0
    for kind, worker, work in events:
        now += 0.01
        {"d": drain.dispatched, "f": drain.first_token, "a": drain.abandoned}[kind](worker, work, now)
    drain.refresh(now + later)
    assert [s.prefill_backlog for s in snaps] == [drain.remaining(s.name, now + later) for s in snaps]


DRAINED_THEN_EARLIER = [("d", "w0", 1000, 0.0), ("f", "w0", 1000, 0.5), ("d", "w0", 1000, 0.0)]
DRAINED_THEN_EARLIER += [("r", "w0", 1, 0.5), ("r", "w0", 1, -0.2)]  # 0 at t=1.0, 400 at t=0.8
FLEET_RATE_FALLS = [("d", "w0", 1000, 0.0), ("d", "w2", 1, 0.0), ("f", "w0", 1000, 0.5)]
FLEET_RATE_FALLS += [("d", "w1", 1000, 0.0), ("r", "w0", 1, 0.5)]  # w1 (no rate) at 0 by the fleet's
FLEET_RATE_FALLS += [("f", "w2", 1, 0.0), ("r", "w0", 1, 0.001)]  # w2 learns 1/s: w1 has work left again
FLEET_FALLS_BETWEEN = [("d", "w0", 1000, 0.0), ("f", "w0", 1000, 0.5), ("d", "w1", 1000, 0.0)]
FLEET_FALLS_BETWEEN += [("r", "w0", 1, 0.5), ("d", "w2", 3000, 0.0), ("f", "w2", 3000, 0.5)]  # w1 at 2000/s
FLEET_FALLS_BETWEEN += [("d", "w3", 2000, 0.0), ("d", "w4", 1500, 0.0), ("r", "w0", 1, 0.5)]  # w3 at 4000/s
FLEET_FALLS_BETWEEN += [("f", "w4", 1500, 0.0), ("r", "w0", 1, 0.001)]  # fleet 3667/s: w3 has work again


@settings(max_examples=300, deadline=None)
@example(DRAINED_THEN_EARLIER)
@example(FLEET_RATE_FALLS)
@example(FLEET_FALLS_BETWEEN)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["d", "d", "f", "a", "r", "r", "r"]),
            st.sampled_from(["w0", "w1", "w2"]),
            st.floats(1, 5000),
            st.sampled_from([0.0, 0.001, 0.01, 0.5, 3.0, -0.2]),  # time steps (a few back)
        ),
        max_size=60,
    )
)
def test_backlogs_refreshed_between_events_always_equal_remaining(
    events: list[tuple[str, str, float, float]],
) -> None:
    """Refreshes between the events, as time goes on (and sometimes back): the drained workers that
    ``refresh`` skips still say what ``remaining`` says, until and after their next event."""
    drain = PrefillBacklog(alpha=0.5)
    snaps = [WorkerSnapshot(w) for w in ("w0", "w1", "w2", "w3", "w4")]
    for snap in snaps:
        drain.add_worker(snap.name, snap)
    now = 0.0
    for kind, worker, work, step in events:
        now += step
        if kind == "r":
            drain.refresh(now)
            assert [s.prefill_backlog for s in snaps] == [drain.remaining(s.name, now) for s in snaps]
        else:
            {"d": drain.dispatched, "f": drain.first_token, "a": drain.abandoned}[kind](worker, work, now)
