from __future__ import annotations

from prefix_router.routing.keys import KeyBuilder
from prefix_router.routing.record import record_hash_ids
from prefix_router.routing.settings import KeySettings

CFG = KeySettings(block_tokens=16)
KEYS = KeyBuilder(CFG)


def test_records_share_leading_ids_exactly_when_prefixes_are_shared() -> None:
    system = {"role": "system", "content": "s" * 6000}
    a = KEYS.build(
        "chat", {"model": "m", "messages": [system, {"role": "user", "content": "a" * 900}]}, route_id="1"
    )
    b = KEYS.build(
        "chat", {"model": "m", "messages": [system, {"role": "user", "content": "b" * 900}]}, route_id="2"
    )
    ids_a, ids_b = record_hash_ids(a), record_hash_ids(b)
    assert len(ids_a) == -(-a.key_tokens // 512)
    shared = 6000 // 4 // 512  # full 512-token blocks inside the shared system prompt
    assert ids_a[:shared] == ids_b[:shared] and ids_a[-1] != ids_b[-1]


def test_records_hold_no_text() -> None:
    req = KEYS.build("completions", {"model": "m", "prompt": "secret " * 400}, route_id="1")
    ids = record_hash_ids(req)
    assert "secret" not in repr(ids)
    assert ids and all(isinstance(i, int) for i in ids)
