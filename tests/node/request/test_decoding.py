"""``edge.decoding.Bounded`` held to the plain decoders: any body in any chunking decodes to the same bytes
when it fits the limit, and is refused (``TooLarge``) when it does not, with never more than the limit plus
one byte decoded; bodies that are not what their header says are ``BadEncoding``."""

from __future__ import annotations

import gzip
import itertools
import zlib
from collections.abc import Callable

import brotli
import pytest
from backports.zstd import compress as zstd_compress
from hypothesis import example, given, settings
from hypothesis import strategies as st

from prefix_router.lab.bench.bombs import gzip_bomb
from prefix_router.node.request.decoding import STEP_BYTES, BadEncoding, Bounded, TooLarge

ENCODE: dict[str, Callable[[bytes], bytes]] = {
    "gzip": gzip.compress,
    "deflate": zlib.compress,
    "br": brotli.compress,
    "zstd": zstd_compress,
}


def raw_deflate(data: bytes) -> bytes:
    packer = zlib.compressobj(6, zlib.DEFLATED, -zlib.MAX_WBITS)
    return packer.compress(data) + packer.flush()


def step_bound(encoding: str) -> int:
    """What one step may decode: brotli's output buffer grows by doubling, past the limit it is given."""
    return 2 * STEP_BYTES + 64 * 1024 if encoding == "br" else STEP_BYTES


def decode(encoding: str, wire: bytes, limit: int, cuts: list[int]) -> tuple[bytes, int]:
    """(decoded bytes, the most decoded at any time), feeding ``wire`` cut at ``cuts``."""
    decoder = Bounded(encoding, limit)
    out = bytearray()
    bounds = [0, *sorted(c % (len(wire) + 1) for c in cuts), len(wire)]
    for start, end in itertools.pairwise(bounds):
        decoder.feed(wire[start:end])
        while (piece := decoder.step()) is not None:
            out += piece
            assert len(piece) <= step_bound(encoding)
    decoder.finish()
    return bytes(out), decoder.size


@settings(max_examples=80, deadline=None)
@given(
    data=st.binary(max_size=4000) | st.builds(lambda n: b"a" * n, st.integers(0, 600_000)),
    encoding=st.sampled_from([*ENCODE, "raw-deflate"]),
    cuts=st.lists(st.integers(0, 10**6), max_size=8),
    slack=st.integers(-3, 3),
)
# brotli: the whole stream consumed in one step whose output filled its room, more output still held
@example(data=b"a" * 491457, encoding="br", cuts=[], slack=0)
def test_bounded_decoding_matches_the_plain_decoder(
    data: bytes, encoding: str, cuts: list[int], slack: int
) -> None:
    wire = raw_deflate(data) if encoding == "raw-deflate" else ENCODE[encoding](data)
    name = "deflate" if encoding == "raw-deflate" else encoding
    limit = max(0, len(data) + slack)
    if len(data) <= limit:
        assert decode(name, wire, limit, cuts)[0] == data
    else:
        with pytest.raises(TooLarge):
            decode(name, wire, limit, cuts)


@pytest.mark.parametrize("encoding", list(ENCODE))
def test_a_bomb_is_refused_without_decoding_past_the_limit(encoding: str) -> None:
    limit = 100_000
    wire = gzip_bomb(64) if encoding == "gzip" else ENCODE[encoding](b"0" * (64 * 1024 * 1024))
    decoder = Bounded(encoding, limit)
    decoder.feed(wire)
    with pytest.raises(TooLarge):
        while decoder.step() is not None:
            pass
    assert limit < decoder.size <= limit + (step_bound(encoding) if encoding == "br" else 1)


def test_concatenated_gzip_members_decode_in_order() -> None:
    wire = gzip.compress(b"one ") + gzip.compress(b"two")
    assert decode("gzip", wire, 100, [3, 30])[0] == b"one two"


@pytest.mark.parametrize(
    ("encoding", "wire"),
    [
        ("gzip", b'{"model": "m"}'),  # labelled gzip, not gzip
        ("gzip", gzip.compress(b"x" * 1000, mtime=0)[:-20]),  # cut short
        ("gzip", gzip.compress(b"x", mtime=0) + b"garbage after it"),
        ("deflate", b"\x78\x9c not zlib"),
        ("br", b"\xff\xff\xff not brotli"),
        ("br", brotli.compress(b"a" * 491457 + bytes(range(256)) * 12)[:-20]),  # cut short, output held
        ("zstd", b"not zstd at all"),
    ],
)
def test_what_is_not_its_encoding_is_bad_encoding(encoding: str, wire: bytes) -> None:
    with pytest.raises(BadEncoding):
        decode(encoding, wire, 10**6, [])
