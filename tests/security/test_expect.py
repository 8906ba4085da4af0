"""``Expect`` on raw sockets, under both connection handlers (``http_server``: the router's own hands such a
request to aiohttp's). ``100-continue`` is answered only once the request passed its checks (credentials,
declared size): a refused client never uploads its body. Any other value gets a 417 in the OpenAI error
shape that does not quote it."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
import pytest

from support.kits import SecurityKit

KEY = "sk-expect-test-key"
BODY = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]})
SERVERS = ["lean", "aiohttp"]


def head(expect: str, length: int = len(BODY), key: str = KEY) -> bytes:
    lines = [
        "POST /v1/chat/completions HTTP/1.1",
        "Host: router",
        "Content-Type: application/json",
        f"Authorization: Bearer {key}",
        f"Content-Length: {length}",
        f"Expect: {expect}",
    ]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


@pytest.fixture(params=SERVERS)
async def router(request: Any, echo_engine: Any, start_router: Any) -> Any:
    settings = {"http_server": request.param, "auth.api_keys": [KEY], "limits.max_body_bytes": 4096}
    return await start_router(await echo_engine("w"), settings=settings)


async def first_answer(port: int, data: bytes) -> bytes:
    """What the router sends after the head alone (no body sent): up to the end of its first answer."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(data)
        return await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
    finally:
        writer.close()


@pytest.mark.parametrize(
    ("data", "status"),
    [(head("100-continue", key="sk-wrong"), 401), (head("100-continue", length=40 << 20), 413)],
    ids=["bad key", "declared size over the limit"],
)
async def test_a_refused_request_gets_its_refusal_not_a_100_continue(
    router: Any, data: bytes, status: int
) -> None:
    answer = await first_answer(router.port, data)
    assert SecurityKit.status_of(answer) == status, answer


async def continued(port: int, data: bytes, body: bytes) -> tuple[bytes, bytes]:
    """The head alone, then the body once an interim answer came: that answer's head and the final one's."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(data)
        interim = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
        writer.write(body)
        return interim, await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
    finally:
        writer.close()


async def test_an_accepted_request_gets_100_continue_then_its_answer(router: Any) -> None:
    interim, final = await continued(router.port, head("100-continue"), BODY)
    assert interim == b"HTTP/1.1 100 Continue\r\n\r\n"
    assert SecurityKit.status_of(final) == 200


async def test_another_expectation_gets_an_openai_417_without_the_value(router: Any) -> None:
    response = await SecurityKit.raw(router.port, head("<script>x-files</script>") + BODY)
    assert SecurityKit.status_of(response) == 417, response[:200]
    error = SecurityKit.openai_error(response.split(b"\r\n\r\n", 1)[1])
    assert error["code"] == "expectation_failed" and b"x-files" not in response


ADMIN_TOKEN = "admin-expect-test-token"
WORKER = orjson.dumps({"url": "http://127.0.0.1:9", "name": "added"})


def admin_head(token: str) -> bytes:
    lines = [
        "POST /admin/workers HTTP/1.1",
        "Host: router",
        "Content-Type: application/json",
        f"Authorization: Bearer {token}",
        f"Content-Length: {len(WORKER)}",
        "Expect: 100-continue",
    ]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


@pytest.fixture
async def admin_router(echo_engine: Any, start_router: Any) -> Any:
    return await start_router(await echo_engine("w"), settings={"auth.admin_token": ADMIN_TOKEN})


async def test_the_admin_api_refuses_a_wrong_token_before_any_100_continue(admin_router: Any) -> None:
    answer = await first_answer(admin_router.port, admin_head("wrong-token"))
    assert SecurityKit.status_of(answer) == 401, answer


async def test_the_admin_api_sends_100_continue_once_the_token_passed(admin_router: Any) -> None:
    interim, final = await continued(admin_router.port, admin_head(ADMIN_TOKEN), WORKER)
    assert interim == b"HTTP/1.1 100 Continue\r\n\r\n"
    assert SecurityKit.status_of(final) in {200, 201}, final
