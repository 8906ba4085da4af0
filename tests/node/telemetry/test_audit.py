"""The audit log of the admin API, over real HTTP: every change (add, remove, drain, undrain a worker),
with its outcome, and every refused call; never a credential."""

from __future__ import annotations

import logging
from typing import Any

import aiohttp
import orjson
import pytest

from prefix_router.node.telemetry.logs import AUDIT_LOGGER, Fields

TOKEN = "admin-secret-token"
WORKER_KEY = "upstream-secret-key"


def audit_lines(caplog: pytest.LogCaptureFixture) -> list[dict[str, Any]]:
    return [
        dict(r.msg.fields) for r in caplog.records if r.name == AUDIT_LOGGER and isinstance(r.msg, Fields)
    ]


async def admin(url: str, method: str, path: str, token: str = TOKEN, body: Any = None) -> int:
    async with aiohttp.ClientSession() as http:
        data = orjson.dumps(body) if body is not None else None
        headers = {"Authorization": f"Bearer {token}"}
        async with http.request(method, url + path, headers=headers, data=data) as resp:
            return resp.status


async def test_admin_changes_are_audited(
    fake_engine: Any, start_router: Any, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, AUDIT_LOGGER)
    a, b = await fake_engine("a"), await fake_engine("b")
    router = await start_router(a, settings={"auth.admin_token": TOKEN})
    url = router.url
    assert (
        await admin(url, "POST", "/admin/workers", body={"url": b.url, "name": "b", "api_key": WORKER_KEY})
        == 201
    )
    assert await admin(url, "POST", "/admin/workers", body={"url": b.url, "name": "b"}) == 409
    assert await admin(url, "POST", "/admin/workers/b/drain") == 200
    assert await admin(url, "POST", "/admin/workers/b/undrain") == 200
    assert await admin(url, "DELETE", "/admin/workers/b") == 200
    assert await admin(url, "DELETE", "/admin/workers/nobody") == 404
    assert await admin(url, "GET", "/admin/workers") == 200  # reading changes nothing: not audited
    assert await admin(url, "DELETE", "/admin/workers/a", token="wrong-token-123") == 401
    lines = audit_lines(caplog)
    assert [(line["audit"], line.get("worker"), line.get("status")) for line in lines] == [
        ("admin_add_worker", "b", 201),
        ("admin_add_worker", "b", 409),
        ("admin_drain_worker", "b", 200),
        ("admin_undrain_worker", "b", 200),
        ("admin_remove_worker", "b", 200),
        ("admin_remove_worker", "nobody", 404),
        ("admin_refused", None, None),
    ]
    assert lines[0]["url"] == b.url and lines[0]["remote"] == "127.0.0.1"
    assert lines[-1]["path"] == "/admin/workers/a" and lines[-1]["method"] == "DELETE"
    assert [r.levelname for r in caplog.records if r.name == AUDIT_LOGGER][-1] == "WARNING"
    assert WORKER_KEY not in caplog.text and TOKEN not in caplog.text
