"""``prefix-router epp`` as a real process behind a real Envoy: it serves, it stops on SIGTERM (exit 0),
and when it is killed the gateway fails closed (503); bad flags are one line and exit 2."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from openai import APIStatusError, AsyncOpenAI

from prefix_router.lab.launch.envoy import start_envoy_on_free_ports
from prefix_router.lab.launch.net import free_port
from support.serving import ServeProcess, wait_serving
from support.waiting import wait_until

MAIN = "import sys; from prefix_router.cli import main; main(sys.argv[1:])"


async def spawn_epp(directory: Path, *args: str) -> tuple[ServeProcess, int]:
    grpc_port, http_port = free_port(), free_port()
    log = directory / "epp.log"
    argv = [sys.executable, "-c", MAIN, "epp", *args, "--grpc-port", str(grpc_port), "--port", str(http_port)]
    with log.open("wb") as sink:
        process = await asyncio.create_subprocess_exec(*argv, stderr=sink, env=dict(os.environ))
    served = ServeProcess(process, f"http://127.0.0.1:{http_port}", log)
    await wait_serving(served, "/ready")
    return served, grpc_port


@pytest.fixture
async def processes() -> AsyncIterator[list[Any]]:
    started: list[Any] = []
    try:
        yield started
    finally:
        for item in reversed(started):
            if isinstance(item, ServeProcess):
                if item.process.returncode is None:
                    item.process.kill()
                await item.process.wait()
            else:
                await item.stop()


async def test_serves_then_the_gateway_fails_closed_when_it_is_killed(
    fake_engine: Any, tmp_path: Path, processes: list[Any]
) -> None:
    engine = await fake_engine("a", reply="through envoy")
    epp, grpc_port = await spawn_epp(tmp_path, "--worker", f"a={engine.url}")
    processes.append(epp)
    envoy = await start_envoy_on_free_ports(tmp_path, grpc_port)
    processes.append(envoy)
    async with AsyncOpenAI(base_url=envoy.url + "/v1", api_key="x", max_retries=0) as client:
        messages = [{"role": "user", "content": "hi"}]
        reply = await client.chat.completions.create(model="m", messages=messages)  # type: ignore[arg-type]
        assert reply.choices[0].message.content == "through envoy"
        assert "event=serving_epp" in epp.logs()
        # the access line: written when the request's ext_proc stream closes, which can come after the
        # client has read the whole answer
        await wait_until(lambda: "worker=a" in epp.logs(), timeout_s=10.0)
        epp.process.send_signal(signal.SIGKILL)
        await epp.process.wait()
        with pytest.raises(APIStatusError) as caught:
            await client.chat.completions.create(model="m", messages=messages)  # type: ignore[arg-type]
        assert caught.value.status_code == 503
    assert len(engine.generations) == 1


async def test_sigterm_stops_it_cleanly(fake_engine: Any, tmp_path: Path, processes: list[Any]) -> None:
    engine = await fake_engine("a")
    epp, _ = await spawn_epp(tmp_path, "--worker", engine.url)
    processes.append(epp)
    epp.process.send_signal(signal.SIGTERM)
    assert await asyncio.wait_for(epp.process.wait(), 20) == 0


def test_bad_flags_are_one_line() -> None:
    done = subprocess.run(
        [sys.executable, "-c", MAIN, "epp", "--worker", "http://127.0.0.1:1", "--fallbacks", "99"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert (
        done.stderr.startswith("prefix-router epp: invalid config: --fallbacks")
        and done.stderr.count("\n") == 1
    )
    nothing = subprocess.run([sys.executable, "-c", MAIN, "epp"], capture_output=True, text=True, timeout=60)
    assert nothing.returncode == 2 and "workers: none given" in nothing.stderr


async def test_sighup_reloads_the_config_file(fake_engine: Any, tmp_path: Path, processes: list[Any]) -> None:
    a = await fake_engine("a")
    b = await fake_engine("b")
    config = tmp_path / "config.yaml"
    config.write_text(f"workers:\n  - {{name: a, url: '{a.url}'}}\n")
    epp, _ = await spawn_epp(tmp_path, "--config", str(config))
    processes.append(epp)
    config.write_text(f"workers:\n  - {{name: a, url: '{a.url}'}}\n  - {{name: b, url: '{b.url}'}}\n")
    epp.process.send_signal(signal.SIGHUP)
    deadline = asyncio.get_running_loop().time() + 10
    while "config_reload" not in epp.logs():
        assert asyncio.get_running_loop().time() < deadline, epp.logs()
        await asyncio.sleep(0.05)
    assert epp.process.returncode is None  # SIGHUP never ends it
    line = next(x for x in epp.logs().splitlines() if "config_reload" in x)
    assert "workers" in line


async def test_a_grpc_port_in_use_is_one_line(fake_engine: Any, tmp_path: Path, processes: list[Any]) -> None:
    engine = await fake_engine("a")
    first, grpc_port = await spawn_epp(tmp_path, "--worker", engine.url)
    processes.append(first)
    argv = [sys.executable, "-c", MAIN, "epp", "--worker", engine.url, "--grpc-port", str(grpc_port)]
    done = subprocess.run([*argv, "--port", str(free_port())], capture_output=True, text=True, timeout=60)
    assert done.returncode == 1, done.stderr
    assert done.stderr.startswith(f"prefix-router epp: cannot listen on 127.0.0.1:{grpc_port}")
    assert done.stderr.count("\n") == 1
