from __future__ import annotations

from typing import Any

from prefix_router.lab.bench.runner import RunnerSettings, openai_base, request_body, run_workload
from prefix_router.lab.workloads.types import Session, Turn, Workload
from prefix_router.protocol import SESSION_HEADER
from support.engines import FakeEngine


def _cfg(engine: FakeEngine, **kw: Any) -> RunnerSettings:
    return RunnerSettings(base_url=engine.url, model="m", progress=False, **kw)


def _chat_session(sid: str, *contents: str, **kw: Any) -> Session:
    turns = tuple(Turn(max_tokens=3, messages=({"role": "user", "content": c},)) for c in contents)
    return Session(sid, 0.0, turns, **kw)


async def test_runner_measures_stream_usage_and_worker(fake_openai: FakeEngine) -> None:
    system = ({"role": "system", "content": "S" * 400},)
    sessions = tuple(_chat_session(f"s{i}", f"question {i}", preamble=system) for i in range(5))
    result = await run_workload(Workload("t", sessions), _cfg(fake_openai))
    assert len(result.records) == 5 and all(r.ok for r in result.records)
    for r in result.records:
        assert r.ttft_s is not None and 0 < r.ttft_s <= r.e2e_s <= result.wall_s
        assert r.worker == "fake-0" and r.output_tokens == 3 and r.prompt_tokens
    cached = sorted(r.cached_tokens or 0 for r in result.records)
    assert cached[0] == 0 and cached[-1] >= 100
    assert all(
        b["stream"] is True and b["stream_options"] == {"include_usage": True} for b in fake_openai.bodies
    )


async def test_multiturn_history_carries_generated_reply(fake_openai: FakeEngine) -> None:
    preamble = ({"role": "system", "content": "sys"},)
    session = _chat_session("conv", "first", "second", preamble=preamble)
    await run_workload(Workload("t", (session,)), _cfg(fake_openai, session_header=SESSION_HEADER))
    first, second = (b["messages"] for b in fake_openai.bodies)
    assert first == [preamble[0], {"role": "user", "content": "first"}]
    assert second[:2] == first
    assert second[2] == {"role": "assistant", "content": "w0 w1 w2 "}
    assert second[3] == {"role": "user", "content": "second"}
    assert fake_openai.headers[1].get(SESSION_HEADER) == "conv"


async def test_scripted_reply_and_tools(fake_openai: FakeEngine) -> None:
    call = {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}  # fmt: skip
    tools = ({"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}},)
    turns = (
        Turn(max_tokens=2, messages=({"role": "user", "content": "task"},), scripted_reply=call),
        Turn(max_tokens=2, messages=({"role": "tool", "tool_call_id": "c1", "content": "out"},)),
    )
    await run_workload(
        Workload("t", (Session("a", 0.0, turns, tools=tools, tenant="t1"),)), _cfg(fake_openai)
    )
    second = fake_openai.bodies[1]
    assert second["messages"][1] == call and second["messages"][2]["role"] == "tool"
    assert second["tools"] == list(tools)
    sent = {k.lower() for k in fake_openai.headers[0]}
    assert "x-prefix-router-tenant" not in sent and SESSION_HEADER not in sent


async def test_completions_endpoint(fake_openai: FakeEngine) -> None:
    session = Session("c", 0.0, (Turn(max_tokens=4, prompt="hello " * 50),), endpoint="completions")
    result = await run_workload(Workload("t", (session,)), _cfg(fake_openai))
    assert fake_openai.bodies[0]["prompt"] == "hello " * 50 and fake_openai.bodies[0]["max_tokens"] == 4
    assert (
        result.records[0].ok
        and result.records[0].output_tokens == 4
        and result.records[0].endpoint == "completions"
    )


async def test_errors_are_recorded_and_stop_the_session(fake_openai: FakeEngine) -> None:
    sessions = (_chat_session("bad", "FAIL now", "never sent"), _chat_session("good", "fine"))
    result = await run_workload(Workload("t", sessions), _cfg(fake_openai))
    by_session = {r.session_id: r for r in result.records}
    assert len(result.records) == 2
    bad = by_session["bad"]
    assert not bad.ok and bad.status == 500 and bad.error and "boom" in bad.error and bad.ttft_s is None
    assert by_session["good"].ok


async def test_connection_errors_are_recorded() -> None:
    cfg = RunnerSettings(base_url="http://127.0.0.1:9", progress=False, timeout_s=2.0)
    result = await run_workload(Workload("t", (_chat_session("x", "hi"),)), cfg)
    assert not result.records[0].ok and result.records[0].error


async def test_closed_loop_bounds_concurrency(fake_openai: FakeEngine) -> None:
    fake_openai.b.delay_s = 0.02
    sessions = tuple(_chat_session(f"s{i}", "q") for i in range(12))
    result = await run_workload(Workload("t", sessions, concurrency=3), _cfg(fake_openai))
    assert len(result.records) == 12 and fake_openai.max_in_flight == 3


async def test_open_loop_honours_arrival_times(fake_openai: FakeEngine) -> None:
    sessions = tuple(Session(f"s{i}", 0.1 * i, (Turn(max_tokens=1, prompt="p"),), endpoint="completions")
                     for i in range(3))  # fmt: skip
    result = await run_workload(Workload("t", sessions), _cfg(fake_openai))
    starts = sorted(r.start_s for r in result.records)
    assert starts[2] >= 0.2 and starts[1] >= 0.1 and result.wall_s >= 0.2


async def test_duration_stops_new_turns(fake_openai: FakeEngine) -> None:
    sessions = tuple(Session(f"s{i}", 0.15 * i, (Turn(max_tokens=1, prompt="p"),), endpoint="completions")
                     for i in range(10))  # fmt: skip
    result = await run_workload(Workload("t", sessions), _cfg(fake_openai, duration_s=0.2))
    assert 1 <= len(result.records) <= 2


def test_request_body_and_base_url() -> None:
    recorded = Turn(max_tokens=1, body={"model": "", "messages": [], "temperature": 0.5})
    session = Session("s", 0.0, (recorded,), extra_body={"top_p": 0.9})
    assert request_body(session, recorded, [], "m") == {"model": "m", "messages": [], "temperature": 0.5}
    chat = Turn(max_tokens=2, messages=({"role": "user", "content": "x"},))
    body = request_body(session, chat, [{"role": "system", "content": "s"}], "m")
    assert body["top_p"] == 0.9 and len(body["messages"]) == 2 and "tools" not in body
    assert openai_base("http://h:1/") == "http://h:1/v1" and openai_base("http://h:1/v1") == "http://h:1/v1"


def test_stream_state_bounds_reply_and_tool_calls() -> None:
    from types import SimpleNamespace

    from prefix_router.lab.bench import client

    state = client.StreamState(started=0.0)
    for _ in range(3):
        state.add_text("x" * (client.MAX_REPLY_CHARS // 2 + 1))
    assert state.text_chars == client.MAX_REPLY_CHARS == sum(len(t) for t in state.text)
    function = SimpleNamespace(name="f", arguments="{}")
    for i in range(client.MAX_TOOL_CALLS + 10):
        client._absorb_tool_call(SimpleNamespace(index=i, id=f"c{i}", function=function), state)
    assert len(state.tool_calls) == client.MAX_TOOL_CALLS
    reply = client.reply_message(state)
    assert (
        len(reply["tool_calls"]) == client.MAX_TOOL_CALLS and len(reply["content"]) == client.MAX_REPLY_CHARS
    )
