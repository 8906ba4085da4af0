"""Decompression bombs for tests and benchmarks: a valid gzip body whose decoded size is far over any body
limit, built in milliseconds (compressing gigabytes of zeros takes seconds): the compressor's state is reset
after each mebibyte (a full flush), so every further mebibyte of zeros compresses to the same bytes, repeated;
the trailer's CRC-32 and size are those of the whole decoded body."""

from __future__ import annotations

import struct
import zlib

MIB = 1024 * 1024


def gzip_bomb(mebibytes: int, prefix: bytes = b'{"model": "m", "prompt": "', suffix: bytes = b'"}') -> bytes:
    """``prefix`` + ``mebibytes`` MiB of ``0`` + ``suffix``, gzipped (about 1 KiB on the wire per MiB)."""
    zeros = b"0" * MIB
    packer = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    head = packer.compress(prefix) + packer.compress(zeros) + packer.flush(zlib.Z_FULL_FLUSH)
    block = packer.compress(zeros) + packer.flush(zlib.Z_FULL_FLUSH)
    tail = packer.compress(suffix) + packer.flush()
    crc = zlib.crc32(prefix)
    for _ in range(mebibytes):
        crc = zlib.crc32(zeros, crc)
    crc = zlib.crc32(suffix, crc)
    size = (len(prefix) + mebibytes * MIB + len(suffix)) & 0xFFFFFFFF
    return head + block * (mebibytes - 1) + tail[:-8] + struct.pack("<II", crc, size)
