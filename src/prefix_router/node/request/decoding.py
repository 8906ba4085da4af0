"""Request bodies sent with ``Content-Encoding`` (gzip, deflate, br, zstd), decoded by the router with a
bound: the router's server does not decode (aiohttp's own decoding runs on every byte that arrives, even
after the answer, so a bomb kept the event loop busy); ``Bounded`` decodes chunk by chunk as the body is
read, never more than the limit plus one byte in all and never more than ``STEP_BYTES`` at a time, so a
bomb is refused (413) once its decoded size passes the limit, without decoding the rest.

Knobs: the limit is the caller's (``limits.max_body_bytes``); ``STEP_BYTES`` bounds one decoding step
(the event loop gets a turn between steps); ``MAX_MEMBERS`` bounds concatenated gzip/zstd members.
A body that is not what its header says (or is cut short) raises ``BadEncoding``."""

from __future__ import annotations

import sys
import zlib
from collections.abc import Callable
from typing import Protocol

import brotli

if sys.version_info >= (3, 14):
    from compression.zstd import ZstdDecompressor, ZstdError
else:
    from backports.zstd import ZstdDecompressor, ZstdError

STEP_BYTES = 256 * 1024
MAX_MEMBERS = 1024
ENCODINGS = frozenset({"gzip", "x-gzip", "deflate", "br", "zstd"})


class BadEncoding(ValueError):
    """The body does not decode as its ``Content-Encoding`` says."""


class TooLarge(ValueError):
    """The decoded body is over the limit."""


class _Stream(Protocol):
    """One decompressor: ``step`` returns at most ``room`` bytes, keeping what it could not decode yet."""

    def step(self, data: bytes, room: int) -> bytes: ...

    def more(self) -> bool:
        """Whether it holds input that can give more output without new input."""
        ...

    def done(self) -> bool: ...

    def unused(self) -> bytes:
        """Input past the end of its stream (the next member, or trailing garbage)."""
        ...


class _Zlib:
    def __init__(self, wbits: int) -> None:
        self._d = zlib.decompressobj(wbits)
        self._tail = b""

    def step(self, data: bytes, room: int) -> bytes:
        out = self._d.decompress(self._tail + data, room)
        self._tail = self._d.unconsumed_tail
        return out

    def more(self) -> bool:
        return bool(self._tail)

    def done(self) -> bool:
        return self._d.eof

    def unused(self) -> bytes:
        return self._d.unused_data


class _Brotli:
    """``can_accept_more_data()`` is False only while *input* is left unconsumed; a step that consumed all
    of its input may still hold output (brotli 1.2: a stream that compresses extremely well fills the room
    in one step; input that ends mid-stream gives ~32 KiB a call). So a step that gave output counts as
    more to come: the decoder is stepped on empty input until a step gives nothing."""

    def __init__(self) -> None:
        self._d = brotli.Decompressor()
        self._gave = False

    def step(self, data: bytes, room: int) -> bytes:
        if data and not self._d.can_accept_more_data():
            raise AssertionError("fed while output is pending")
        out = bytes(self._d.process(data, output_buffer_limit=room))
        self._gave = bool(out)
        return out

    def more(self) -> bool:
        return not self._d.is_finished() and (self._gave or not self._d.can_accept_more_data())

    def done(self) -> bool:
        return bool(self._d.is_finished())

    def unused(self) -> bytes:
        return b""


class _Zstd:
    def __init__(self) -> None:
        self._d = ZstdDecompressor()

    def step(self, data: bytes, room: int) -> bytes:
        return self._d.decompress(data, room) if room > 0 else b""

    def more(self) -> bool:
        return not self._d.eof and not self._d.needs_input

    def done(self) -> bool:
        return self._d.eof

    def unused(self) -> bytes:
        return self._d.unused_data


def _zlib_for(encoding: str) -> Callable[[bytes], _Stream]:
    def make(first: bytes) -> _Stream:
        if encoding != "deflate":
            return _Zlib(16 + zlib.MAX_WBITS)
        # RFC 9110 says zlib-wrapped; some clients send raw deflate (no zlib header): told by its first byte
        return _Zlib(zlib.MAX_WBITS if first[:1] and first[0] & 0x0F == 8 else -zlib.MAX_WBITS)

    return make


_STREAMS: dict[str, Callable[[bytes], _Stream]] = {
    "gzip": _zlib_for("gzip"),
    "x-gzip": _zlib_for("gzip"),
    "deflate": _zlib_for("deflate"),
    "br": lambda first: _Brotli(),
    "zstd": lambda first: _Zstd(),
}


def decodes(encoding: str | None) -> bool:
    """Whether the router decodes a body with this ``Content-Encoding`` (the others cross unchanged)."""
    return encoding is not None and encoding.strip().lower() in ENCODINGS


class Bounded:
    """Decodes one body in ``feed``/``step`` calls; ``TooLarge`` once more than ``limit`` bytes came out,
    before decoding any further."""

    def __init__(self, encoding: str, limit: int) -> None:
        self.encoding = encoding.strip().lower()
        self._make = _STREAMS[self.encoding]
        self._limit = limit
        self._stream: _Stream | None = None
        self._pending = b""
        self._members = 0
        self.size = 0

    def feed(self, data: bytes) -> None:
        """Take wire bytes; decode them with ``step``."""
        self._pending += data

    def step(self) -> bytes | None:
        """Decode at most ``STEP_BYTES`` of what was fed; None when nothing more comes without input."""
        try:
            return self._step()
        except (zlib.error, brotli.error, ZstdError) as exc:
            raise BadEncoding(type(exc).__name__) from None

    def _step(self) -> bytes | None:
        stream = self._stream
        if stream is not None and stream.done():
            self._pending = stream.unused() + self._pending
            stream = self._stream = None
        if stream is None:
            if not self._pending:
                return None
            self._members += 1
            if self._members > MAX_MEMBERS:
                raise BadEncoding(f"more than {MAX_MEMBERS} members")
            stream = self._stream = self._make(self._pending)
        elif not self._pending and not stream.more():
            return None
        data, self._pending = (b"", self._pending) if stream.more() else (self._pending, b"")
        out = stream.step(data, min(STEP_BYTES, self._limit - self.size + 1))
        self.size += len(out)
        if self.size > self._limit:
            raise TooLarge(str(self._limit))
        return out

    def finish(self) -> None:
        """The body ended: ``BadEncoding`` if its last stream was cut short."""
        if self._stream is not None and not self._stream.done():
            raise BadEncoding("truncated")
