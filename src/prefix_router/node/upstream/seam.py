"""The network seam: one ``Upstream.send`` between the router and the engines.

Tests replace it with an in-memory fake; production uses ``HttpUpstream`` (``node.upstream.http_client``).
Responses are read chunk by chunk with ``next_chunk`` (``b""`` at the end) and either ``release``-d (fully
read) or ``abort``-ed (the connection is closed, so the engine sees the disconnect and stops generating).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol


class FailureKind(StrEnum):
    """Why an attempt on a worker failed: the ``kind`` label of ``prefix_router_upstream_errors_total``."""

    CONNECT = "connect"  # no connection: nothing was sent
    TIMEOUT = "timeout"
    IO = "io"  # the connection broke, or what came back is not HTTP
    STATUS = "status"  # the worker answered 5xx


UNENCODABLE = "the request could not be encoded for this worker"  # a header with CR, LF or NUL


class UpstreamError(Exception):
    """The exchange with the worker failed. ``kind``: connect (nothing was sent), timeout or io."""

    def __init__(self, kind: FailureKind, message: str) -> None:
        super().__init__(message)
        self.kind: FailureKind = kind


@dataclass(slots=True)
class UpstreamRequest:
    method: str
    url: str
    headers: Mapping[str, str]
    body: bytes


class UpstreamResponse(Protocol):
    status: int
    headers: Mapping[str, str]

    async def next_chunk(self) -> bytes:
        """The next piece of body as it arrives; ``b""`` at the end. Raises ``UpstreamError``."""
        ...

    def release(self) -> None: ...

    def abort(self) -> None: ...


class Upstream(Protocol):
    async def send(self, request: UpstreamRequest) -> UpstreamResponse:
        """Send the request and return once the status line and headers arrived."""
        ...
