"""Credentials as configured by operators: a worker key read from a secret file (with its trailing
newline), keys that cannot travel in an HTTP header, an empty key list given explicitly. Each is either
made right at load (the newline) or refused with a one-line message naming the key, never its value;
and a worker whose headers cannot be encoded is that worker's failure (retried elsewhere, counted against
its health), never a 500 "internal router error"."""

from __future__ import annotations

import logging
from typing import Any

import aiohttp
import orjson
import pytest
import yaml
from pydantic import SecretStr

from prefix_router.pool.settings import WorkerSettings

WORKER_KEY = "sk-worker-from-a-secret-file-5e1c"


async def test_a_worker_key_with_a_trailing_newline_works(
    echo_engine: Any, serve_process: Any, kit: Any, tmp_path: Any
) -> None:
    engine = await echo_engine("w")
    (tmp_path / "key").write_text(WORKER_KEY + "\n")  # as `kubectl create secret --from-file` leaves it
    key = (tmp_path / "key").read_text()
    config = tmp_path / "router.yaml"
    config.write_text(orjson.dumps({"workers": [{"url": engine.url, "name": "w", "api_key": key}]}).decode())
    router = await serve_process("--config", str(config))
    status, _, body = await kit.post(router.url)
    assert status == 200, body
    assert engine.seen[-1][2]["Authorization"] == f"Bearer {WORKER_KEY}"
    assert WORKER_KEY not in (await router.stop()).decode()


@pytest.mark.parametrize(
    "key", ["sk-in\nside", "sk-in side", "sk-nul\x00", "sk-tab\tkey", "\n", "sk-\x7fdel"], ids=repr
)
async def test_a_key_that_cannot_be_a_header_is_refused_naming_the_field(
    kit: Any, tmp_path: Any, key: str
) -> None:
    config = tmp_path / "router.yaml"
    config.write_text(yaml.safe_dump({"workers": [{"url": "http://127.0.0.1:9", "api_key": key}]}))
    code, err = await kit.refused_config("--config", str(config))
    assert code == 2 and "workers.0.api_key" in err and len(err.strip().splitlines()) == 1
    assert key.strip() not in err or not key.strip()


async def test_client_keys_and_the_admin_token_are_cleaned_the_same_way(
    echo_engine: Any, start_router: Any, kit: Any
) -> None:
    client, admin = "sk-client-key-81f0", "admin-token-3c9a"
    settings = {"auth.api_keys": [client + "\n", "other-key"], "auth.admin_token": admin + "\r\n"}
    router = await start_router(await echo_engine("w"), settings=settings)
    status, _, _ = await kit.post(router.url, headers={"Authorization": f"Bearer {client}"})
    assert status == 200
    async with aiohttp.ClientSession() as http:
        admin_auth = {"Authorization": f"Bearer {admin}"}
        async with http.get(router.url + "/admin/workers", headers=admin_auth) as resp:
            assert resp.status == 200


@pytest.mark.parametrize(
    "how",
    [
        {"env": {"PREFIX_ROUTER_AUTH__API_KEYS": ""}},
        {"env": {"PREFIX_ROUTER_AUTH__API_KEYS": " , "}},
        {"args": ("--set", "auth.api_keys=[]")},
        {"args": ("--set", 'auth.api_keys=[""]')},
    ],
    ids=["empty env", "commas env", "empty list", "empty key"],
)
async def test_an_empty_key_list_given_explicitly_is_refused(kit: Any, how: dict[str, Any]) -> None:
    """``PREFIX_ROUTER_AUTH__API_KEYS=""`` used to turn authentication off without a word."""
    args = ("--worker", "http://127.0.0.1:9", *how.get("args", ()))
    code, err = await kit.refused_config(*args, env=how.get("env"))
    assert code == 2 and "auth.api_keys" in err, err


async def test_a_worker_whose_headers_cannot_be_sent_is_that_workers_failure(
    echo_engine: Any, start_router: Any, kit: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """Defence in depth: a key that slipped past validation (built without it here) makes every request to
    that worker fail before anything is sent: retried on another worker, reported against the worker's
    health, and alone a 502 naming it. Before: a 500 "internal router error", never retried."""
    caplog.set_level(logging.DEBUG)
    good, bad_engine = await echo_engine("good"), await echo_engine("bad")
    router = await start_router(good, settings={"health.fail_threshold": 100})
    broken = WorkerSettings.model_construct(
        url=bad_engine.url, name="bad", weight=1.0, models=[], engine="auto",
        api_key=SecretStr(WORKER_KEY + "\nX-Injected: 1"), capacity_tokens=None,
    )  # fmt: skip
    bad = router.state.pool.add(broken)
    router.state.pool.report(bad, True)  # admitted (its probes carry the same header and would fail)
    for _ in range(4):  # round robin: every other request starts on "bad"
        status, headers, _ = await kit.post(router.url, headers={"x-prefix-router-policy": "round_robin"})
        assert status == 200 and headers["x-prefix-router-worker"] == "good"
    assert bad.health.failures >= 2 and not bad_engine.seen
    router.state.pool.drain("good")
    status, _, body = await kit.post(router.url)
    error = kit.openai_error(body)
    assert status == 502 and error["code"] == "upstream_unavailable" and "bad" in error["message"]
    assert WORKER_KEY not in caplog.text and "Traceback" not in caplog.text
