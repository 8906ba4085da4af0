"""``forward.salted_body``: the body the router rewrites (the tenant's ``cache_salt`` added) keeps every
other value exactly as the client sent it, integers past 64 bits included (a ``seed`` of 2**64 + 1 is no
float upstream)."""

from __future__ import annotations

import json

import orjson

from prefix_router.node.request.forward import salted_body
from prefix_router.node.request.parse import parse_json


def test_integers_past_64_bits_stay_exact() -> None:
    raw = b'{"model": "m", "seed": 18446744073709551617, "n": -99999999999999999999999, "t": 0.7}'
    out = json.loads(salted_body(parse_json(raw), "tenant", raw))
    assert out["seed"] == 2**64 + 1 and out["n"] == -99999999999999999999999
    assert out["t"] == 0.7 and out["cache_salt"] == "tenant" and out["model"] == "m"


def test_the_clients_own_salt_follows_the_tenants() -> None:
    raw = orjson.dumps({"model": "m", "cache_salt": "mine", "prompt": "\u00e9 12345678901234567890"})
    out = json.loads(salted_body(parse_json(raw), "tenant", raw))
    assert out == {"model": "m", "cache_salt": "tenant-mine", "prompt": "\u00e9 12345678901234567890"}
