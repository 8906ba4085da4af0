"""Log lines: ``key=value`` values that cannot forge a field or a line, JSON lines on a switch, and a real
``serve`` process's start-up summary and access lines in both formats."""

from __future__ import annotations

import asyncio
import contextlib
import io
import logging
import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from prefix_router.node.request import access
from prefix_router.node.request.access import AccessLine
from prefix_router.node.telemetry import logs
from prefix_router.node.telemetry.logs import (
    ACCESS_LOGGER,
    BATCH_BYTES,
    Fields,
    JsonFormatter,
    LineHandler,
    text_value,
)


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


def record(msg: Any, *args: Any, created: float | None = None) -> logging.LogRecord:
    made = logging.LogRecord("prefix_router.access", logging.INFO, __file__, 1, msg, args, None)
    if created is not None:
        made.created, made.msecs = created, int((created - int(created)) * 1000) + 0.0
    return made


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


@contextlib.contextmanager
def alone() -> Iterator[LineHandler]:
    """A ``LineHandler`` on a string as the root logger's only handler (pytest's own, added when a test
    runs, put back after)."""
    root = logging.getLogger()
    saved = root.handlers[:]
    handler = LineHandler(io.StringIO())
    root.handlers[:] = [handler]
    try:
        yield handler
    finally:
        root.handlers[:] = saved


@pytest.mark.parametrize("log_format", ["text", "json"])
def test_a_direct_line_is_the_line_the_formatter_writes(log_format: Any) -> None:
    with alone() as handler:
        check_direct_lines(handler, log_format)


def check_direct_lines(only_handler: Any, log_format: Any) -> None:
    only_handler.set_format(log_format)
    fields = AccessLine({"method": "POST", "path": "/v1/x y", "status": 200, "model": "m", "worker": "a",
                         "policy": "prefix", "branch": None, "predicted_tokens": 3, "predicted_ttft_ms": 2.5,
                         "ttft_ms": None, "duration_ms": 1.25, "attempts": 1,
                         "request_id": "r-1"})  # fmt: skip
    access = logging.getLogger(ACCESS_LOGGER)
    assert only_handler.direct(access) is only_handler
    for created in (1_700_000_000.0, 1_700_000_000.999, 1_700_000_001.5):
        formatted = only_handler.format(record(fields, created=created))
        only_handler.write_info(ACCESS_LOGGER, fields, created)  # no running loop: written at once
        if log_format == "text":  # the same line again, from its text
            only_handler.write_text(ACCESS_LOGGER, str(fields), created)
        assert only_handler.stream.getvalue() == (formatted + "\n") * (2 if log_format == "text" else 1)
        only_handler.stream.seek(0)
        only_handler.stream.truncate()


async def test_direct_lines_wait_for_the_loop_iteration_and_keep_their_order() -> None:
    with alone() as handler:
        await check_order(handler)


async def check_order(only_handler: Any) -> None:
    access, other = logging.getLogger(ACCESS_LOGGER), logging.getLogger("prefix_router.test")
    levels = access.level, other.level
    access.setLevel(logging.INFO)
    other.setLevel(logging.INFO)
    try:
        await log_three(only_handler, other)
    finally:
        access.setLevel(levels[0])
        other.setLevel(levels[1])


async def log_three(only_handler: Any, other: logging.Logger) -> None:
    only_handler.write_info(ACCESS_LOGGER, Fields({"n": 1}))
    only_handler.write_info(ACCESS_LOGGER, Fields({"n": 2}))
    assert only_handler.stream.getvalue() == ""  # pending until the loop's iteration ends
    other.info("between")  # a record logged the usual way writes what is pending first
    only_handler.write_info(ACCESS_LOGGER, Fields({"n": 3}))
    await asyncio.sleep(0)
    lines = only_handler.stream.getvalue().splitlines()
    assert [line.split(": ", 1)[1] for line in lines] == ["n=1", "n=2", "between", "n=3"]


def test_lines_go_through_logging_when_anything_else_listens() -> None:
    with alone() as handler:
        check_fallback(handler)


def check_fallback(only_handler: Any) -> None:
    access = logging.getLogger(ACCESS_LOGGER)
    assert only_handler.direct(access) is only_handler
    extra = logging.NullHandler()
    for where in (logging.getLogger("prefix_router"), access, logging.getLogger()):
        where.addHandler(extra)
        try:
            assert only_handler.direct(access) is None
        finally:
            where.removeHandler(extra)
    access.addFilter(lambda r: True)
    try:
        assert only_handler.direct(access) is None
    finally:
        access.filters.clear()
    assert only_handler.direct(access) is only_handler


class Writes(io.StringIO):
    """A stream that remembers each write."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: list[str] = []

    def write(self, text: str) -> int:
        self.writes.append(text)
        return super().write(text)


async def test_direct_lines_go_out_in_writes_no_longer_than_a_pipe_keeps_whole() -> None:
    with alone() as handler:
        handler.stream = Writes()
        lines = [f"n={i} {'x' * 300}" for i in range(40)] + ["word=" + "é" * 200]
        for line in lines:
            handler.write_info(ACCESS_LOGGER, Fields({"line": line}))
        await asyncio.sleep(0)
        writes = handler.stream.writes
    assert len(writes) > 1 and all(len(w.encode()) <= BATCH_BYTES for w in writes)
    assert all(w.endswith("\n") for w in writes)  # whole lines only
    written = "".join(writes).splitlines()
    assert [w.split(": ", 1)[1] for w in written] == [str(Fields({"line": line})) for line in lines]


async def test_flush_writes_held_lines_at_once() -> None:
    with alone() as handler:
        handler.write_info(ACCESS_LOGGER, Fields({"n": 1}))
        assert handler.stream.getvalue() == ""  # held until the loop's iteration ends
        logs.flush()  # what a serving process does before it exits (a forked one skips logging.shutdown)
        assert handler.stream.getvalue().endswith(": n=1\n")


def test_the_access_lines_remembered_texts_are_text_value_and_bounded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(access, "_shown", {})
    values = ["/v1/chat/completions", "two words", 'a"quote', "x" * 300, None, 7, 1.25, "m\nx"]
    for value in values * 2:  # the second time from memory
        assert access.shown(value) == text_value(value)
    for n in range(access.SHOWN_MAX + 50):
        assert access.shown(f"/v1/p{n}") == f"/v1/p{n}"
    assert len(access._shown) == access.SHOWN_MAX
    assert all(len(text) <= access.SHOWN_MAX_CHARS for text in access._shown)


TEXTS = st.one_of(
    st.sampled_from(["/v1/chat/completions", "m", "none", "a b", 'q"', "x" * 300]), st.text(max_size=20)
)


@given(
    st.tuples(TEXTS, TEXTS, TEXTS),
    st.sampled_from(["prefix", "none", "least_load"]),
    st.one_of(st.none(), st.sampled_from(["prefix_hit", "load_balance"])),
    st.one_of(st.none(), st.integers(0, 10**6)),
    st.one_of(st.none(), st.floats(0, 100, allow_nan=False)),
    st.floats(0, 1000, allow_nan=False),
    st.integers(100, 599),
    st.integers(0, 5),
    st.one_of(st.none(), st.floats(0, 100, allow_nan=False)),
)
def test_a_notes_line_is_its_access_lines_text(
    texts: tuple[str, str, str], policy: str, branch: str | None, predicted: int | None,
    ttft_s: float | None, elapsed: float, status: int, attempts: int, predicted_ttft_s: float | None,
) -> None:  # fmt: skip
    path, model, worker = texts
    note = access.RequestNote("r-1", "POST", path, 10.0)
    note.model, note.worker, note.policy, note.branch = model, worker, policy, branch
    note.predicted_tokens, note.ttft_s, note.attempts = predicted, ttft_s, attempts
    note.predicted_ttft_s = predicted_ttft_s
    assert note.line(status, 10.0 + elapsed) == str(AccessLine(note.fields(status, 10.0 + elapsed)))
    assert list(note.fields(status, 0.0)) == list(access.FIELDS)
