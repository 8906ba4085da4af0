"""Admission: what a request must pass before its body is read, whatever carries it: the node is not
stopping (503 ``shutting_down``), the client's key is valid (401), the node is under its in-flight cap
(429), and the routing policy it names, if any, is one the router has (400)."""

from __future__ import annotations

from collections.abc import Mapping

from prefix_router.node.request.auth import check_client
from prefix_router.node.request.errors import bad_request, overloaded, shutting_down
from prefix_router.node.state import NodeState
from prefix_router.protocol import POLICY_HEADER


def admit(state: NodeState, headers: Mapping[str, str]) -> None:
    """Shutdown, the client key (``headers``: the client's) and the global in-flight cap."""
    if state.deadlines.stopping:
        raise shutting_down(state.config.limits.retry_after_s)
    check_client(state.client_credentials, headers)
    if state.pool.total_in_flight() >= state.request_config.max_in_flight:
        raise overloaded("the router is at its in-flight cap", state.config.limits.retry_after_s)


def policy_override(state: NodeState, headers: Mapping[str, str]) -> str | None:
    """The routing policy the client names (``POLICY_HEADER``), None when it names none."""
    name = headers.get(POLICY_HEADER)
    if name is None:
        return None
    if name not in state.policies:
        choices = ", ".join(sorted(state.policies))
        raise bad_request(f"unknown routing policy {name[:64]!r} (one of {choices})", param=POLICY_HEADER)
    return name
