"""The engines' KV cache events (vLLM, SGLang): the wire format, decoded into plain values.

Pure: bytes in, values out (no sockets, no event loop). The subscriber (``pool/kv_events.py``) feeds the
frames it receives to ``decode_message``; the precise view (``routing/precise.py``) applies the events.
"""

from prefix_router.events.wire import (
    DROPPED_CONNECTION,
    END_OF_REPLAY,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    DecodeError,
    EngineEvent,
    EventBatch,
    EventMessage,
    decode_batch,
    decode_message,
    decode_replay,
    encode_batch,
    encode_message,
    seq_bytes,
)

__all__ = [
    "DROPPED_CONNECTION",
    "END_OF_REPLAY",
    "AllBlocksCleared",
    "BlockRemoved",
    "BlockStored",
    "DecodeError",
    "EngineEvent",
    "EventBatch",
    "EventMessage",
    "decode_batch",
    "decode_message",
    "decode_replay",
    "encode_batch",
    "encode_message",
    "seq_bytes",
]
