"""``discovery:`` wired into ``prefix-router serve``: a real router app whose workers come from DNS (the
system resolver, ``localhost``) or from the EndpointSlices of a loopback fake Kubernetes API server, in
front of a real fake engine; plus the CLI flags and the config checks."""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web
from kubernetes.client import Configuration
from yarl import URL

from prefix_router.node.config import load_config
from prefix_router.node.life.server import Running, start
from prefix_router.node.state import STATE
from prefix_router.proxy.run import cli
from prefix_router.proxy.run.app import create_app
from prefix_router.settings import ConfigError
from support.waiting import wait_until

QUIET = {"health.interval_s": 3600, "health.models_interval_s": 3600, "scrape.enabled": False}
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hello"}]}
Serve = Callable[[dict[str, Any]], Awaitable[tuple[web.Application, Running]]]


@pytest.fixture
async def serve() -> AsyncIterator[Serve]:
    """``app, running = await serve({"discovery.kind": ...})``; every router is stopped afterwards."""
    started: list[Running] = []

    async def make(settings: dict[str, Any]) -> tuple[web.Application, Running]:
        app = create_app(load_config(env={}, overrides={**QUIET, **settings}))
        started.append(await start(app, shutdown_timeout=0.2))
        return app, started[-1]

    try:
        yield make
    finally:
        for running in started:
            await running.stop()


def pool_names(app: web.Application) -> list[str]:
    return sorted(w.name for w in app[STATE].pool)


async def chat(router_url: str) -> dict[str, Any]:
    async with (
        aiohttp.ClientSession() as session,
        session.post(router_url + "/v1/chat/completions", json=CHAT) as resp,
    ):
        assert resp.status == 200, await resp.text()
        body: dict[str, Any] = orjson.loads(await resp.read())
        return body


async def get_text(url: str) -> tuple[int, str]:
    async with aiohttp.ClientSession() as session, session.get(url) as resp:
        return resp.status, await resp.text()


def dns_tasks() -> list[asyncio.Task[Any]]:
    return [t for t in asyncio.all_tasks() if t.get_name().startswith("dns-discovery-") and not t.done()]


# ------------------------------------------------------------------------------------------------ DNS


async def test_dns_discovery_of_localhost_serves_requests(fake_engine: Any, serve: Serve) -> None:
    engine = await fake_engine("dns-engine")
    port = URL(engine.url).port
    settings = {"discovery.kind": "dns", "discovery.service": "localhost", "discovery.port": port}
    app, running = await serve({**settings, "discovery.interval_s": 0.05})
    assert f"127.0.0.1:{port}" in pool_names(app)  # start-up waited for the first lookup
    assert len(dns_tasks()) == 1
    body = await chat(running.url)
    assert body["choices"][0]["message"]["content"] == engine.b.reply
    assert len(engine.generations) == 1
    assert (await get_text(running.url + "/ready"))[0] == 200
    _, metrics = await get_text(running.url + "/metrics")
    assert "prefix_router_discovery_workers 1.0" in metrics.splitlines()
    await running.stop()
    assert dns_tasks() == []  # cleanup stopped the lookups


async def test_discovered_and_static_workers_share_the_pool(fake_engine: Any, serve: Serve) -> None:
    found, static = await fake_engine("found"), await fake_engine("static")
    settings = {"discovery.kind": "dns", "discovery.service": "localhost"}
    app, _ = await serve({**settings, "discovery.port": URL(found.url).port, "workers": [static.url]})
    assert pool_names(app) == sorted(
        [f"127.0.0.1:{URL(found.url).port}", f"127.0.0.1:{URL(static.url).port}"]
    )


async def test_discovered_workers_get_the_worker_template(fake_engine: Any, serve: Serve) -> None:
    engine = await fake_engine("tmpl")
    port = URL(engine.url).port
    settings = {"discovery.kind": "dns", "discovery.service": "localhost", "discovery.port": port}
    app, running = await serve(
        {**settings, "discovery.worker.weight": 3.0, "discovery.worker.api_key": "k-123"}
    )
    assert app[STATE].pool.require(f"127.0.0.1:{port}").weight == 3.0
    await chat(running.url)
    assert engine.generations[0].headers.get("Authorization") == "Bearer k-123"


# -------------------------------------------------------------------------------------------- Kubernetes


def slice_item(port: int, version: str) -> dict[str, Any]:
    return {
        "kind": "EndpointSlice",
        "apiVersion": "discovery.k8s.io/v1",
        "metadata": {
            "name": "engines-x7k2p",
            "resourceVersion": version,
            "labels": {"kubernetes.io/service-name": "engines"},
        },
        "addressType": "IPv4",
        "endpoints": [{"addresses": ["127.0.0.1"], "conditions": {"ready": True}}],
        "ports": [{"name": "metrics", "protocol": "TCP", "port": 1}, {"name": "http", "port": port}],
    }


def kubeconfig(path: Path, server: str) -> Path:
    path.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        f"clusters: [{{name: fake, cluster: {{server: '{server}'}}}}]\n"
        "users: [{name: u, user: {token: t0ken}}]\n"
        "contexts: [{name: c, context: {cluster: fake, user: u, namespace: llm}}]\n"
    )
    return path


@pytest.fixture
def kube_default(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Callable[[str], None]:
    """Points ``~/.kube/config`` at a file for one test; the client's default configuration is restored."""
    import kubernetes.config.kube_config as kube_config

    monkeypatch.setattr(Configuration, "_default", None, raising=False)

    def point(server: str) -> None:
        path = kubeconfig(tmp_path / "kubeconfig", server) if server else tmp_path / "missing"
        monkeypatch.setattr(kube_config, "KUBE_CONFIG_DEFAULT_LOCATION", str(path))

    return point


K8S = {
    "discovery.kind": "kubernetes",
    "discovery.service": "engines",
    "discovery.namespace": "llm",
    "discovery.port_name": "http",
    "discovery.in_cluster": False,
    "discovery.watch_timeout_s": 1,
}


async def test_kubernetes_discovery_serves_requests_and_follows_the_slices(
    fake_engine: Any, serve: Serve, api_server: Any, kube_default: Callable[[str], None]
) -> None:
    engine = await fake_engine("k8s-engine")
    port = URL(engine.url).port
    assert port is not None
    kube_default(api_server.url)
    api_server.lists = [
        {"kind": "EndpointSliceList", "metadata": {"resourceVersion": "7"}, "items": [slice_item(port, "7")]}
    ]
    app, running = await serve(K8S)
    assert pool_names(app) == [f"127.0.0.1:{port}"]
    assert api_server.requests[0]["labelSelector"] == "kubernetes.io/service-name=engines"
    assert api_server.requests[0]["namespace"] == "llm"
    assert (await chat(running.url))["choices"][0]["message"]["content"] == engine.b.reply
    deleted = {"type": "DELETED", "object": slice_item(port, "8")}
    api_server.watches.append([orjson.dumps(deleted).decode()])
    await wait_until(lambda: pool_names(app) == [])
    assert (await get_text(running.url + "/ready"))[0] == 503


async def test_kubernetes_without_credentials_is_a_config_error(kube_default: Callable[[str], None]) -> None:
    kube_default("")
    config = load_config(env={}, overrides=K8S)
    with pytest.raises(ConfigError, match=r"^invalid config: discovery.kind: kubernetes: no API credentials"):
        create_app(config)


# ------------------------------------------------------------------------------------------ CLI, config


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    cli.register(parser.add_subparsers(dest="command"))
    return parser.parse_args(["serve", *argv])


def test_serve_accepts_no_static_workers_only_with_discovery(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [n for n in __import__("os").environ if n.startswith("PREFIX_ROUTER_")]:
        monkeypatch.delenv(name)
    with pytest.raises(ConfigError, match="workers: none given"):
        cli.build_config(parse())
    dns = cli.build_config(parse("--discover-dns", "vllm.llm.svc:8000")).discovery
    assert (dns.kind, dns.service, dns.port) == ("dns", "vllm.llm.svc", 8000)
    k8s = cli.build_config(parse("--discover-k8s-service", "llm/vllm")).discovery
    assert (k8s.kind, k8s.service, k8s.namespace) == ("kubernetes", "vllm", "llm")
    assert cli.build_config(parse("--discover-k8s-service", "vllm")).discovery.namespace is None


@pytest.mark.parametrize(
    "argv",
    [
        ("--discover-dns", "vllm"),
        ("--discover-dns", "vllm:http"),
        ("--discover-dns", "a:1", "--discover-k8s-service", "b"),
        ("--discover-k8s-service", "Bad_Name"),
    ],
)
def test_bad_discovery_flags_are_one_line_errors(argv: tuple[str, ...]) -> None:
    with pytest.raises(ConfigError) as info:
        cli.build_config(parse(*argv))
    assert "\n" not in str(info.value) and "discover" in str(info.value)


@pytest.mark.parametrize(
    ("section", "key"),
    [
        ({"kind": "dns", "service": "localhost"}, "port"),
        ({"kind": "dns", "port": 80}, "service"),
        ({"kind": "dns", "service": "a b", "port": 80}, "service"),
        ({"kind": "kubernetes", "service": "vllm", "port": 80}, "port"),
        ({"kind": "kubernetes", "service": "vllm", "namespace": "A"}, "namespace"),
        ({"kind": "consul", "service": "vllm"}, "discovery.kind"),
        ({"kind": "dns", "service": "x", "port": 1, "interval_s": 0}, "discovery.interval_s"),
        ({"kind": "kubernetes", "service": "v", "worker": {"engine": "nope"}}, "discovery.worker.engine"),
        ({"kind": "kubernetes", "service": "v", "colour": "red"}, "discovery.colour"),
    ],
)
def test_bad_discovery_sections_name_the_key(section: dict[str, Any], key: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(env={}, overrides={"discovery": section})
    message = str(info.value)
    assert message.startswith("invalid config: discovery") and key in message and "\n" not in message
