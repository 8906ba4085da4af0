from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from prefix_router.lab.sim.profiles import builtin_profiles, get_profile
from prefix_router.lab.sim.timing import (
    decode_coefficients,
    decode_span_time,
    prefill_pairs,
    step_time,
    steps_reaching,
    steps_within,
)


def brute_span(first: float, growth: float, steps: int) -> float:
    return sum(first + growth * k for k in range(steps))


@given(st.floats(1e-4, 0.1), st.floats(0.0, 1e-3), st.integers(1, 400))
def test_span_time_is_the_sum_of_growing_steps(first: float, growth: float, steps: int) -> None:
    assert (
        abs(decode_span_time(first, growth, steps) - brute_span(first, growth, steps))
        < 1e-9 * steps**2 + 1e-9
    )


@given(st.floats(1e-4, 0.1), st.floats(0.0, 1e-3), st.floats(0.0, 50.0))
def test_steps_reaching_is_the_first_boundary_at_or_after(
    first: float, growth: float, elapsed: float
) -> None:
    k = steps_reaching(first, growth, elapsed)
    assert k >= 1
    assert decode_span_time(first, growth, k) >= elapsed
    if k > 1:
        assert decode_span_time(first, growth, k - 1) < elapsed
    within = steps_within(first, growth, elapsed)
    assert within == 1 or decode_span_time(first, growth, within) <= elapsed


def test_prefill_time_grows_with_uncached_tokens_and_quadratically() -> None:
    p = get_profile("llama-3.1-8b-h100")
    times = [step_time(p, n, prefill_pairs(0, n), 1, 0, 0) for n in (1024, 2048, 4096, 8192)]
    assert times == sorted(times) and len(set(times)) == 4
    # attention makes later chunks of a long prompt dearer than its first chunk
    assert step_time(p, 8192, prefill_pairs(64_000, 8192), 1, 0, 0) > times[-1]


def test_decode_step_grows_with_batch_and_context() -> None:
    p = get_profile("llama-3.1-8b-h100")
    small, growth = decode_coefficients(p, 8, 8 * 1000)
    assert decode_coefficients(p, 64, 8 * 1000)[0] > small
    assert decode_coefficients(p, 8, 8 * 30_000)[0] > small
    assert growth > 0


def test_profiles_are_consistent() -> None:
    profiles = builtin_profiles()
    assert {"llama-3.1-8b-h100", "llama-3.1-70b-8xh100", "cpu-demo"} <= set(profiles)
    small, large = profiles["llama-3.1-8b-h100"], profiles["llama-3.1-70b-8xh100"]
    assert large.token_compute_s > small.token_compute_s
    assert large.kv_capacity_tokens > 0 and small.kv_capacity_tokens > 0
    one_token_8b = step_time(small, 0, 0, 0, 1, 1000)
    one_token_70b = step_time(large, 0, 0, 0, 1, 1000)
    assert one_token_70b > one_token_8b


def test_unknown_profile_names_the_choices() -> None:
    try:
        get_profile("nope")
    except KeyError as exc:
        assert "cpu-demo" in str(exc)
    else:
        raise AssertionError("expected KeyError")
