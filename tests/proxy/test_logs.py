"""Log lines: ``key=value`` values that cannot forge a field or a line, JSON lines on a switch, and a real
``serve`` process's start-up summary and access lines in both formats."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

from prefix_router.proxy.logs import Fields, JsonFormatter, text_value


@pytest.mark.parametrize(
    "value,shown",
    [
        ("plain-value_1.2:3/x", "plain-value_1.2:3/x"),
        (None, "-"),
        (12.345, "12.3"),
        ("two words", '"two words"'),
        ('a"quote', '"a\\"quote"'),
        ("forged=field", '"forged=field"'),
        ("line\nbreak", '"line\\nbreak"'),
        ("", '""'),
    ],
)
def test_values_stay_in_their_field(value: Any, shown: str) -> None:
    assert text_value(value) == shown


def test_long_values_are_cut() -> None:
    assert len(text_value("x" * 10_000)) < 300


def record(msg: Any, *args: Any) -> logging.LogRecord:
    return logging.LogRecord("prefix_router.access", logging.INFO, __file__, 1, msg, args, None)


def test_json_lines_merge_fields_or_carry_the_message() -> None:
    formatter = JsonFormatter()
    line = orjson.loads(formatter.format(record(Fields({"status": 200, "path": "/v1/x y"}))))
    assert line["status"] == 200 and line["path"] == "/v1/x y" and line["level"] == "info"
    assert line["logger"] == "prefix_router.access" and line["ts"].endswith("Z")
    plain = orjson.loads(formatter.format(record("worker %s ejected", "a\nb")))
    assert plain["message"] == "worker a\nb ejected"
    try:
        raise ValueError("boom")
    except ValueError:
        failed = record("failed")
        failed.exc_info = sys.exc_info()
    text = formatter.format(failed)
    assert "\n" not in text and "ValueError: boom" in orjson.loads(text)["exception"]


async def run_router(engine_url: str, port: int, log: Path, *flags: str, key: str = "none") -> list[str]:
    """A real serve process: one chat request, SIGTERM; returns its stderr lines."""
    argv = ["-m", "prefix_router.proxy", "serve", "--worker", f"a={engine_url}", "--port", str(port), *flags]
    with log.open("wb") as sink:
        proc = await asyncio.create_subprocess_exec(sys.executable, *argv, stderr=sink, env=dict(os.environ))
    url = f"http://127.0.0.1:{port}"
    try:
        async with aiohttp.ClientSession() as http:
            for _ in range(300):
                try:
                    async with http.get(url + "/ready") as ready:
                        if ready.status == 200:
                            break
                except aiohttp.ClientError:
                    await asyncio.sleep(0.05)
            body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
            headers = {"x-request-id": "rid-7", "Authorization": f"Bearer {key}"}
            async with http.post(url + "/v1/chat/completions", json=body, headers=headers) as r:
                assert r.status == 200
    finally:
        proc.send_signal(signal.SIGTERM)
        await asyncio.wait_for(proc.wait(), 20)
    return log.read_text().splitlines()


async def test_a_serve_process_logs_a_summary_and_access_lines(
    fake_engine: Any, free_port: Any, tmp_path: Path
) -> None:
    engine = await fake_engine("a")
    flags = ("--set", "auth.api_keys=k-123456")
    lines = await run_router(engine.url, free_port(), tmp_path / "text.log", *flags, key="k-123456")
    summary = next(line for line in lines if "event=serving" in line)
    for part in ("workers=1", "names=a", "policy=prefix", "auth=on", "api_keys=1", "replication=off"):
        assert part in summary.split(), part
    access = [line.split("prefix_router.access: ", 1)[1] for line in lines if "prefix_router.access:" in line]
    assert len(access) == 1 and access[0].startswith("method=POST path=/v1/chat/completions status=200 ")
    assert access[0].endswith(" request_id=rid-7")
    assert "k-123456" not in "\n".join(lines)


async def test_json_logs_are_one_object_per_line(fake_engine: Any, free_port: Any, tmp_path: Path) -> None:
    engine = await fake_engine("a")
    lines = await run_router(engine.url, free_port(), tmp_path / "json.log", "--set", "log_format=json")
    objects = [orjson.loads(line) for line in lines]  # every line
    summary = next(o for o in objects if o.get("event") == "serving")
    assert summary["workers"] == 1 and summary["policy"] == "prefix" and summary["auth"] == "off"
    access = [o for o in objects if o["logger"] == "prefix_router.access"]
    assert len(access) == 1 and access[0]["request_id"] == "rid-7" and access[0]["status"] == 200
    assert access[0]["worker"] == "a" and access[0]["duration_ms"] > 0
