"""Revoked dashboard sessions: kept until they expire, bounded, and told of once (``on_revoke``)."""

from __future__ import annotations

from prefix_router.node.request.auth import RevokedSessions


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def test_a_session_is_revoked_until_it_expires_and_others_are_told_once() -> None:
    clock, told = Clock(), []
    revoked = RevokedSessions(clock=clock)
    revoked.on_revoke = lambda sid, expiry: told.append((sid, expiry))
    revoked.revoke("a", 2000)
    revoked.apply("b", 2000)  # from another process: not told again
    revoked.revoke("gone", 999)  # already expired: nothing to keep
    assert "a" in revoked and "b" in revoked and "gone" not in revoked
    assert told == [("a", 2000)]
    revoked.revoke("a", 2000)  # again: nothing new to tell
    assert len(told) == 1
    assert sorted(revoked.items()) == [("a", 2000), ("b", 2000)]


def test_the_set_is_bounded_the_expired_going_first_then_the_soonest_to_expire() -> None:
    clock = Clock()
    revoked = RevokedSessions(capacity=50, clock=clock)
    for i in range(50):
        revoked.revoke(f"s{i}", 1001 + i)
    clock.t = 1010.5  # s0..s9 have expired
    revoked.revoke("new", 5000)
    assert len(revoked) == 41 and "new" in revoked and "s9" not in revoked and "s10" in revoked
    for i in range(500):
        revoked.revoke(f"late{i}", 3000 + i)
        assert len(revoked) <= 50
    assert len(revoked) == 50
    assert "new" in revoked and "late499" in revoked  # those expiring last stay
    assert "s49" not in revoked  # the soonest to expire went
