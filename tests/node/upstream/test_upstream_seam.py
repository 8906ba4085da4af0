"""The proxy against an in-memory ``Upstream``: cheap checks of retries, URLs and headers."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson

from prefix_router.node.upstream.seam import UpstreamError, UpstreamRequest
from prefix_router.protocol import POLICY_HEADER, WORKER_HEADER

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hello " * 30}]}


@dataclass
class Canned:
    status: int
    headers: Mapping[str, str]
    chunks: list[bytes]
    released: bool = False
    aborted: bool = False

    async def next_chunk(self) -> bytes:
        return self.chunks.pop(0) if self.chunks else b""

    def release(self) -> None:
        self.released = True

    def abort(self) -> None:
        self.aborted = True


@dataclass
class MemoryUpstream:
    """Workers by URL prefix: an exception to raise, or a canned reply."""

    script: dict[str, UpstreamError | tuple[int, bytes]]
    sent: list[UpstreamRequest] = field(default_factory=list)
    replies: list[Canned] = field(default_factory=list)

    async def send(self, request: UpstreamRequest) -> Canned:
        self.sent.append(request)
        base = next(url for url in self.script if request.url.startswith(url))
        outcome = self.script[base]
        if isinstance(outcome, UpstreamError):
            raise outcome
        status, body = outcome
        reply = Canned(status, {"Content-Type": "application/json"}, [body[:5], body[5:]])
        self.replies.append(reply)
        return reply


def worker(name: str) -> dict[str, Any]:
    return {"url": f"http://{name}.invalid:1", "name": name, "models": ["m"]}


OK_BODY = orjson.dumps({"choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}}]})


async def post(url: str, path: str = "/v1/chat/completions", **kw: Any) -> tuple[int, Any, bytes]:
    async with aiohttp.ClientSession() as http:
        resp = await http.post(url + path, json=CHAT, **kw)
        return resp.status, resp.headers, await resp.read()


async def test_retry_on_connect_failure_then_success(start_router: Any) -> None:
    upstream = MemoryUpstream(
        {"http://a.invalid:1": UpstreamError("connect", "refused"), "http://b.invalid:1": (200, OK_BODY)}
    )
    router = await start_router(worker("a"), worker("b"), upstream=upstream)
    for _ in range(4):
        status, headers, body = await post(router.url, headers={POLICY_HEADER: "round_robin"})
        assert status == 200 and headers[WORKER_HEADER] == "b" and body == OK_BODY
    assert any(r.url.startswith("http://a.invalid") for r in upstream.sent)
    assert all(reply.released and not reply.aborted for reply in upstream.replies)
    assert router.state.pool.total_in_flight() == 0


async def test_5xx_bodies_are_drained_and_the_attempt_released(start_router: Any) -> None:
    upstream = MemoryUpstream({"http://a.invalid:1": (503, b'{"error": "busy"}')})
    router = await start_router(worker("a"), upstream=upstream)
    status, headers, body = await post(router.url)
    assert status == 503 and body == b'{"error": "busy"}' and headers[WORKER_HEADER] == "a"
    assert upstream.replies[0].released
    assert router.state.pool.total_in_flight() == 0


async def test_requests_only_ever_go_to_configured_workers(start_router: Any) -> None:
    upstream = MemoryUpstream({"http://a.invalid:1": (200, OK_BODY)})
    router = await start_router(worker("a"), upstream=upstream)
    tricks = [
        ("/v1/chat/completions", {"Host": "evil.example", "X-Forwarded-Host": "evil.example"}),
        ("/v1//evil.example/x", {}),
        ("/v1/@evil.example/x", {}),
        ("/v1/..%2f..%2fadmin", {}),
    ]
    for path, headers in tricks:
        await post(router.url, path=path, headers=headers)
    assert upstream.sent and all(r.url.startswith("http://a.invalid:1/v1/") for r in upstream.sent)
    assert all("Host" not in r.headers and "host" not in r.headers for r in upstream.sent)


async def test_hop_by_hop_and_router_headers_are_not_forwarded(start_router: Any) -> None:
    upstream = MemoryUpstream({"http://a.invalid:1": (200, OK_BODY)})
    router = await start_router(worker("a"), upstream=upstream)
    headers = {
        "Connection": "keep-alive, x-secret",
        "Proxy-Authorization": "p",
        POLICY_HEADER: "random",
        "X-Trace": "t",
        "Accept-Encoding": "gzip",
        "X-Secret": "s",
    }
    await post(router.url, headers=headers)
    sent = {k.lower(): v for k, v in upstream.sent[0].headers.items()}
    assert "proxy-authorization" not in sent and "connection" not in sent and "x-secret" not in sent
    assert POLICY_HEADER not in sent
    assert sent["x-trace"] == "t" and sent["accept-encoding"] == "identity"


class Broken:
    async def send(self, request: UpstreamRequest) -> Canned:
        raise RuntimeError("a bug")


async def test_an_unexpected_error_is_an_openai_500_and_releases(start_router: Any) -> None:
    router = await start_router(worker("a"), upstream=Broken())
    status, _, body = await post(router.url)
    assert status == 500 and orjson.loads(body)["error"]["code"] == "internal_error"
    assert router.state.pool.total_in_flight() == 0
    status, _, _ = await post(router.url)  # and the router keeps serving
    assert status == 500
