"""The decision pipeline (``routing/placement.py``): the steps run in their declared order, each applies
exactly when its precondition holds (its name in the router's trace, its effect on the decision), and the
order is the one the module's docstring and docs/routing.md list."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from prefix_router.events import BlockRemoved, BlockStored
from prefix_router.routing.placement import STEPS
from prefix_router.routing.precise import PreciseTuning, precise_chain, precise_seed
from prefix_router.routing.router import Router
from prefix_router.routing.types import Branch, Decision, RouteRequest
from support.routing import new_router

ROOT = Path(__file__).parents[2]
DOCS = ROOT / "docs" / "routing.md"
SOURCE = ROOT / "src" / "prefix_router" / "routing" / "placement.py"  # a compiled module has no __doc__
BS = 8  # the engines' block size; the index's is 4
PROMPT = list(range(1, 43))  # 5 engine blocks and 2 tokens


def make_router(**kw: object) -> Router:
    settings = {"keys": {"block_tokens": 4, "mode": "events"}, "events": {"block_tokens": BS}, **kw}
    router = new_router(settings, ("a", "b", "c"), seed=3, precise=PreciseTuning(silence_s=5))
    router.pipeline.trace = []
    return router


def request(rid: str, tokens: list[int], session: str | None = None, precise: bool = False) -> RouteRequest:
    blocks = tuple(hash(("approx", tuple(tokens[: (i + 1) * 4]))) for i in range(len(tokens) // 4))
    chain = precise_chain(tokens, BS, precise_seed("m", None, None)) if precise else ()
    return RouteRequest(
        rid,
        blocks,
        4,
        len(tokens),
        hash_key=blocks[0],
        session=session,
        precise_blocks=chain,
        precise_tokens=len(tokens) if precise else 0,
    )


def route(router: Router, req: RouteRequest, candidates: list[str], now: float, **kw: str) -> list[str]:
    """The names of the steps that applied to ``req``'s decision, which is dispatched."""
    trace = router.pipeline.trace
    assert trace is not None
    trace.clear()
    decision = router.route(req, candidates, now, **kw)
    applied = list(trace)
    trace.clear()
    router.dispatched(req, decision, now)
    return applied


def stored(tokens: list[int], base: int) -> BlockStored:
    full = len(tokens) - len(tokens) % BS
    return BlockStored(tuple(base + i for i in range(full // BS)), None, tuple(tokens[:full]), BS)


def test_the_steps_are_listed_in_their_order_in_the_module_and_the_docs() -> None:
    names = [step.name for step in STEPS]
    assert names == [
        "match", "steer", "load", "stick", "home", "estimate", "select", "confirmed", "value", "round"
    ]  # fmt: skip
    assert len(set(names)) == len(names)
    doc = ast.get_docstring(ast.parse(SOURCE.read_text())) or ""
    assert re.findall(r"^\d+\. ``(\w+)``", doc, re.MULTILINE) == names
    section = DOCS.read_text().split("## How a request is placed", 1)[1].split("\n## ", 1)[0]
    assert re.findall(r"^\d+\. `(\w+)`", section, re.MULTILINE) == names


def test_a_request_without_session_or_events_is_placed_by_the_policy() -> None:
    router = make_router()
    assert route(router, request("r", PROMPT), ["a", "b", "c"], 1.0) == [
        "match", "load", "estimate", "select", "value"
    ]  # fmt: skip


def test_a_session_sticks_where_the_policy_honours_it_and_the_cap_allows() -> None:
    router = make_router()
    route(router, request("r1", PROMPT, session="s"), ["a", "b", "c"], 1.0)
    other = [99, *PROMPT]
    assert route(router, request("r2", other, session="s"), ["a", "b", "c"], 1.0) == [
        "match", "load", "stick", "estimate", "value"
    ]  # fmt: skip
    # a baseline policy does not honour sessions: the policy decides
    assert route(router, request("r3", other, session="s"), ["a", "b", "c"], 1.0, policy="random") == [
        "match", "load", "estimate", "select", "value"
    ]  # fmt: skip
    off = make_router(sessions={"affinity": False})
    route(off, request("r1", PROMPT, session="s"), ["a", "b", "c"], 1.0)
    assert "stick" not in route(off, request("r2", other, session="s"), ["a", "b", "c"], 1.0)


def test_the_prediction_is_rounded_once_the_engine_block_is_known() -> None:
    router = make_router()
    route(router, request("r1", PROMPT), ["a"], 1.0)
    decision = router.route(request("r2", PROMPT), ["a"], 2.0)
    assert decision.predicted_tokens == 40 and router.pipeline.trace == [  # 10 index blocks of 4
        "match", "load", "estimate", "select", "value"
    ]  # fmt: skip
    router.set_engine_block("a", 16)
    assert route(router, request("r3", PROMPT), ["a"], 3.0)[-2:] == ["value", "round"]
    assert router.route(request("r4", PROMPT), ["a"], 4.0).predicted_tokens == 32  # whole blocks of 16


def test_an_event_fed_worker_is_steered_to_and_predicted_on_its_confirmed_blocks() -> None:
    router = make_router()
    router.add_event_worker("a", "m")
    router.precise.apply("a", [stored(PROMPT[:24], 10)], 0.0)  # a's engine holds 3 of the 5 blocks
    decision = router.route(request("r", PROMPT, precise=True), ["a", "b"], 1.0)
    assert router.pipeline.trace == ["match", "steer", "load", "estimate", "select", "confirmed"]
    assert decision.worker == "a" and decision.predicted_tokens == 24 and decision.matched_blocks == 6
    assert decision.expected_cached_tokens == 24 and decision.estimated_prompt_tokens == 42
    # a worker publishing no events: its decision is valued from the index
    assert route(router, request("r2", PROMPT, precise=True), ["b"], 1.0)[-1] == "value"


def evicted_from_a() -> Router:
    """PROMPT was served by a and stored there, then a's engine evicted all of it."""
    router = make_router()
    router.add_event_worker("a", "m")
    router.add_event_worker("b", "m")
    route(router, request("first", PROMPT, precise=True), ["a"], 1.0)
    router.precise.apply("a", [stored(PROMPT, 10)], 1.2)
    router.precise.apply("a", [BlockRemoved(tuple(range(10, 15)))], 1.3)
    return router


def test_a_prefix_evicted_everywhere_goes_home_before_the_policy() -> None:
    router = evicted_from_a()
    decision = router.route(request("again", PROMPT, precise=True), ["a", "b"], 2.0)
    assert router.pipeline.trace == ["match", "steer", "load", "home", "estimate", "confirmed"]
    assert (decision.worker, decision.branch, decision.predicted_tokens) == ("a", Branch.HOME, 0)
    # under a policy that does not honour sessions, no home: the policy decides
    router = evicted_from_a()
    trace = route(router, request("again", PROMPT, precise=True), ["a", "b"], 2.0, policy="least_load")
    assert trace == ["match", "steer", "load", "estimate", "select", "confirmed"]


def test_a_session_sticks_before_a_home_is_looked_for() -> None:
    router = evicted_from_a()
    route(router, request("elsewhere", [500 + t for t in PROMPT], session="s", precise=True), ["b"], 1.5)
    decision = router.route(request("again", PROMPT, session="s", precise=True), ["a", "b"], 2.0)
    assert router.pipeline.trace == ["match", "steer", "load", "stick", "estimate", "confirmed"]
    assert (decision.worker, decision.branch) == ("b", Branch.SESSION)


def test_the_decision_is_the_chosen_worker_with_the_prediction() -> None:
    router = make_router()
    route(router, request("r1", PROMPT), ["a"], 1.0)
    decision = router.route(request("r2", PROMPT), ["a"], 2.0)
    assert decision == Decision("a", Branch.PREFIX_HIT, 10, 40, 42)


def test_no_trace_is_kept_by_default() -> None:
    router = make_router()
    router.pipeline.trace = None
    router.route(request("r", PROMPT), ["a"], 1.0)
    assert router.pipeline.trace is None
