from __future__ import annotations

from prefix_router.routing.keys import build_request
from prefix_router.routing.record import record_line
from prefix_router.routing.settings import KeySettings

CFG = KeySettings(block_chars=64, block_tokens=16)


def test_records_share_leading_ids_exactly_when_prefixes_are_shared() -> None:
    system = {"role": "system", "content": "s" * 6000}
    a = build_request(
        "chat",
        {"model": "m", "messages": [system, {"role": "user", "content": "a" * 900}]},
        CFG,
        request_id="1",
    )
    b = build_request(
        "chat",
        {"model": "m", "messages": [system, {"role": "user", "content": "b" * 900}]},
        CFG,
        request_id="2",
    )
    ra, rb = record_line(a, 7, 1000), record_line(b, 9, 2000)
    assert ra["input_length"] == a.prompt_tokens and ra["output_length"] == 7 and ra["timestamp"] == 1000
    ids_a, ids_b = ra["hash_ids"], rb["hash_ids"]
    assert isinstance(ids_a, list) and isinstance(ids_b, list)
    assert len(ids_a) == -(-a.prompt_tokens // 512)
    shared = 6000 // 4 // 512  # full 512-token blocks inside the shared system prompt
    assert ids_a[:shared] == ids_b[:shared] and ids_a[-1] != ids_b[-1]


def test_records_hold_no_text() -> None:
    req = build_request("completions", {"model": "m", "prompt": "secret " * 400}, CFG, request_id="1")
    line = record_line(req, 1, 0)
    assert "secret" not in repr(line)
    assert all(isinstance(i, int) for i in line["hash_ids"])  # type: ignore[attr-defined]
