"""``decoding.Bounded``'s two bounds besides the size limit, for gzip, zstd and deflate: concatenated members
(at most ``MAX_MEMBERS``, then ``BadEncoding``), and the bytes one step decodes (at most ``STEP_BYTES``,
so the event loop gets a turn between steps of a body that compresses well)."""

from __future__ import annotations

import gzip
import sys
import zlib
from collections.abc import Callable

import pytest

from prefix_router.node.request.decoding import MAX_MEMBERS, STEP_BYTES, BadEncoding, Bounded

if sys.version_info >= (3, 14):
    from compression.zstd import compress as zstd_compress
else:
    from backports.zstd import compress as zstd_compress

ENCODE: dict[str, Callable[[bytes], bytes]] = {
    "gzip": lambda data: gzip.compress(data, mtime=0),
    "deflate": zlib.compress,
    "zstd": zstd_compress,
}


def steps(decoder: Bounded) -> list[bytes]:
    out = []
    while (piece := decoder.step()) is not None:
        out.append(piece)
    return out


@pytest.mark.parametrize("encoding", list(ENCODE))
def test_members_up_to_the_bound_decode_one_more_is_refused(encoding: str) -> None:
    member = ENCODE[encoding](b"ab")
    decoder = Bounded(encoding, 10 * MAX_MEMBERS)
    decoder.feed(member * MAX_MEMBERS)
    assert b"".join(steps(decoder)) == b"ab" * MAX_MEMBERS
    decoder.finish()
    over = Bounded(encoding, 10 * MAX_MEMBERS)
    over.feed(member * (MAX_MEMBERS + 1))
    with pytest.raises(BadEncoding, match=f"more than {MAX_MEMBERS} members"):
        steps(over)


@pytest.mark.parametrize("encoding", list(ENCODE))
def test_one_step_decodes_at_most_step_bytes(encoding: str) -> None:
    data = b"0" * (8 * STEP_BYTES)
    decoder = Bounded(encoding, len(data))
    decoder.feed(ENCODE[encoding](data))  # all of it at once: a few kB on the wire
    pieces = steps(decoder)
    decoder.finish()
    assert b"".join(pieces) == data
    assert max(len(p) for p in pieces) <= STEP_BYTES and len(pieces) >= 8
