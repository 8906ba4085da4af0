"""The login form's limiter of failed sign-ins: per address, over a window, bounded in addresses."""

from __future__ import annotations

from prefix_router.node.control.dashboard import LOGIN_FAILURES, LOGIN_WINDOW_S, LoginLimiter


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def test_an_address_is_blocked_after_its_failures_until_the_window_ends() -> None:
    clock = Clock()
    limiter = LoginLimiter(clock=clock)
    for _ in range(LOGIN_FAILURES - 1):
        limiter.failed("10.0.0.1")
    assert limiter.retry_after("10.0.0.1") == 0  # one try left
    limiter.failed("10.0.0.1")
    assert limiter.retry_after("10.0.0.1") == LOGIN_WINDOW_S
    assert limiter.retry_after("10.0.0.2") == 0  # another address is not
    clock.t += LOGIN_WINDOW_S - 1
    assert limiter.retry_after("10.0.0.1") == 1
    clock.t += 1
    assert limiter.retry_after("10.0.0.1") == 0 and len(limiter) == 0  # over, and forgotten


def test_a_success_clears_the_count_and_an_old_window_starts_again() -> None:
    clock = Clock()
    limiter = LoginLimiter(failures=2, clock=clock)
    limiter.failed("a")
    limiter.succeeded("a")
    limiter.failed("a")
    assert limiter.retry_after("a") == 0
    clock.t += LOGIN_WINDOW_S  # that failure's window is over: a new one starts with the next
    limiter.failed("a")
    assert limiter.retry_after("a") == 0
    limiter.failed("a")
    assert limiter.retry_after("a") > 0


def test_the_addresses_counted_are_bounded_the_least_recent_going_first() -> None:
    limiter = LoginLimiter(capacity=100, failures=1, clock=Clock())
    for i in range(1000):
        limiter.failed(f"10.1.{i // 250}.{i % 250}")
        assert len(limiter) <= 100
    assert len(limiter) == 100
    assert limiter.retry_after("10.1.3.249") > 0  # the newest are kept
    assert limiter.retry_after("10.1.0.0") == 0  # the oldest went
