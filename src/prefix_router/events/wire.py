"""KV cache events on the wire (vLLM's ``ZmqEventPublisher``; SGLang's publisher has the same layout).

- A message is 3 frames ``[topic, seq, payload]``: ``seq`` an 8-byte big-endian counter that starts at 0
  in every engine process (backwards: the engine restarted). A replay answer (the engine's ROUTER socket)
  is ``[b"", topic, seq, payload]`` (older engines and SGLang: without the topic), ended by
  ``[b"", b"", -1 as 8 signed bytes, b""]`` (``END_OF_REPLAY``).
- prefix-router's own notice, from the fan-out of ``serve --processes N`` to its serving processes: an
  engine's connection dropped, ``[topic, -1 as 8 signed bytes, b""]`` (``DROPPED_CONNECTION``, the seq
  frame; no engine publishes -1 live).
- The payload is msgpack: ``[ts, events, dp_rank]`` (``dp_rank`` absent on old engines).
- An event is a map with a ``type`` tag (vLLM >= 0.26) or a positional array whose first item is the tag
  (older vLLM, SGLang): ``["BlockStored", block_hashes, parent_block_hash, token_ids, block_size,
  lora_id, medium, lora_name, extra_keys, group_idx, kv_cache_spec_kind, ...]``, ``["BlockRemoved",
  block_hashes, medium, group_idx]``, ``["AllBlocksCleared"]``; trailing fields may be omitted, unknown
  fields (named or trailing) are ignored, an unknown event type is skipped (counted in ``skipped``).
- Block hashes are 64-bit ints or bytes (``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0``): kept as given, only
  ever compared with the same engine's hashes.
- Bounds (what a publisher can make the router hold or walk): a block hash of at most ``MAX_HASH_BYTES``
  bytes, at most ``MAX_BLOCKS`` blocks and ``MAX_TOKENS`` token ids per event, ``MAX_EVENTS`` events per
  batch, extra keys nested at most ``MAX_DEPTH`` deep; the message's size is the subscriber's to bound.

Anything malformed or past a bound raises ``DecodeError`` (a ``ValueError``) and nothing else (a payload
nested too deep for the decoder included).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec

BlockHash = int | bytes
END_OF_REPLAY = -1
DROPPED_CONNECTION = (-1).to_bytes(8, "big", signed=True)
_MAX_BLOCK_SIZE = 1 << 20
_MAX_TOKEN = 1 << 32
MAX_HASH_BYTES = 64  # a sha256 digest is 32
MAX_BLOCKS = 1 << 16  # a 1 M-token prompt at 16-token blocks
MAX_TOKENS = 1 << 21
MAX_EVENTS = 1 << 16
MAX_DEPTH = 8
_decoder = msgspec.msgpack.Decoder()
_encoder = msgspec.msgpack.Encoder()


class DecodeError(ValueError):
    """Bytes that are not a KV cache event message (the reason in the text)."""


@dataclass(frozen=True, slots=True)
class BlockStored:
    """Blocks the engine cached: ``block_hashes[i]`` holds ``token_ids[i*block_size:(i+1)*block_size]``,
    each block the parent of the next, the first one's parent ``parent_block_hash`` (None: a prompt's
    first block). ``extra_keys``: one entry per block (LoRA name, multimodal ids, the first block's cache
    salt) or None."""

    block_hashes: tuple[BlockHash, ...]
    parent_block_hash: BlockHash | None
    token_ids: tuple[int, ...]
    block_size: int
    lora_id: int | None = None
    medium: str | None = None
    lora_name: str | None = None
    extra_keys: tuple[Any, ...] | None = None
    group_idx: int | None = None


@dataclass(frozen=True, slots=True)
class BlockRemoved:
    block_hashes: tuple[BlockHash, ...]
    medium: str | None = None
    group_idx: int | None = None


@dataclass(frozen=True, slots=True)
class AllBlocksCleared:
    medium: str | None = None


EngineEvent = BlockStored | BlockRemoved | AllBlocksCleared


@dataclass(frozen=True, slots=True)
class EventBatch:
    ts: float
    events: tuple[EngineEvent, ...]
    dp_rank: int | None = None
    skipped: int = 0  # events of a type this decoder does not know


@dataclass(frozen=True, slots=True)
class EventMessage:
    topic: bytes
    seq: int
    batch: EventBatch = field(default_factory=lambda: EventBatch(0.0, ()))


# ---------------------------------------------------------------- decoding


def decode_message(frames: Sequence[bytes]) -> EventMessage:
    """A published message ``[topic, seq, payload]``."""
    if len(frames) != 3:
        raise DecodeError(f"expected 3 frames, got {len(frames)}")
    topic, seq, payload = frames
    return EventMessage(bytes(topic), _seq(seq), decode_batch(payload))


def decode_replay(frames: Sequence[bytes]) -> EventMessage | None:
    """A replay answer ``[b"", topic, seq, payload]`` or ``[b"", seq, payload]``; None: the end marker."""
    parts = list(frames)
    if parts and not parts[0]:
        parts = parts[1:]  # the DEALER's empty delimiter
    if len(parts) == 2:
        parts = [b"", *parts]
    if len(parts) != 3:
        raise DecodeError(f"expected a replay answer of 2-4 frames, got {len(frames)}")
    topic, seq, payload = parts
    if len(seq) == 8 and int.from_bytes(seq, "big", signed=True) == END_OF_REPLAY:
        return None
    return EventMessage(bytes(topic), _seq(seq), decode_batch(payload))


def _seq(frame: bytes) -> int:
    if len(frame) != 8:
        raise DecodeError(f"sequence frame of {len(frame)} bytes (8 expected)")
    return int.from_bytes(frame, "big")


def decode_batch(payload: bytes) -> EventBatch:
    try:
        raw = _decoder.decode(payload)
    except (msgspec.DecodeError, ValueError, TypeError) as exc:
        raise DecodeError(f"not msgpack: {exc}") from None
    except RecursionError:
        raise DecodeError("msgpack nested too deep") from None
    if not isinstance(raw, list | tuple) or len(raw) < 2:
        raise DecodeError("the batch is not [ts, events, dp_rank]")
    ts, events = raw[0], raw[1]
    if isinstance(ts, bool) or not isinstance(ts, int | float) or not isinstance(events, list | tuple):
        raise DecodeError("the batch is not [ts, events, dp_rank]")
    if len(events) > MAX_EVENTS:
        raise DecodeError(f"a batch of {len(events)} events (at most {MAX_EVENTS})")
    dp_rank = raw[2] if len(raw) > 2 else None
    out: list[EngineEvent] = []
    skipped = 0
    for item in events:
        event = _event(item)
        if event is None:
            skipped += 1
        else:
            out.append(event)
    return EventBatch(float(ts), tuple(out), _opt_int(dp_rank, "dp_rank"), skipped)


_STORED = ("block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium")
_STORED_MORE = ("lora_name", "extra_keys", "group_idx")
_REMOVED = ("block_hashes", "medium", "group_idx")


def _event(item: object) -> EngineEvent | None:
    """One event from a tagged map or a positional array; None for an unknown type."""
    if isinstance(item, Mapping):
        tag, fields = item.get("type"), item
    elif isinstance(item, list | tuple) and item:
        tag = item[0]
        names = {
            "BlockStored": _STORED + _STORED_MORE,
            "BlockRemoved": _REMOVED,
            "AllBlocksCleared": ("medium",),
        }.get(tag if isinstance(tag, str) else "", ())
        fields = dict(zip(names, item[1:], strict=False))
    else:
        raise DecodeError("an event is neither a map nor an array")
    if not isinstance(tag, str):
        raise DecodeError("an event without a type tag")
    if tag == "BlockStored":
        return _stored(fields)
    if tag == "BlockRemoved":
        return BlockRemoved(
            _hashes(fields.get("block_hashes")),
            _opt_str(fields.get("medium"), "medium"),
            _opt_int(fields.get("group_idx"), "group_idx"),
        )
    if tag == "AllBlocksCleared":
        return AllBlocksCleared(_opt_str(fields.get("medium"), "medium"))
    return None


def _stored(fields: Mapping[str, Any]) -> BlockStored:
    hashes = _hashes(fields.get("block_hashes"))
    size = fields.get("block_size")
    if type(size) is not int or not 0 < size <= _MAX_BLOCK_SIZE:
        raise DecodeError("BlockStored: block_size must be a positive int")
    tokens = fields.get("token_ids")
    if isinstance(tokens, list | tuple) and len(tokens) > MAX_TOKENS:
        raise DecodeError(f"BlockStored: {len(tokens)} token ids (at most {MAX_TOKENS})")
    if not isinstance(tokens, list | tuple) or any(
        type(t) is not int or not 0 <= t < _MAX_TOKEN for t in tokens
    ):
        raise DecodeError("BlockStored: token_ids must be ints in [0, 2^32)")
    if len(tokens) != len(hashes) * size:
        raise DecodeError(f"BlockStored: {len(tokens)} token ids for {len(hashes)} blocks of {size}")
    parent = fields.get("parent_block_hash")
    extra = fields.get("extra_keys")
    if extra is not None and (not isinstance(extra, list | tuple) or len(extra) != len(hashes)):
        raise DecodeError("BlockStored: extra_keys must hold one entry per block")
    return BlockStored(
        hashes,
        None if parent is None else _hash(parent),
        tuple(tokens),
        size,
        _opt_int(fields.get("lora_id"), "lora_id"),
        _opt_str(fields.get("medium"), "medium"),
        _opt_str(fields.get("lora_name"), "lora_name"),
        None if extra is None else tuple(_freeze(e) for e in extra),
        _opt_int(fields.get("group_idx"), "group_idx"),
    )


def _hashes(value: object) -> tuple[BlockHash, ...]:
    if not isinstance(value, list | tuple):
        raise DecodeError("block_hashes must be an array")
    if len(value) > MAX_BLOCKS:
        raise DecodeError(f"{len(value)} block hashes in one event (at most {MAX_BLOCKS})")
    return tuple(_hash(h) for h in value)


def _hash(value: object) -> BlockHash:
    if type(value) is int:
        return value
    if isinstance(value, bytes):
        if len(value) > MAX_HASH_BYTES:
            raise DecodeError(f"a block hash of {len(value)} bytes (at most {MAX_HASH_BYTES})")
        return value
    raise DecodeError("a block hash must be an int or bytes")


def _opt_int(value: object, name: str) -> int | None:
    if value is None or type(value) is int:
        return value
    raise DecodeError(f"{name} must be an int")


def _opt_str(value: object, name: str) -> str | None:
    if value is None or isinstance(value, str):
        return value
    raise DecodeError(f"{name} must be a string")


def _freeze(value: object, depth: int = 0) -> Any:
    """Lists (msgpack arrays) as tuples, so that extra keys compare and hash; deeper than ``MAX_DEPTH``:
    ``DecodeError``."""
    if depth > MAX_DEPTH:
        raise DecodeError(f"extra keys nested deeper than {MAX_DEPTH}")
    if isinstance(value, list | tuple):
        return tuple(_freeze(v, depth + 1) for v in value)
    if isinstance(value, dict):
        return tuple(sorted((repr(k), _freeze(v, depth + 1)) for k, v in value.items()))
    return value


# ---------------------------------------------------------------- encoding (the simulated engine, tests)


def seq_bytes(seq: int) -> bytes:
    return seq.to_bytes(8, "big", signed=seq < 0)


def encode_batch(batch: EventBatch, tagged: bool = True) -> bytes:
    """``batch`` as an engine sends it: tagged maps (vLLM >= 0.26) or positional arrays (older, SGLang)."""
    events = [_encode_event(e, tagged) for e in batch.events]
    return _encoder.encode([batch.ts, events, batch.dp_rank])


def encode_message(topic: bytes, seq: int, batch: EventBatch, tagged: bool = True) -> list[bytes]:
    return [topic, seq_bytes(seq), encode_batch(batch, tagged)]


def _encode_event(event: EngineEvent, tagged: bool) -> object:
    if isinstance(event, BlockStored):
        tag = "BlockStored"
        values: list[object] = [
            list(event.block_hashes),
            event.parent_block_hash,
            list(event.token_ids),
            event.block_size,
            event.lora_id,
            event.medium,
            event.lora_name,
            None if event.extra_keys is None else list(event.extra_keys),
            event.group_idx,
        ]
        names: tuple[str, ...] = _STORED + _STORED_MORE
    elif isinstance(event, BlockRemoved):
        tag, values, names = (
            "BlockRemoved",
            [list(event.block_hashes), event.medium, event.group_idx],
            _REMOVED,
        )
    else:
        tag, values, names = "AllBlocksCleared", [event.medium], ("medium",)
    if tagged:
        return {"type": tag, **dict(zip(names, values, strict=True))}
    while values and values[-1] is None:  # trailing defaults omitted, as the engines do
        values.pop()
    return [tag, *values]
