"""The choice of a worker for one request, whatever carries it: the model it names checked against the
pool (404), the routing core's decision among the eligible workers, noted and counted, and the refusal
when there are none (429 while some worker for the model is only full, else 503). A pass-through call
(no prompt to match: other ``/v1/*`` paths) is routed by ``PASSTHROUGH_POLICY`` with an empty key."""

from __future__ import annotations

from prefix_router.node.request.access import RequestNote
from prefix_router.node.request.errors import ProxyError, overloaded, unavailable
from prefix_router.node.state import NodeState
from prefix_router.pool import Worker
from prefix_router.routing import Decision, RouteRequest

PASSTHROUGH_POLICY = "least_load"  # other /v1/* calls carry no prompt to match


def passthrough_req(state: NodeState) -> RouteRequest:
    """A pass-through call as the routing core sees it: an id, no blocks (nothing to match or index)."""
    return RouteRequest(state.next_id(), (), state.router.index.block_tokens, 0, hash_key=0)


def check_model(state: NodeState, model: str | None, note: RequestNote) -> None:
    """``model`` (None: the request names none) is served by some worker of the pool (404 otherwise);
    noted then (a bounded label)."""
    if model is None:
        return
    if not state.pool.knows_model(model):
        raise ProxyError(404, f"the model {model!r} does not exist", param="model", code="model_not_found")
    note.model = model


def choose(
    state: NodeState,
    req: RouteRequest,
    names: list[str],
    policy: str | None,
    label: str | None,
    note: RequestNote,
) -> tuple[Worker, Decision]:
    """The routing core's choice among ``names`` (the eligible workers, not empty) by ``policy`` (None:
    the configured one), noted (the worker, one attempt more); a routed request (``label``: its policy's
    name, None for a pass-through) is counted by branch and predicted tokens, and recorded in the
    decision feed."""
    if state.before_route is not None:
        state.before_route()  # the other processes' placements, up to now
    decision = state.router.route(req, names, state.clock(), policy)
    note_choice(state, decision, label, note, req)
    return state.pool.require(decision.worker), decision


def note_choice(
    state: NodeState, decision: Decision, label: str | None, note: RequestNote, req: RouteRequest
) -> None:
    """``decision`` noted (the worker, one attempt more) and, for a routed request (``label``), counted by
    branch and predicted tokens and recorded in the decision feed."""
    note.worker, note.attempts = decision.worker, note.attempts + 1
    if label is not None:
        state.metrics.branches.inc((label, decision.branch))
        state.metrics.predicted.observe(decision.predicted_tokens)
        note.branch, note.predicted_tokens = decision.branch, decision.predicted_tokens
        note.predicted_ttft_s = decision.predicted_ttft_s
        note.decision = state.decisions.add(state.clock(), label, decision, req)
    if note.trace is not None:
        note.trace.decided(label or PASSTHROUGH_POLICY, decision)


def nobody(state: NodeState, model: str | None) -> ProxyError:
    """The refusal when no worker is eligible: 429 while a worker serving ``model`` is available but at
    its in-flight cap, 503 when none is available."""
    retry_after = state.config.limits.retry_after_s
    if state.pool.any_available(model):
        return overloaded("every worker for this model is at its in-flight cap", retry_after)
    return unavailable("no healthy worker available", retry_after)
