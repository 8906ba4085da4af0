"""The trace recorder: Mooncake shape, salted ids, bounded buffer and file size."""

from __future__ import annotations

import math
from pathlib import Path

import orjson

from prefix_router.node.settings import RecordSettings
from prefix_router.node.telemetry.record import TraceRecorder
from prefix_router.routing.keys import KeyBuilder
from prefix_router.routing.settings import KeySettings
from prefix_router.routing.types import RouteRequest


def route(blocks: int, tokens: int, salt: int = 0) -> RouteRequest:
    return RouteRequest("r", tuple(range(salt + 1, salt + blocks + 1)), 16, tokens, hash_key=99)


def make(tmp_path: Path, drops: list[int], **kw: object) -> TraceRecorder:
    cfg = RecordSettings(file=str(tmp_path / "t.jsonl"), salt=1, **kw)  # type: ignore[arg-type]
    return TraceRecorder(cfg, clock=lambda: 0.0, on_drop=lambda: drops.append(1))


def test_hash_ids_follow_mooncake_blocks(tmp_path: Path) -> None:
    rec = make(tmp_path, [])
    ids = rec.hash_ids(route(blocks=70, tokens=1130))  # 1130 tokens -> 3 ids of 512 tokens
    assert len(ids) == math.ceil(1130 / 512) == 3
    assert len(set(ids)) == 3 and all(0 <= i < 2**63 for i in ids)
    assert rec.hash_ids(route(blocks=70, tokens=1130)) == ids  # deterministic for one salt
    assert rec.hash_ids(route(blocks=40, tokens=640))[0] == ids[0]  # shared prefix, shared first id
    assert rec.hash_ids(route(blocks=70, tokens=1130, salt=1000))[0] != ids[0]
    assert len(rec.hash_ids(route(blocks=0, tokens=5))) == 1  # named by the namespace


def test_salt_changes_ids(tmp_path: Path) -> None:
    a = make(tmp_path, [])
    b = TraceRecorder(RecordSettings(file=str(tmp_path / "u"), salt=2), lambda: 0.0, lambda: None)
    assert a.hash_ids(route(10, 160)) != b.hash_ids(route(10, 160))


async def test_buffer_and_file_are_bounded(tmp_path: Path) -> None:
    drops: list[int] = []
    rec = make(tmp_path, drops, queue_size=3)
    accepted = [rec.record(route(4, 64), 1) for _ in range(5)]
    assert accepted == [True, True, True, False, False] and len(drops) == 2
    await rec.flush()
    assert len((tmp_path / "t.jsonl").read_bytes().splitlines()) == 3

    small = make(tmp_path, drops, max_bytes=200)  # the file already holds more: nothing more is written
    assert not small.record(route(4, 64), 1)
    await small.flush()
    lines = (tmp_path / "t.jsonl").read_bytes().splitlines()
    assert len(lines) == 3 and all(
        set(orjson.loads(x)) == {"timestamp", "input_length", "output_length", "hash_ids"} for x in lines
    )


async def test_a_line_holds_lengths_time_and_ids_but_no_text(tmp_path: Path) -> None:
    now = [0.0]
    cfg = RecordSettings(file=str(tmp_path / "t.jsonl"), salt=1)
    rec = TraceRecorder(cfg, clock=lambda: now[0], on_drop=lambda: None)
    req = KeyBuilder(KeySettings(block_tokens=16)).build(
        "completions", {"model": "m", "prompt": "secret " * 400}, route_id="1"
    )
    now[0] = 1.0
    assert rec.record(req, 7)
    await rec.flush()
    raw = (tmp_path / "t.jsonl").read_bytes()
    line = orjson.loads(raw)
    assert line["input_length"] == req.key_tokens and line["output_length"] == 7
    assert line["timestamp"] == 1000 and line["hash_ids"] == rec.hash_ids(req)
    assert b"secret" not in raw and all(isinstance(i, int) for i in line["hash_ids"])
