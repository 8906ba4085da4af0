"""``prefix-router top --once`` against a running router: its workers, decisions and prefix map on the
terminal; the token from the environment only; an error said, not a traceback, without one."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import pytest

from prefix_router.cli import build_parser

ADMIN = "admin-token-top-6b0d"


async def top(
    url: str, capsys: pytest.CaptureFixture[str], monkeypatch: Any, token: str | None
) -> tuple[int, str]:
    if token is None:
        monkeypatch.delenv("PREFIX_ROUTER_ADMIN_TOKEN", raising=False)
    else:
        monkeypatch.setenv("PREFIX_ROUTER_ADMIN_TOKEN", token)
    monkeypatch.setenv("COLUMNS", "200")
    args = build_parser().parse_args(["top", "--url", url, "--once"])
    code = await asyncio.to_thread(args.func, args)  # it blocks on its poll: the router serves meanwhile
    return code, capsys.readouterr().out


async def test_top_shows_the_workers_decisions_and_prefixes(
    start_router: Any, fake_engine: Any, capsys: pytest.CaptureFixture[str], monkeypatch: Any
) -> None:
    engines = [await fake_engine("alpha"), await fake_engine("beta")]
    router = await start_router(*engines, settings={"auth.admin_token": ADMIN})
    async with aiohttp.ClientSession() as http:
        for i in range(4):
            body = {
                "model": "m",
                "messages": [{"role": "user", "content": "a shared question " * 40 + str(i)}],
            }
            async with http.post(router.url + "/v1/chat/completions", json=body) as resp:
                assert resp.status == 200
    code, out = await top(router.url, capsys, monkeypatch, ADMIN)
    assert code == 0
    assert "alpha" in out and "beta" in out and "healthy" in out
    assert "last decisions" in out and "prefix_hit" in out and "p-" in out
    assert "4 decisions" in out
    code, out = await top(router.url, capsys, monkeypatch, "wrong")
    assert code == 1 and "HTTP 401" in out
    code, _ = await top(router.url, capsys, monkeypatch, None)
    assert code == 2
