"""The dashboard, its data and the decision feed give away nothing: no prompt text, no client key, no admin
token, no upstream address (the workers here have no configured name, so their default name is their
address: they are shown by a hashed alias), and the login keeps the token out of URLs, cookies and logs;
guessing is limited per address (429) and a signed-out session stays signed out, copies of its cookie
included."""

from __future__ import annotations

import logging
from typing import Any

import aiohttp
import pytest

from prefix_router.node.control.dashboard import LOGIN_FAILURES
from prefix_router.node.telemetry.logs import AUDIT_LOGGER, Fields

ADMIN = "admin-token-dash-sec-9c1f"
KEYS = ["client-key-dash-sec-a7e2", "client-key-dash-sec-b3d4"]
SECRET_TEXT = "the launch code is zebra-quartz-4471"
PATHS = ("/dashboard", "/dashboard/data", "/dashboard/static/dashboard.js", "/dashboard/static/dashboard.css",
         "/admin/decisions?limit=500")  # fmt: skip


async def get(url: str, path: str, headers: dict[str, str] | None = None) -> tuple[int, bytes, Any]:
    async with aiohttp.ClientSession() as http, http.get(url + path, headers=headers) as resp:
        return resp.status, await resp.read(), resp.headers


@pytest.fixture
async def router(start_router: Any, echo_engine: Any) -> Any:
    engines = [await echo_engine(f"e{i}") for i in range(2)]
    handle = await start_router(
        *[e.url for e in engines], settings={"auth.admin_token": ADMIN, "auth.api_keys": KEYS}
    )
    body = {
        "model": "m",
        "max_tokens": 2,
        "messages": [{"role": "user", "content": (SECRET_TEXT + " ") * 40}],
    }
    async with aiohttp.ClientSession() as http:
        for i in range(6):
            headers = {"Authorization": f"Bearer {KEYS[i % 2]}"}
            async with http.post(handle.url + "/v1/chat/completions", json=body, headers=headers) as resp:
                assert resp.status == 200
    handle.engines = engines
    return handle


async def test_nothing_secret_or_upstream_leaks_into_the_page_its_data_or_the_feed(router: Any) -> None:
    secrets = [SECRET_TEXT.encode(), b"zebra-quartz", ADMIN.encode(), *(k.encode() for k in KEYS)]
    for engine in router.engines:
        address = engine.url.split("://", 1)[1]
        secrets += [engine.url.encode(), address.encode(), address.split(":")[1].encode()]  # its port too
    seen = 0
    for path in PATHS:
        status, body, headers = await get(router.url, path, {"Authorization": f"Bearer {ADMIN}"})
        assert status == 200, path
        text = body + str(dict(headers)).encode()
        assert not [s for s in secrets if s in text], path
        seen += len(body)
    status, body, _ = await get(
        router.url, "/admin/decisions?limit=500", {"Authorization": f"Bearer {ADMIN}"}
    )
    assert body.count(b'"worker":"w-') >= 6  # the decisions are there, under hashed worker names
    assert seen > 0


async def test_without_the_admin_token_every_dashboard_path_answers_401(router: Any) -> None:
    for path in PATHS:
        for headers in (
            None,
            {"Authorization": f"Bearer {KEYS[0]}"},
            {"Cookie": "prefix_router_dashboard=x.1.y"},
        ):
            status, body, _ = await get(router.url, path, headers)
            assert status == 401, (path, headers)
            assert b"zebra" not in body and b'"worker"' not in body


async def test_the_dashboard_is_off_without_an_admin_token(start_router: Any, echo_engine: Any) -> None:
    handle = await start_router((await echo_engine()).url)
    for path in PATHS:
        assert (await get(handle.url, path))[0] == 404, path


async def test_the_login_keeps_the_token_out_of_the_cookie_and_the_logs(
    router: Any, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    jar = aiohttp.CookieJar(unsafe=True)  # a cookie for 127.0.0.1
    async with aiohttp.ClientSession(cookie_jar=jar) as http:
        async with http.post(
            router.url + "/dashboard/login", data={"token": ADMIN}, allow_redirects=False
        ) as r:
            assert r.status == 303 and r.headers["Location"] == "/dashboard"
            cookie = r.headers["Set-Cookie"]
        assert ADMIN not in cookie
        assert all(flag in cookie for flag in ("HttpOnly", "SameSite=Strict", "Path=/dashboard"))
        async with http.get(router.url + "/dashboard/data") as r:
            assert r.status == 200  # the session works
        async with http.post(router.url + "/dashboard/logout") as r:
            assert r.status == 200
        async with http.get(router.url + "/dashboard/data") as r:
            assert r.status == 401  # the browser dropped it
        async with http.post(router.url + "/dashboard/login", data={"token": KEYS[0]}) as r:
            assert r.status == 401 and "Set-Cookie" not in r.headers
    assert ADMIN not in caplog.text and KEYS[0] not in caplog.text


async def test_a_forged_or_expired_session_is_refused(router: Any) -> None:
    from prefix_router.node.control.dashboard import session

    token = router.state.admin_token
    good = session.new_session(token)
    body, _, mac = good.rpartition(".")
    ident, _, expiry = body.partition(".")
    forged = [
        f"{ident}.{int(expiry) + 10**6}.{mac}",  # a longer life, same MAC
        f"{'0' * 32}.{expiry}.{mac}",  # another id
        f"{body}.{'0' * 64}",
        session.new_session(token, now=lambda: 0.0),  # expired long ago
    ]
    for value in forged:
        status, _, _ = await get(router.url, "/dashboard/data", {"Cookie": f"{session.COOKIE}={value}"})
        assert status == 401, value
    assert (await get(router.url, "/dashboard/data", {"Cookie": f"{session.COOKIE}={good}"}))[0] == 200


def audited(caplog: pytest.LogCaptureFixture) -> list[dict[str, Any]]:
    return [
        dict(r.msg.fields) for r in caplog.records if r.name == AUDIT_LOGGER and isinstance(r.msg, Fields)
    ]


async def test_guessing_the_token_is_answered_429_after_a_few_failures_and_audited(
    router: Any, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, AUDIT_LOGGER)
    async with aiohttp.ClientSession() as http:
        for i in range(LOGIN_FAILURES):
            async with http.post(router.url + "/dashboard/login", data={"token": f"guess-{i}"}) as r:
                assert r.status == 401, i
        for token in ("guess-again", ADMIN):  # blocked: even the right token is not looked at
            async with http.post(
                router.url + "/dashboard/login", data={"token": token}, allow_redirects=False
            ) as r:
                body = await r.text()
                assert r.status == 429 and "Set-Cookie" not in r.headers, token
                assert 0 < int(r.headers["Retry-After"]) <= 60
                assert "Too many failed sign-ins" in body and ADMIN not in body
        headers = {"Authorization": f"Bearer {ADMIN}"}  # scripts with the bearer token are not blocked
        async with http.get(router.url + "/dashboard/data", headers=headers) as r:
            assert r.status == 200
    actions = [line["audit"] for line in audited(caplog)]
    assert actions.count("admin_refused") >= LOGIN_FAILURES and actions.count("dashboard_login_limited") == 2
    assert ADMIN not in caplog.text


async def test_a_cookie_replayed_after_logout_is_refused(router: Any) -> None:
    jar = aiohttp.CookieJar(unsafe=True)
    async with aiohttp.ClientSession(cookie_jar=jar) as http:
        async with http.post(router.url + "/dashboard/login", data={"token": ADMIN}) as r:
            assert r.status == 200  # the dashboard, after the redirect
        copied = next(c.value for c in jar if c.key == "prefix_router_dashboard")
        replay = {"Cookie": f"prefix_router_dashboard={copied}"}
        assert (await get(router.url, "/dashboard/data", replay))[0] == 200  # the copy works while signed in
        async with http.post(router.url + "/dashboard/logout") as r:
            assert r.status == 200
    for path in PATHS:  # the copy, sent by someone else after the logout
        assert (await get(router.url, path, replay))[0] == 401, path
    assert copied.partition(".")[0] in router.state.revoked
