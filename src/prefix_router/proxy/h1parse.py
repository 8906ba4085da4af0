"""HTTP/1.1 response framing for the lean upstream client: the head, then the body by its framing.

Pure functions and small state machines over bytes, with bounds on every line. Body framers take the
bytes received and return the body pieces found in them (relayed as is) plus any bytes past the end.
"""

from __future__ import annotations

from dataclasses import dataclass

from multidict import CIMultiDict

MAX_HEAD_BYTES = 64 * 1024
MAX_CHUNK_LINE = 4096


class ProtocolError(Exception):
    """The upstream broke HTTP/1.1 framing; the connection cannot be reused."""


@dataclass(slots=True)
class Head:
    status: int
    headers: CIMultiDict[str]
    version: tuple[int, int]

    def keep_alive(self) -> bool:
        tokens = {t.strip().lower() for t in self.headers.get("Connection", "").split(",")}
        if self.version >= (1, 1):
            return "close" not in tokens
        return "keep-alive" in tokens


def find_head(buf: bytearray) -> int:
    """Index just past the blank line ending the head, or -1 while incomplete."""
    end = buf.find(b"\r\n\r\n")
    if end < 0:
        if len(buf) > MAX_HEAD_BYTES:
            raise ProtocolError("response head too large")
        return -1
    if end > MAX_HEAD_BYTES:
        raise ProtocolError("response head too large")
    return end + 4


def parse_head(raw: bytes) -> Head:
    """Parse ``HTTP/1.x SSS reason\\r\\nName: value\\r\\n...`` (without the final blank line)."""
    lines = raw.decode("utf-8", "surrogateescape").split("\r\n")
    parts = lines[0].split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or len(parts[1]) != 3 or not parts[1].isdigit():
        raise ProtocolError(f"bad status line {lines[0][:80]!r}")
    version = (1, 1) if parts[0] == "HTTP/1.1" else (1, 0)
    headers: CIMultiDict[str] = CIMultiDict()
    for line in lines[1:]:
        if not line:
            continue
        name, sep, value = line.partition(":")
        if not sep or not name or name != name.strip():
            raise ProtocolError(f"bad header line {line[:80]!r}")
        headers.add(name, value.strip())
    return Head(int(parts[1]), headers, version)


class BodyFramer:
    """Splits the byte stream after a head into body pieces; ``done`` once the body ended."""

    done: bool = False
    until_close: bool = False

    def feed(self, data: bytes) -> tuple[list[bytes], bytes]:
        """Body pieces in ``data`` and the bytes left after the body's end."""
        raise NotImplementedError


class NoBody(BodyFramer):
    def __init__(self) -> None:
        self.done = True

    def feed(self, data: bytes) -> tuple[list[bytes], bytes]:
        return [], data


class LengthBody(BodyFramer):
    def __init__(self, length: int) -> None:
        self.remaining = length
        self.done = length == 0

    def feed(self, data: bytes) -> tuple[list[bytes], bytes]:
        take = data[: self.remaining]
        self.remaining -= len(take)
        self.done = self.remaining == 0
        return ([take] if take else []), data[len(take) :]


class UntilCloseBody(BodyFramer):
    """No length and not chunked: the body runs until the server closes the connection."""

    until_close = True

    def feed(self, data: bytes) -> tuple[list[bytes], bytes]:
        return ([data] if data else []), b""


class ChunkedBody(BodyFramer):
    """``Transfer-Encoding: chunked``: yields the decoded data (the proxy re-chunks for its client)."""

    def __init__(self) -> None:
        self._buf = bytearray()
        self._remaining = 0  # data bytes left in the current chunk
        self._state = "size"  # size | data | crlf | trailers

    def feed(self, data: bytes) -> tuple[list[bytes], bytes]:
        self._buf += data
        out: list[bytes] = []
        while not self.done and self._step(out):
            pass
        if self.done:
            rest = bytes(self._buf)
            self._buf.clear()
            return out, rest
        return out, b""

    def _step(self, out: list[bytes]) -> bool:
        """Advance one state; False when more bytes are needed."""
        if self._state == "data":
            return self._data(out)
        if self._state == "crlf":
            return self._crlf()
        line = self._line()
        if line is None:
            return False
        if self._state == "size":
            self._size(line)
        elif not line:  # trailers end with an empty line
            self.done = True
        return True

    def _data(self, out: list[bytes]) -> bool:
        if not self._buf:
            return False
        take = bytes(self._buf[: self._remaining])
        del self._buf[: len(take)]
        self._remaining -= len(take)
        out.append(take)
        if self._remaining == 0:
            self._state = "crlf"
        return True

    def _crlf(self) -> bool:
        if len(self._buf) < 2:
            return False
        if self._buf[:2] != b"\r\n":
            raise ProtocolError("missing CRLF after chunk data")
        del self._buf[:2]
        self._state = "size"
        return True

    def _line(self) -> bytes | None:
        end = self._buf.find(b"\r\n")
        if end < 0:
            if len(self._buf) > MAX_CHUNK_LINE:
                raise ProtocolError("chunk line too long")
            return None
        line = bytes(self._buf[:end])
        del self._buf[: end + 2]
        return line

    def _size(self, line: bytes) -> None:
        digits = line.split(b";", 1)[0].strip()
        try:
            size = int(digits, 16)
        except ValueError:
            raise ProtocolError(f"bad chunk size {digits[:20]!r}") from None
        if size < 0 or not digits or digits.startswith((b"-", b"+", b"0x", b"0X")):
            raise ProtocolError(f"bad chunk size {digits[:20]!r}")
        self._remaining = size
        self._state = "data" if size else "trailers"


def body_framer(head: Head, method: str) -> BodyFramer:
    """How the body after ``head`` is delimited (RFC 9112 section 6.3)."""
    if method == "HEAD" or head.status in (204, 304) or 100 <= head.status < 200:
        return NoBody()
    encoding = head.headers.get("Transfer-Encoding", "").lower()
    if encoding:
        if encoding.rsplit(",", 1)[-1].strip() != "chunked":
            return UntilCloseBody()
        return ChunkedBody()
    lengths = head.headers.getall("Content-Length", [])
    if lengths:
        if len(set(lengths)) != 1 or not lengths[0].isdigit():
            raise ProtocolError("bad Content-Length")
        return LengthBody(int(lengths[0]))
    return UntilCloseBody()
