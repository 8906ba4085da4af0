"""HTTP client plumbing: ``client_session``, the one way the project opens an aiohttp client session (the
proxy's upstream, this pool's fetcher, the benchmark's calls to engines), and the pool's only network need,
bounded GET requests (probes, model lists, metrics pages), behind the one-method ``Fetcher`` seam so tests
can script engines without sockets.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

import aiohttp

DEFAULT_CONNECTIONS = 64
IDLE_TIMEOUT_S = 4.0  # under uvicorn's 5 s keep-alive (vLLM, SGLang): a reused connection is never stale


def client_session(
    timeout: aiohttp.ClientTimeout,
    *,
    connections: int = DEFAULT_CONNECTIONS,
    idle_timeout_s: float = IDLE_TIMEOUT_S,
    decompress: bool = True,
) -> aiohttp.ClientSession:
    """A client session with at most ``connections`` connections in all (0: no limit), idle ones closed
    after ``idle_timeout_s``, and no cookie jar (no engine's cookie is ever kept or replayed).

    Create it inside the running event loop; whoever creates it closes it.
    """
    connector = aiohttp.TCPConnector(limit=connections, limit_per_host=0, keepalive_timeout=idle_timeout_s)
    return aiohttp.ClientSession(
        connector=connector, timeout=timeout, auto_decompress=decompress, cookie_jar=aiohttp.DummyCookieJar()
    )


class FetchError(Exception):
    """The GET did not produce a response (connection refused, timeout, oversize body). The message is a
    fixed description, never what the remote sent (a worker's ``last_error`` is shown by the admin API,
    which must not become a banner grabber for any address it is given)."""


@dataclass(frozen=True, slots=True)
class Fetched:
    status: int
    body: bytes


class Fetcher(Protocol):
    async def get(self, url: str, headers: Mapping[str, str], timeout_s: float, max_bytes: int) -> Fetched:
        """GET ``url``; raise ``FetchError`` when no complete response of at most ``max_bytes`` came back."""
        ...


class AiohttpFetcher:
    """``Fetcher`` over one client session, created on first use (inside the running loop). Each ``get`` is
    bounded by its own ``timeout_s``."""

    def __init__(self) -> None:
        self._session: aiohttp.ClientSession | None = None

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = client_session(aiohttp.ClientTimeout(total=None))
        return self._session

    async def get(self, url: str, headers: Mapping[str, str], timeout_s: float, max_bytes: int) -> Fetched:
        try:
            async with asyncio.timeout(timeout_s):
                return await self._get(url, headers, max_bytes)
        except (aiohttp.ClientError, OSError, TimeoutError, ValueError) as exc:
            raise FetchError(describe(exc)) from None

    async def _get(self, url: str, headers: Mapping[str, str], max_bytes: int) -> Fetched:
        async with self._client().get(url, headers=dict(headers), allow_redirects=False) as resp:
            body = bytearray()
            async for chunk in resp.content.iter_any():
                body += chunk
                if len(body) > max_bytes:
                    raise FetchError(f"response over {max_bytes} bytes")
            return Fetched(resp.status, bytes(body))

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()


def describe(exc: BaseException) -> str:
    """What went wrong, in words that quote nothing the remote sent."""
    if isinstance(exc, TimeoutError | aiohttp.ServerTimeoutError):
        return "timed out"
    if isinstance(exc, aiohttp.ClientConnectorError):
        refused = isinstance(exc.os_error, ConnectionRefusedError)
        return "connection refused" if refused else "cannot connect"
    if isinstance(exc, aiohttp.ServerDisconnectedError):
        return "disconnected without an answer"
    if isinstance(exc, aiohttp.ClientResponseError):
        return "not a valid HTTP response"
    if isinstance(exc, aiohttp.ClientPayloadError):
        return "invalid response body"
    if isinstance(exc, aiohttp.ClientConnectionError | OSError):
        return "connection failed"
    return f"request failed ({type(exc).__name__})"
