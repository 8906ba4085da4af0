"""Privacy-preserving request records in the Mooncake trace format (hashes only, never text).

One record per request: ``{"timestamp": ms, "input_length": tokens, "output_length": tokens,
"hash_ids": [...]}``. ``hash_ids[i]`` identifies the whole prefix of the first ``(i + 1) x record_tokens``
tokens, as in the Mooncake trace: because the router's block hashes are chained, the hash of the last
router block inside each record block already identifies that whole prefix. A trailing partial record
block is named by the last full router block it contains (or the previous id when it contains none).
"""

from __future__ import annotations

import math

from prefix_router.protocol import MOONCAKE_BLOCK_TOKENS
from prefix_router.routing.types import RouteRequest


def record_hash_ids(req: RouteRequest, record_tokens: int = MOONCAKE_BLOCK_TOKENS) -> list[int]:
    per = max(1, record_tokens // max(1, req.block_tokens))
    count = math.ceil(req.key_tokens / record_tokens) if req.key_tokens else 0
    ids: list[int] = []
    for i in range(count):
        last = min((i + 1) * per, len(req.blocks)) - 1
        if last >= 0:
            ids.append(req.blocks[last])
        else:
            ids.append(req.namespace)
    return ids
