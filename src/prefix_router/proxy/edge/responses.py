"""The edge's subclasses of aiohttp's classes, in a module of their own: the compiled build (``setup.py``)
compiles the edge's modules with mypyc, which cannot compile a subclass of an interpreted class of
aiohttp's (it stays interpreted here)."""

from __future__ import annotations

from aiohttp import web


class RelayResponse(web.StreamResponse):
    """A relayed stream that aiohttp writes (one ``head.relay`` leaves to it: HTTP/1.0, ``HEAD``, a status
    without a body): its head goes out with its first chunk, in one write (``send_stream`` writes the
    chunk it already holds right after ``prepare``), instead of a write of its own. aiohttp's
    ``web.Response`` does the same (this class attribute, ``False`` there)."""

    _send_headers_immediately = False


class SentResponse(web.StreamResponse):
    """A whole answer already written to its connection (``head.sent``): aiohttp's connection handler
    finds it prepared and ended, and keeps the connection open or closes it as ``keep_alive`` says."""

    def __init__(self, status: int, keep_alive: bool, length: int) -> None:
        super().__init__(status=status)
        self._keep_alive = keep_alive
        self._eof_sent = True
        self._body_length = length
