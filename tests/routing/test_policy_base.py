"""``load_totals`` is an inline copy of the sums of ``load_cap`` and of the ``prefix`` policy's saturation
(one pass instead of three): it must give the very same numbers, floats included, so the same decisions."""

from __future__ import annotations

from collections.abc import Callable

from hypothesis import example, given
from hypothesis import strategies as st

from prefix_router.routing.policies.base import cap_of, load_cap, load_totals
from prefix_router.routing.policies.prefix import PrefixPolicy, PrefixSettings
from prefix_router.routing.types import WorkerSnapshot

LOADS = st.lists(
    st.tuples(
        st.floats(min_value=0.0, max_value=1e3, allow_nan=False),
        st.integers(min_value=0, max_value=10_000),
        st.floats(min_value=0.0, max_value=1e17, allow_nan=False),
    ),
    max_size=40,
)


def snapshots(loads: list[tuple[float, int, float]]) -> list[WorkerSnapshot]:
    return [
        WorkerSnapshot(f"w{i}", weight=weight, in_flight=flight, prefill_backlog=backlog)
        for i, (weight, flight, backlog) in enumerate(loads)
    ]


@given(loads=LOADS, request_work=st.floats(min_value=0.0, max_value=1e6, allow_nan=False))
@example(loads=[(0.1, 1, 1e16), (0.2, 2, 1.0), (0.3, 3, 1.0)], request_work=1.0)  # order matters here
@example(loads=[], request_work=1.0)
@example(loads=[(0.0, 0, 0.0)], request_work=0.0)
def test_the_one_pass_totals_are_the_sums_of_load_cap_and_saturation(
    loads: list[tuple[float, int, float]], request_work: float
) -> None:
    workers = snapshots(loads)
    weight, flight, backlog = load_totals(workers)
    assert weight == sum(s.weight for s in workers)
    assert flight == sum(s.in_flight for s in workers)
    assert backlog == sum(s.prefill_backlog for s in workers)
    policy = PrefixPolicy(PrefixSettings())
    for factor, slack in ((1.25, 2), (1.0, 0)):
        inline = outcome(lambda f=factor, s=slack: cap_of(weight, flight, f, s))  # type: ignore[misc]
        assert inline == outcome(lambda f=factor, s=slack: load_cap(workers, f, s))  # type: ignore[misc]
    inline = outcome(lambda: policy.saturation_of(backlog, len(workers), request_work))
    assert inline == outcome(lambda: policy.saturation(workers, request_work))


def outcome(fn: Callable[[], float]) -> str:
    """``fn()`` exactly (``repr``: NaN too), or the name of what it raised: extreme inputs (a queue of 1e16
    typical requests, weights of 1e-308) overflow in both alike."""
    try:
        return repr(fn())
    except ArithmeticError as exc:
        return type(exc).__name__
