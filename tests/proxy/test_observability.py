"""/health, /ready, /metrics, and --record's Mooncake trace lines."""

from __future__ import annotations

import asyncio
import math
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from prefix_router.protocol import MATCH_HEADER, POLICY_HEADER, WORKER_HEADER

CHAT = {
    "model": "m",
    "messages": [{"role": "system", "content": "s" * 600}, {"role": "user", "content": "hi"}],
}


async def get(url: str) -> tuple[int, bytes]:
    async with aiohttp.ClientSession() as http:
        resp = await http.get(url)
        return resp.status, await resp.read()


async def test_health_and_ready(fake_engine: Any, start_router: Any, free_port: Any) -> None:
    router = await start_router(await fake_engine("a"))
    assert (await get(router.url + "/health"))[0] == 200
    status, body = await get(router.url + "/ready")
    assert status == 200 and orjson.loads(body)["workers_available"] == 1
    down = await start_router(f"http://127.0.0.1:{free_port()}", settings={"health.fail_threshold": 1})
    assert (await get(down.url + "/health"))[0] == 200  # alive, but not ready
    status, body = await get(down.url + "/ready")
    assert status == 503 and "error" in orjson.loads(body)


async def test_health_and_ready_say_degraded_while_fewer_processes_run_than_configured(
    fake_engine: Any, start_router: Any
) -> None:
    """Under ``serve --processes`` (``NodeState.processes``: running, configured) both answer 200 with the
    counts, and ``degraded`` while a process is missing (before: ``ok`` whatever ran)."""
    router = await start_router(await fake_engine("a"))
    running = [2]
    router.state.processes = lambda: (running[0], 2)
    for path, fine in (("/health", "ok"), ("/ready", "ready")):
        running[0] = 2
        status, body = await get(router.url + path)
        assert status == 200
        assert orjson.loads(body)["status"] == fine
        assert orjson.loads(body)["processes"] == {"running": 2, "configured": 2}
        running[0] = 1
        status, body = await get(router.url + path)
        assert status == 200
        assert orjson.loads(body)["status"] == "degraded"
        assert orjson.loads(body)["processes"] == {"running": 1, "configured": 2}


async def test_metrics_count_requests_branches_and_workers(fake_engine: Any, start_router: Any) -> None:
    engine = await fake_engine("a", cached_tokens=32)
    router = await start_router(engine)
    client = router.openai()
    for _ in range(3):
        await client.chat.completions.create(**CHAT)
    status, body = await get(router.url + "/metrics")
    text = body.decode()
    assert status == 200
    assert 'prefix_router_requests_total{model="m",policy="prefix",status="200",worker="a"} 3.0' in text
    assert 'prefix_router_upstream_attempts_total{status="200",worker="a"} 3.0' in text
    assert "prefix_router_route_branch_total{" in text
    assert 'prefix_router_route_branch_total{branch="load_balance",policy="prefix"} 1.0' in text
    assert 'prefix_router_route_branch_total{branch="prefix_hit",policy="prefix"} 2.0' in text
    assert "prefix_router_ttft_seconds_count 3.0" in text
    assert "prefix_router_request_seconds_count 3.0" in text
    assert "prefix_router_predicted_prefix_tokens_count 3.0" in text
    assert 'prefix_router_in_flight{worker="a"} 0.0' in text
    assert 'prefix_router_worker_healthy{worker="a"} 1.0' in text
    assert 'prefix_router_cached_tokens_total{kind="reported",worker="a"} 96.0' in text
    assert 'prefix_router_cache_reports_total{verdict="unreported",worker="a"} 0.0' in text


async def test_metrics_forget_removed_workers(fake_engine: Any, start_router: Any) -> None:
    a, b = await fake_engine("a"), await fake_engine("b")
    router = await start_router(a, b)
    client = router.openai()
    for _ in range(4):
        await client.chat.completions.create(extra_headers={POLICY_HEADER: "round_robin"}, **CHAT)
    router.state.pool.remove("b")
    router.state.metrics.forget_worker("b")
    text = router.state.metrics.render().decode()
    assert 'worker="b"' not in text and 'worker="a"' in text


async def test_multi_turn_conversations_match_deeper_through_the_proxy(
    fake_engine: Any, start_router: Any
) -> None:
    engines = [await fake_engine(n, reply="a long assistant reply " * 20) for n in ("a", "b", "c")]
    router = await start_router(*engines)
    client = router.openai()
    history: list[Any] = [
        {"role": "system", "content": "You are helpful. " * 40},
        {"role": "user", "content": "q1"},
    ]
    first = await client.chat.completions.with_raw_response.create(model="m", messages=history)
    reply = first.parse().choices[0].message.content
    history += [{"role": "assistant", "content": reply}, {"role": "user", "content": "q2"}]
    for stream in (False, True):
        second = await client.chat.completions.with_raw_response.create(
            model="m", messages=history, stream=stream
        )
        assert second.headers[WORKER_HEADER] == first.headers[WORKER_HEADER]
        # the generated reply was indexed too: the match goes past the first turn's prompt (160 tokens at
        # 4 bytes a token; before the model's first report valued at 8, FIRST_CHARS_PER_TOKEN)
        assert int(second.headers[MATCH_HEADER]) > (160 + 20) // 2
        if stream:
            [c async for c in second.parse()]


async def test_streamed_replies_extend_the_index(fake_engine: Any, start_router: Any) -> None:
    engine = await fake_engine("a", reply="streamed reply text " * 30, chunks=10)
    router = await start_router(engine)
    client = router.openai()
    history: list[Any] = [{"role": "user", "content": "question " * 50}]
    stream = await client.chat.completions.create(model="m", messages=history, stream=True)
    reply = "".join([c.choices[0].delta.content or "" async for c in stream])
    history += [{"role": "assistant", "content": reply}, {"role": "user", "content": "next"}]
    raw = await client.chat.completions.with_raw_response.create(model="m", messages=history)
    # valued at 8 bytes a token before the model's first report (FIRST_CHARS_PER_TOKEN), less 3 blocks
    assert int(raw.headers[MATCH_HEADER]) > (len("question " * 50) + len(reply)) // 8 - 24


async def test_record_writes_mooncake_lines_without_text(
    fake_engine: Any, start_router: Any, tmp_path: Path
) -> None:
    path = tmp_path / "trace.jsonl"
    router = await start_router(await fake_engine("a"), settings={"record.file": str(path), "record.salt": 7})
    client = router.openai()
    for _ in range(2):
        await client.chat.completions.create(**CHAT)
    await client.completions.create(model="m", prompt="p" * 3000)
    recorder = router.state.recorder
    assert recorder is not None
    await recorder.flush()
    lines = [orjson.loads(line) for line in path.read_bytes().splitlines()]
    assert len(lines) == 3
    for line in lines:
        assert set(line) == {"timestamp", "input_length", "output_length", "hash_ids"}
        assert len(line["hash_ids"]) == math.ceil(line["input_length"] / 512)
        assert line["output_length"] == 5  # the engine's usage.completion_tokens
    assert lines[0]["hash_ids"] == lines[1]["hash_ids"]  # same prompt, same ids
    assert lines[2]["input_length"] == 750 and len(lines[2]["hash_ids"]) == 2
    assert b"sss" not in path.read_bytes() and b"ppp" not in path.read_bytes()
    await asyncio.sleep(0)
