"""SIGHUP on a real ``serve`` process: the configuration file is read again and applied (workers, client
keys, policy knobs, tenant isolation) without dropping a connection; an audit line names what changed, never
a secret; an invalid file (or one that is not UTF-8) changes nothing. A file without client keys reloads
(the merge used to write ``api_keys: []``, which the empty-list check refused: a traceback, nothing
applied); a second client key turns tenant isolation on (it stayed off: the new tenant saw the first
tenant's prompt as cached)."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path
from typing import Any

import aiohttp
import yaml

KEY_ONE, KEY_TWO, ADMIN = "client-key-one-1234", "client-key-two-5678", "admin-token-abcdef"


def write_config(
    path: Path, workers: list[Any], key: str | list[str] | None, load_factor: float, **more: Any
) -> None:
    keys = [key] if isinstance(key, str) else key
    config = {
        "workers": [{"url": w.url, "name": w.name, "models": ["m"]} for w in workers],
        "auth": {"admin_token": ADMIN, **({"api_keys": keys} if keys is not None else {})},
        "routing": {"policies": {"prefix": {"load_factor": load_factor}}},
        **more,
    }
    path.write_text(yaml.safe_dump(config))


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


async def chat(
    http: aiohttp.ClientSession, url: str, key: str, kit: Any, **extra: Any
) -> aiohttp.ClientResponse:
    return await http.post(url + "/v1/chat/completions", json={**kit.CHAT, **extra}, headers=bearer(key))


async def test_sighup_reloads_workers_keys_and_knobs_without_dropping_a_stream(
    recording_engine: Any, serve_process: Any, kit: Any, tmp_path: Path
) -> None:
    a = await recording_engine("a", chunks=40, chunk_delay_s=0.05)  # a 2 s stream
    b = await recording_engine("b")
    config = tmp_path / "router.yaml"
    write_config(config, [a], KEY_ONE, 1.25)
    served = await serve_process("--config", str(config))
    async with aiohttp.ClientSession() as http:
        stream = await chat(http, served.url, KEY_ONE, kit, stream=True)
        assert stream.status == 200 and await stream.content.readany()
        write_config(config, [a, b], KEY_TWO, 2.0, limits={"max_workers": 9})
        served.signal(signal.SIGHUP)
        await kit.wait_until(lambda: bool(served.lines("audit=config_reload ")), 10)
        rest = await stream.read()  # the stream opened before the reload went on to its end
        assert kit.events(rest)[-1] == b"[DONE]"
        assert served.process.returncode is None
        async with await chat(http, served.url, KEY_ONE, kit) as old:
            assert old.status == 401
        async with await chat(http, served.url, KEY_TWO, kit) as new:
            assert new.status == 200
        async with http.get(served.url + "/admin/workers", headers=bearer(ADMIN)) as listed:
            assert {w["name"] for w in (await listed.json())["workers"]} == {"a", "b"}
        async with http.get(served.url + "/admin/routing", headers=bearer(ADMIN)) as routing:
            assert (await routing.json())["policy"] == "prefix"
    line = served.lines("audit=config_reload ")[0]
    assert "routing.policies.prefix.load_factor=1.25->2.0" in line and "auth.api_keys=(changed)" in line
    assert "workers_added=b" in line and "restart_needed=limits.max_workers" in line
    assert KEY_ONE not in served.logs() and KEY_TWO not in served.logs()


async def test_sighup_with_an_invalid_file_changes_nothing(
    recording_engine: Any, serve_process: Any, kit: Any, tmp_path: Path
) -> None:
    a = await recording_engine("a")
    config = tmp_path / "router.yaml"
    write_config(config, [a], KEY_ONE, 1.25)
    served = await serve_process("--config", str(config))
    config.write_text("routing: {policies: {prefix: {load_factor: -1}}}\nauth: {api_keys: [x]}\n")
    served.signal(signal.SIGHUP)
    await kit.wait_until(lambda: bool(served.lines("audit=config_reload_refused")), 10)
    line = served.lines("audit=config_reload_refused")[0]
    assert "load_factor" in line and "WARNING" in line
    async with aiohttp.ClientSession() as http, await chat(http, served.url, KEY_ONE, kit) as resp:
        assert resp.status == 200  # still the old keys, still serving
    served.signal(signal.SIGHUP)  # a second SIGHUP: still alive
    await kit.wait_until(lambda: len(served.lines("audit=config_reload_refused")) == 2, 10)
    assert served.process.returncode is None
    served.signal(signal.SIGTERM)
    assert await asyncio.wait_for(served.process.wait(), 10) == 0


async def test_sighup_reloads_a_file_without_client_keys(
    recording_engine: Any, serve_process: Any, kit: Any, tmp_path: Path
) -> None:
    a = await recording_engine("a")
    config = tmp_path / "router.yaml"
    write_config(config, [a], None, 1.25)
    served = await serve_process("--config", str(config))
    write_config(config, [a], None, 2.0)
    served.signal(signal.SIGHUP)
    await kit.wait_until(lambda: bool(served.lines("audit=config_reload")), 10)
    assert served.lines("audit=config_reload ") and "Traceback" not in served.logs()
    assert "routing.policies.prefix.load_factor=1.25->2.0" in served.lines("audit=config_reload ")[0]


PROMPT = {"messages": [{"role": "user", "content": "the first tenant's long and private prompt " * 40}]}


async def test_a_second_client_key_turns_tenant_isolation_on(
    recording_engine: Any, serve_process: Any, kit: Any, tmp_path: Path
) -> None:
    a = await recording_engine("a")
    config = tmp_path / "router.yaml"
    write_config(config, [a], KEY_ONE, 1.25)
    served = await serve_process("--config", str(config))
    async with aiohttp.ClientSession() as http:
        for _ in range(2):
            async with await chat(http, served.url, KEY_ONE, kit, **PROMPT) as first:
                assert first.status == 200
        assert int(first.headers["x-prefix-router-prefix-match"]) > 0  # one tenant: its own prompt cached
        write_config(config, [a], [KEY_ONE, KEY_TWO], 1.25)
        served.signal(signal.SIGHUP)
        await kit.wait_until(lambda: bool(served.lines("audit=config_reload")), 10)
        async with await chat(http, served.url, KEY_TWO, kit, **PROMPT) as other:
            assert other.status == 200
            assert other.headers["x-prefix-router-prefix-match"] == "0"
    line = served.lines("audit=config_reload ")[0]
    assert "tenants.isolate=False->True" in line and "restart_needed=none" in line


async def test_sighup_with_a_file_that_is_not_utf8_changes_nothing(
    recording_engine: Any, serve_process: Any, kit: Any, tmp_path: Path
) -> None:
    a = await recording_engine("a")
    config = tmp_path / "router.yaml"
    write_config(config, [a], KEY_ONE, 1.25)
    served = await serve_process("--config", str(config))
    config.write_bytes(config.read_bytes() + "# caf\u00e9\n".encode("latin-1"))
    served.signal(signal.SIGHUP)
    await kit.wait_until(lambda: bool(served.lines("audit=config_reload_refused")), 10)
    assert "not UTF-8" in served.lines("audit=config_reload_refused")[0]
    assert "Traceback" not in served.logs() and served.process.returncode is None
