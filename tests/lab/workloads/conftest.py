"""Small trace fixtures written to a temporary folder (the real traces are used only when present)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest


@pytest.fixture
def sharegpt_file(tmp_path: Path) -> Path:
    path = tmp_path / "sharegpt.jsonl"
    rows = []
    for c in range(6):
        conv = [{"from": "gpt", "value": "Hi, how can I help?"}] if c == 0 else []
        for t in range(3 + c % 2):
            conv.append({"from": "human", "value": f"conv {c} question {t} " + "x" * (50 + 400 * (t == 1))})
            conv.append({"from": "gpt", "value": "answer " * (20 + 10 * t)})
        rows.append({"id": f"c{c}", "conversations": conv})
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return path


@pytest.fixture
def mooncake_file(tmp_path: Path) -> Path:
    path = tmp_path / "mooncake.jsonl"
    rows = [
        {"timestamp": 0, "input_length": 1500, "output_length": 100, "hash_ids": [0, 1, 2]},
        {"timestamp": 0, "input_length": 1200, "output_length": 200, "hash_ids": [0, 1, 3]},
        {"timestamp": 3000, "input_length": 700, "output_length": 50, "hash_ids": [0, 4]},
        {"timestamp": 6000, "input_length": 2048, "output_length": 10, "hash_ids": [5, 6, 7, 8]},
    ]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return path
