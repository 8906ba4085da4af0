"""benchmarks/floor_servers/extproc_floor.py, ``benchmarks/epp.py``'s grpc.aio floor: behind a real Envoy
(the bootstrap ``envoy+epp`` uses) it carries plain, streamed and large requests to its one destination
intact, so that what it costs per request is a floor for a picker doing the same exchange."""

from __future__ import annotations

import socket
import sys
from pathlib import Path
from typing import Any

import orjson
from openai import AsyncOpenAI

from prefix_router.lab.bench.overhead import processes
from prefix_router.lab.launch.envoy import start_envoy_on_free_ports
from support.net import free_port
from support.waiting import wait_until

FLOOR = Path(__file__).resolve().parents[3] / "benchmarks" / "floor_servers" / "extproc_floor.py"


def listening(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
    except OSError:
        return False
    return True


async def test_the_floor_carries_requests_through_envoy_intact(fake_engine: Any, tmp_path: Path) -> None:
    engine = await fake_engine("a", reply="one two three", chunks=3)
    with processes() as spawn:
        port = free_port()
        spawn([sys.executable, str(FLOOR), "--port", str(port), "--destination", engine.url[7:]], None)
        await wait_until(lambda: listening(port), timeout_s=30)
        envoy = await start_envoy_on_free_ports(tmp_path, port)
        api = AsyncOpenAI(base_url=envoy.url + "/v1", api_key="none", max_retries=0, timeout=30.0)
        try:
            for text in ("hi", "".join(f"token{i} " for i in range(90_000))):  # ~650 KB: many chunks
                messages: Any = [{"role": "user", "content": text}]
                answer = await api.chat.completions.create(model="m", messages=messages)
                assert answer.choices[0].message.content == "one two three"
                assert orjson.loads(engine.generations[-1].body)["messages"] == messages
                stream = await api.chat.completions.create(model="m", messages=messages, stream=True)
                pieces = [c.choices[0].delta.content or "" async for c in stream if c.choices]
                assert len(pieces) == 3 and "".join(pieces) == "one two three"
            assert len(engine.generations) == 4
        finally:
            await api.close()
            await envoy.stop()
