"""A client's connection to the router's HTTP server, in memory: the server side of one connection as
aiohttp's ``make_mocked_request`` needs it, for in-process measurements (``benchmarks/request_path.py``)
and tests of what the edge writes (``tests/proxy/edge/test_head.py``)."""

from __future__ import annotations

import asyncio
from typing import Any

from aiohttp.base_protocol import BaseProtocol

PEER = ("127.0.0.1", 40000)
WRITE_LIMITS = (16384, 65536)  # (low, high) water marks, uvloop's defaults


class MemoryTransport(asyncio.Transport):
    """The connection: keeps what is written to it (``keep=False``: drops it); ``closing``: the client
    left; ``buffered``: the bytes it reports as not yet sent (past the high-water mark, the writer waits)."""

    def __init__(self, keep: bool = True, closing: bool = False) -> None:
        super().__init__()
        self.keep = keep
        self.data = bytearray()
        self.closing = closing
        self.buffered = 0

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if self.keep:
            self.data += data

    def writelines(self, data: Any) -> None:
        for piece in data:
            self.write(piece)

    def is_closing(self) -> bool:
        return self.closing

    def get_write_buffer_size(self) -> int:
        return self.buffered

    def get_write_buffer_limits(self) -> tuple[int, int]:
        return WRITE_LIMITS

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return PEER if name in ("peername", "sockname") else default


class ServerSide(BaseProtocol):
    """The connection's protocol as ``make_mocked_request`` fills it in (its writer, its limits)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(loop)
        self.writer: object = None
        self.ssl_context = None
        self.peername = self.sockname = PEER
        self.max_field_size = self.max_line_length = 8190
        self.max_headers = 128
