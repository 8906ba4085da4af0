from __future__ import annotations

import random
from pathlib import Path

import pytest

from prefix_router.lab.sim.trace import TraceError, TraceRow, arrival_times, read_trace, tile


def write(tmp_path: Path, lines: list[str]) -> Path:
    path = tmp_path / "trace.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_reads_mooncake_rows(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        [
            '{"timestamp": 3000, "input_length": 600, "output_length": 5, "hash_ids": [0, 2]}',
            '{"timestamp": 0, "input_length": 100, "output_length": 1, "hash_ids": [0]}',
        ],
    )
    rows = read_trace(path)
    assert [r.timestamp_ms for r in rows] == [0.0, 3000.0]
    assert rows[1].hash_ids == (0, 2)
    assert len(read_trace(path, limit=1)) == 1


def test_bad_lines_name_their_line_number(tmp_path: Path) -> None:
    path = write(tmp_path, ['{"timestamp": 0, "input_length": 1, "output_length": 1, "hash_ids": []}', "{}"])
    with pytest.raises(TraceError, match="line 2"):
        read_trace(path)


def rows_at(stamps: list[float]) -> list[TraceRow]:
    return [TraceRow(ts, 100, 10, (i,)) for i, ts in enumerate(stamps)]


def test_bucketed_requests_are_spread_over_their_bucket() -> None:
    rows = rows_at([0, 0, 0, 0, 3000, 3000, 6000])
    times = arrival_times(rows, random.Random(1))
    assert times == sorted(times)
    assert all(0.0 <= t < 3.0 for t in times[:4]) and len(set(times[:4])) == 4
    assert all(3.0 <= t < 6.0 for t in times[4:6])
    assert times[6] == 6.0
    assert arrival_times(rows, random.Random(1)) == times


def test_rate_scale_compresses_time() -> None:
    rows = rows_at([0, 1000, 2000])
    assert arrival_times(rows, random.Random(0), rate_scale=2.0) == [0.0, 0.5, 1.0]


def test_tiles_share_nothing_across_copies() -> None:
    rows = [TraceRow(0, 1024, 1, (0, 1)), TraceRow(10, 1024, 1, (0, 2))]
    tiled = tile(rows, 3)
    assert len(tiled) == 6
    firsts = {r.hash_ids[0] for r in tiled}
    assert len(firsts) == 3


def test_recorded_traces_with_64_bit_ids_replay(tmp_path: Path) -> None:
    from prefix_router.lab.sim.requests import trace_request

    big = 2**64 - 5
    path = write(
        tmp_path,
        [f'{{"timestamp": 0, "input_length": 1100, "output_length": 3, "hash_ids": [{big}, 7, 7]}}'],
    )
    row = read_trace(path)[0]
    assert row.hash_ids == (big, 7)  # a repeated trailing id (partial block) is dropped
    req = trace_request(row, 0, 0.0)
    assert len(req.route.blocks) == 2 and req.route.block_tokens == 512
    assert req.engine.prompt_tokens == 1100
