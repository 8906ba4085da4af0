"""The request bodies of prefill/decode disaggregation, one pair per ``disaggregation.flow``, in the format
each engine family documents (``docs/disaggregation.md``); transport-free.

- ``shared_storage`` (vLLM's ``ExampleConnector``, LMCache, llm-d's shared-storage path): the prefill is
  the client's body with ``max_tokens: 1`` (and ``max_completion_tokens: 1`` when the client used it) and
  ``stream: false``; the decode is the client's body as it came.
- ``kv_transfer_params`` (vLLM's NIXL-style connectors; vllm-router, llm-d's sidecar): the prefill as
  above plus ``kv_transfer_params: {do_remote_decode: true, do_remote_prefill: false, remote_engine_id:
  null, remote_block_ids: null, remote_host: null, remote_port: null}``; the decode is the client's body
  plus the ``kv_transfer_params`` object the prefill answered with.
- ``sglang_bootstrap`` (SGLang; SMG, llm-d): one body for both stages, the client's plus
  ``bootstrap_host`` (the prefill worker's host), ``bootstrap_port`` (its bootstrap server) and
  ``bootstrap_room`` (a random 63-bit integer pairing the two), sent to both at once.

A prefill never streams, so what only a stream takes goes (``stream_options``: vLLM refuses it on a
non-streamed request), and so does ``min_tokens`` (refused above ``max_tokens``). Every other field stays
as the client sent it: a body with an integer past 64 bits is read again from its raw bytes exactly.
"""

from __future__ import annotations

import json
import random
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

import orjson

from prefix_router.node.request.forward import has_long_number
from prefix_router.routing import Flow

SGLANG_BOOTSTRAP_PORT = 8998  # SGLang's default ``--disaggregation-bootstrap-port``
REMOTE_DECODE: dict[str, Any] = {
    "do_remote_decode": True,
    "do_remote_prefill": False,
    "remote_engine_id": None,
    "remote_block_ids": None,
    "remote_host": None,
    "remote_port": None,
}
_NOT_IN_PREFILL = ("stream_options", "min_tokens")


def edited(
    body: Mapping[str, Any], raw: bytes, fields: Mapping[str, Any], drop: tuple[str, ...] = ()
) -> bytes:
    """``body`` (parsed from ``raw``) with ``fields`` set (new ones last) and ``drop`` removed; other values
    exactly as sent."""
    source: dict[str, Any] = json.loads(raw) if has_long_number(raw) else dict(body)
    for key in drop:
        source.pop(key, None)
    source.update(fields)
    if has_long_number(raw):
        return json.dumps(source, ensure_ascii=False, separators=(",", ":")).encode()
    return orjson.dumps(source)


def prefill_fields(body: Mapping[str, Any], flow: Flow) -> dict[str, Any]:
    """What the prefill stage's body sets (shared storage and ``kv_transfer_params``)."""
    fields: dict[str, Any] = {"max_tokens": 1, "stream": False}
    if "max_completion_tokens" in body:
        fields["max_completion_tokens"] = 1
    if flow == "kv_transfer_params":
        fields["kv_transfer_params"] = dict(REMOTE_DECODE)
    return fields


def prefill_body(body: Mapping[str, Any], raw: bytes, flow: Flow, extra: Mapping[str, Any]) -> bytes:
    """The prefill stage's body; ``extra``: fields every upstream body of the request carries
    (``cache_salt``)."""
    return edited(body, raw, {**extra, **prefill_fields(body, flow)}, _NOT_IN_PREFILL)


def returned_params(answer: bytes) -> dict[str, Any] | None:
    """The ``kv_transfer_params`` object of a prefill's JSON answer; None when it has none."""
    try:
        parsed = orjson.loads(answer)
    except orjson.JSONDecodeError:
        return None
    params = parsed.get("kv_transfer_params") if isinstance(parsed, dict) else None
    return params if isinstance(params, dict) else None


def bootstrap_fields(prefill_url: str, bootstrap_port: int | None, rng: random.Random) -> dict[str, Any]:
    """SGLang's pairing of a prefill and a decode: the prefill worker's host and bootstrap port, a fresh
    63-bit room."""
    host = urlsplit(prefill_url).hostname or ""
    port = bootstrap_port if bootstrap_port is not None else SGLANG_BOOTSTRAP_PORT
    return {"bootstrap_host": host, "bootstrap_port": port, "bootstrap_room": rng.getrandbits(63)}
