"""The phases of one ext_proc stream and the deadline of each, with ``serve``'s timeouts
(``timeouts.*``) in the same meaning:

- ``HEADERS``: the request's headers, within ``client_header_s`` of the stream opening;
- ``BODY``: the rest of the request (its body, its trailers), within ``client_body_s`` of its headers;
- ``WAITING``: the response's first message (its headers, or its first body message), within
  ``first_byte_s`` of the decision;
- ``RESPONSE``: each next message within ``stream_idle_s`` of the previous one, the whole response within
  ``total_s`` of the decision;
- ``DONE``: answered (an immediate response, or the response settled); the gateway ends the stream
  within ``stream_idle_s``.

A deadline passed in ``HEADERS`` or ``BODY`` is answered 408 (503 ``shutting_down`` when the drain cut
it); in ``WAITING`` or ``RESPONSE`` the request's flight ends as a timeout (its in-flight slot freed) and
the stream is ended with ``DEADLINE_EXCEEDED``.
"""

from __future__ import annotations

import enum

from prefix_router.node import Config


class Phase(enum.Enum):
    HEADERS = "headers"
    BODY = "body"
    WAITING = "waiting"
    RESPONSE = "response"
    DONE = "done"


# why the picker ended or refused a stream: the ``reason`` label of ``prefix_router_epp_streams_cut_total``
CUT_REASONS = ("header_timeout", "body_timeout", "response_timeout", "body_budget", "stream_cap")


class StreamClock:
    """When each phase of one stream began (loop time), and so its deadline now."""

    __slots__ = ("begun", "decided", "last", "phase")

    def __init__(self, now: float) -> None:
        self.phase = Phase.HEADERS
        self.begun = now  # the current phase's start
        self.decided = now  # the decision (the start of WAITING)
        self.last = now  # the last message received

    def moved(self, phase: Phase, now: float) -> None:
        """A message was received at ``now`` and the stream is in ``phase`` after it."""
        self.last = now
        if phase is self.phase:
            return
        if phase is Phase.WAITING:
            self.decided = now
        self.phase, self.begun = phase, now

    def deadline(self, config: Config) -> float:
        timeouts, phase = config.timeouts, self.phase
        if phase is Phase.HEADERS:
            return self.begun + timeouts.client_header_s
        if phase is Phase.BODY:
            return self.begun + timeouts.client_body_s
        if phase is Phase.WAITING:
            return self.decided + min(timeouts.first_byte_s, timeouts.total_s)
        if phase is Phase.RESPONSE:
            return min(self.decided + timeouts.total_s, self.last + timeouts.stream_idle_s)
        return self.last + timeouts.stream_idle_s

    def timeout_s(self, config: Config) -> float:
        """The limit of the current request phase, for its 408 message."""
        timeouts = config.timeouts
        return timeouts.client_header_s if self.phase is Phase.HEADERS else timeouts.client_body_s
