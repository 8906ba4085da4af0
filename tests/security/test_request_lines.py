"""Request lines and ``Host`` on raw sockets, under both connection handlers (``http_server``): an HTTP/1.1
request without exactly one ``Host`` is refused (400); a request line of another HTTP version than 1.0 and
1.1 is never answered in HTTP/1.1 syntax as if it were one: 505 for ``HTTP/2.0`` and later, a close without a
word for ``HTTP/0.9`` (whose answers have no head)."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from support.kits import SecurityKit

BODY = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]})
SERVERS = ["lean", "aiohttp"]


def request(hosts: list[str], line: str = "POST /v1/chat/completions HTTP/1.1") -> bytes:
    lines = [line, *(f"Host: {host}" for host in hosts), "Content-Type: application/json"]
    lines.append(f"Content-Length: {len(BODY)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + BODY


@pytest.fixture(params=SERVERS)
def server(request: Any) -> str:
    return str(request.param)


@pytest.mark.parametrize("hosts", [[], ["router", "other"]], ids=["no Host", "two Hosts"])
async def test_an_http11_request_without_one_host_is_refused(
    echo_engine: Any, start_router: Any, hosts: list[str], server: str
) -> None:
    engine = await echo_engine("w")
    router = await start_router(engine, settings={"http_server": server})
    response = await SecurityKit.raw(router.port, request(hosts), timeout_s=5)
    assert SecurityKit.status_of(response) == 400, response[:200]
    assert not engine.seen
    good = await SecurityKit.raw(router.port, request(["router"]).replace(b"HTTP/1.1", b"HTTP/1.0"))
    assert SecurityKit.status_of(good) == 200


@pytest.mark.parametrize("version", ["HTTP/2.0", "HTTP/3.0", "HTTP/0.9"])
async def test_a_request_line_of_another_version_than_1x_gets_505(
    echo_engine: Any, start_router: Any, version: str, server: str
) -> None:
    engine = await echo_engine("w")
    router = await start_router(engine, settings={"http_server": server})
    line = f"POST /v1/chat/completions {version}"
    response = await SecurityKit.raw(router.port, request(["router"], line), timeout_s=5)
    assert SecurityKit.status_of(response) == 505 and response.startswith(b"HTTP/1."), response[:200]
    assert SecurityKit.openai_error(response.split(b"\r\n\r\n", 1)[1])["code"] == "http_version_not_supported"
    assert not engine.seen


async def test_an_http09_request_line_is_closed_without_an_answer(
    echo_engine: Any, start_router: Any, server: str
) -> None:
    engine = await echo_engine("w")
    router = await start_router(engine, settings={"http_server": server})
    response = await SecurityKit.raw(router.port, b"GET /v1/models\r\n", timeout_s=5)
    assert response == b"<cut>", response[:200]
