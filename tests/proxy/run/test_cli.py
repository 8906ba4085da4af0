"""``prefix-router serve`` as a real process: starts, serves the openai client, stops on SIGTERM."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import sys
import time
from typing import Any

import aiohttp
import yaml
from openai import AsyncOpenAI

from prefix_router.lab.workloads.traces import TRACES_ENV
from prefix_router.protocol import WORKER_HEADER


async def wait_ready(url: str, proc: asyncio.subprocess.Process, timeout_s: float = 60.0) -> None:
    """Until ``/ready`` answers 200 (a cold start on a loaded 2-core machine took over 10 s)."""
    deadline = time.monotonic() + timeout_s
    async with aiohttp.ClientSession() as http:
        while time.monotonic() < deadline:
            if proc.returncode is not None:
                raise AssertionError("the router exited early")
            try:
                async with http.get(url + "/ready") as resp:
                    if resp.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.05)
    raise AssertionError("the router did not become ready")


async def run_cli(*args: str, env: dict[str, str] | None = None) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "prefix_router.proxy",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, **(env or {})},
    )


async def test_serve_end_to_end(fake_engine: Any, free_port: Any) -> None:
    engine = await fake_engine("a", reply="served")
    port = free_port()
    proc = await run_cli(
        "serve",
        "--worker",
        f"a={engine.url}",
        "--port",
        str(port),
        "--policy",
        "round_robin",
        env={"PREFIX_ROUTER_HEALTH__INTERVAL_S": "0.5"},
    )
    try:
        url = f"http://127.0.0.1:{port}"
        await wait_ready(url, proc)
        async with AsyncOpenAI(base_url=url + "/v1", api_key="x", max_retries=0) as client:
            raw = await client.chat.completions.with_raw_response.create(
                model="m", messages=[{"role": "user", "content": "hi"}]
            )
            assert raw.parse().choices[0].message.content == "served"
            assert raw.headers[WORKER_HEADER] == "a"
            stream = await client.completions.create(model="m", prompt="x", stream=True)
            assert "".join([c.choices[0].text async for c in stream]) == "served"
    finally:
        proc.send_signal(signal.SIGTERM)
        await asyncio.wait_for(proc.wait(), 20)
    assert proc.returncode == 0


async def test_bad_config_exits_with_one_line_naming_the_key() -> None:
    proc = await run_cli(
        "serve", "--worker", "http://127.0.0.1:9", env={"PREFIX_ROUTER_ROUTING__KEYS__BLOCK_TOKENS": "-5"}
    )
    _, err = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode == 2
    lines = err.decode().strip().splitlines()
    assert len(lines) == 1 and "routing" in lines[0] and "block_tokens" in lines[0]


async def test_a_config_file_that_is_not_utf8_is_one_line_and_exit_2(tmp_path: Any) -> None:
    path = tmp_path / "latin1.yaml"
    path.write_bytes("workers: ['http://127.0.0.1:9']\n# caf\u00e9\n".encode("latin-1"))
    proc = await run_cli("serve", "--config", str(path))
    _, err = await asyncio.wait_for(proc.communicate(), 30)
    lines = err.decode().strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, lines
    assert "not UTF-8" in lines[0] and str(path) in lines[0]


async def test_no_workers_is_refused() -> None:
    proc = await run_cli("serve")
    _, err = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode == 2 and "workers" in err.decode()


async def test_print_config_masks_secrets(tmp_path: Any) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("workers: [{url: 'http://a:1', api_key: up-secret}]\nauth: {admin_token: adm-secret}\n")
    proc = await run_cli(
        "serve",
        "--config",
        str(path),
        "--print-config",
        "--set",
        "routing.policies.prefix.load_factor=2",
        env={"PREFIX_ROUTER_PORT": "9123"},
    )
    out, _ = await asyncio.wait_for(proc.communicate(), 30)
    text = out.decode()
    assert proc.returncode == 0 and "port: 9123" in text and "load_factor: 2" in text
    assert "secret" not in text and "http://a:1" in text


async def test_a_port_in_use_is_one_line_and_a_non_zero_exit(fake_engine: Any) -> None:
    engine = await fake_engine("a")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = await run_cli("serve", "--worker", engine.url, "--port", str(port))
        _, err = await asyncio.wait_for(proc.communicate(), 30)
    lines = err.decode().strip().splitlines()
    assert proc.returncode == 1
    assert lines == [f"prefix-router serve: cannot listen on 127.0.0.1:{port}: address already in use"]
    assert (
        engine.seen == [] and engine.health_checks == 0
    )  # it stopped before starting anything (no probe, no identification)


async def test_print_config_needs_no_workers() -> None:
    proc = await run_cli("serve", "--print-config", "--set", "routing.policy=least_load")
    out, err = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode == 0, err.decode()
    printed = yaml.safe_load(out)
    assert printed["workers"] == [] and printed["routing"]["policy"] == "least_load"


async def test_print_config_with_the_documented_trace_folder_set(tmp_path: Any) -> None:
    """``PREFIX_ROUTER_TRACES`` (the lab's trace folder, docs/benchmarks.md) is not a config key."""
    proc = await run_cli("serve", "--print-config", env={TRACES_ENV: str(tmp_path)})
    out, err = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode == 0, err.decode()
    assert "traces" not in yaml.safe_load(out)


async def test_print_config_still_checks_the_policy_knobs() -> None:
    proc = await run_cli("serve", "--print-config", "--set", "routing.policies.prefix.load_factor=-1")
    _, err = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode == 2 and "load_factor" in err.decode() and "Traceback" not in err.decode()


async def test_kubernetes_discovery_without_the_client_is_one_line(tmp_path: Any) -> None:
    """The image used to lack the ``k8s`` extra: a traceback at start. Now one line saying what to install
    (the client is made unimportable here), and ``--print-config`` does not need it at all."""
    (tmp_path / "kubernetes.py").write_text(
        "raise ModuleNotFoundError(\"No module named 'kubernetes'\", name='kubernetes')\n"
    )
    shim = os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])
    env = {"PYTHONPATH": shim, "KUBERNETES_SERVICE_HOST": ""}
    proc = await run_cli("serve", "--discover-k8s-service", "ns/vllm", env=env)
    _, err = await asyncio.wait_for(proc.communicate(), 30)
    lines = err.decode().strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and "prefix-router[k8s]" in lines[0]
    proc = await run_cli("serve", "--discover-k8s-service", "ns/vllm", "--print-config", env=env)
    out, err = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode == 0 and yaml.safe_load(out)["discovery"]["service"] == "vllm", err.decode()


async def test_serve_starts_among_service_link_variables(fake_engine: Any, free_port: Any) -> None:
    engine = await fake_engine("a")
    port = free_port()
    links = {"PREFIX_ROUTER_PORT": "tcp://10.96.0.12:80", "PREFIX_ROUTER_SERVICE_HOST": "10.96.0.12"}
    links |= {
        "PREFIX_ROUTER_REDIS_PORT_6379_TCP_ADDR": "10.96.0.13",
        "PREFIX_ROUTER_PORT": "tcp://10.0.0.1:80",
    }
    proc = await run_cli("serve", "--worker", engine.url, "--port", str(port), env=links)
    try:
        await wait_ready(f"http://127.0.0.1:{port}", proc)
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = await asyncio.wait_for(proc.communicate(), 20)
    assert proc.returncode == 0, err.decode(errors="replace")[-3000:]  # once 1 under a loaded CI run: why


async def test_a_retired_key_in_a_flag_is_one_line_naming_its_new_key() -> None:
    proc = await run_cli("serve", "--print-config", "--set", "routing.keys.tokenizer_path=/t.json")
    _, err = await asyncio.wait_for(proc.communicate(), 30)
    lines = err.decode().strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, lines
    assert (
        "routing.keys.tokenizer_path" in lines[0] and "routing.keys.tokenizer" in lines[0].split(": ", 2)[2]
    )
