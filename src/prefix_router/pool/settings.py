"""Settings of the worker pool: the workers, health probes, metrics scraping and worker discovery."""

from __future__ import annotations

import ipaddress
import posixpath
import re
import socket
from typing import Any, Literal
from urllib.parse import urlsplit

from pydantic import Field, SecretStr, field_validator, model_validator

from prefix_router.pool.engines.registry import ENGINE_NAMES, normalize
from prefix_router.routing import Role
from prefix_router.settings import Section, header_secret, split_list

_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:\-]{0,63}$")
# what inet_aton reads as an IPv4 address: one to four parts, decimal, octal or hex (127.1, 0x7f.1)
_IPV4_SHORTHAND = re.compile(r"(0x[0-9a-f]+|[0-9]+)(\.(0x[0-9a-f]+|[0-9]+)){0,3}")
_DOT = re.compile("%2e", re.IGNORECASE)
_HOST_RE = re.compile(r"^[A-Za-z0-9_]([A-Za-z0-9_.\-]{0,252})$|^[0-9a-fA-F:.]+$")


class WorkerTraits(Section):
    """What a worker is beyond its address: the fields a ``workers:`` entry and every discovered worker
    share."""

    weight: float = Field(default=1.0, gt=0, le=1000)
    models: list[str] = Field(default_factory=list, max_length=1024)
    engine: str = "auto"
    api_key: SecretStr | None = None
    capacity_tokens: int | None = Field(default=None, gt=0)
    # prefill/decode disaggregation (docs/disaggregation.md): the stages it takes; ``both``: colocated
    role: Role = "both"
    # a prefill worker's SGLang bootstrap server (flow sglang_bootstrap; None: SGLang's default, 8998)
    bootstrap_port: int | None = Field(default=None, ge=1, le=65535)

    _split_models = field_validator("models", mode="before")(split_list)

    @field_validator("api_key")
    @classmethod
    def _check_key(cls, value: SecretStr | None) -> SecretStr | None:
        return None if value is None else header_secret(value)

    @field_validator("engine")
    @classmethod
    def _check_engine(cls, value: str) -> str:
        if value == "auto":
            return value
        if normalize(value) not in ENGINE_NAMES:
            raise ValueError(f"unknown engine {value!r} (auto, {', '.join(ENGINE_NAMES)})")
        return normalize(value)


class KvEventsSettings(Section):
    """``workers[].kv_events``: where the worker's engine publishes its KV cache events (ZMQ PUB) and the
    router subscribes (``pool/kv_events.py``; key mode ``events``, ``routing/precise.py``).

    ``bind``: the router binds ``endpoint`` and the engine connects (vLLM's publisher connects to a
    non-wildcard tcp endpoint), on one address (a wildcard host is refused: anyone who reaches the port
    can publish); false: the router connects to the engine's bound socket. ``replay_endpoint``:
    the engine's ROUTER socket (vLLM's ``replay_endpoint``) asked for the batches a gap skipped; None: a
    gap leaves the worker's view stale for a while (``PreciseTuning.stale_hold_s``). ``model``: the name
    requests use for the engine's base model (default: the worker's first configured or listed model).
    ``hwm``: messages queued in the socket at most (then ZMQ drops, seen as a gap). ``max_message_bytes``:
    a larger message is rejected (ZMQ disconnects a peer that sends one). ``max_messages_per_s``: messages
    past this rate (a one-second burst allowed) are shed undecoded and counted, the worker's view left
    stale until a replay repairs it: an engine publishes one message per scheduler step that changed its
    cache (some hundreds a second at most)."""

    endpoint: str
    bind: bool = False
    topic: str = Field(default="", max_length=256)
    replay_endpoint: str | None = None
    model: str | None = Field(default=None, min_length=1, max_length=512)
    hwm: int = Field(default=10_000, gt=0, le=1_000_000)
    replay_timeout_s: float = Field(default=2.0, gt=0)
    max_message_bytes: int = Field(default=16 << 20, gt=0, le=1 << 30)
    max_messages_per_s: float = Field(default=2_000.0, gt=0, le=1_000_000)

    @field_validator("endpoint", "replay_endpoint")
    @classmethod
    def _check_endpoint(cls, value: str | None) -> str | None:
        if value is not None and not re.match(r"^(tcp://[^\s/]+:[0-9*]+|ipc://\S+)$", value):
            raise ValueError("a ZMQ endpoint: tcp://HOST:PORT or ipc://PATH")
        return value

    @model_validator(mode="after")
    def _check_bind(self) -> KvEventsSettings:
        """The router binds a specific address, never every interface: whoever reaches the port can
        publish on it (docs/security.md)."""
        tcp = self.endpoint.startswith("tcp://")
        host = self.endpoint[len("tcp://") :].rsplit(":", 1)[0].strip("[]") if tcp else None
        if self.bind and host in ("*", "0.0.0.0", "::"):
            raise ValueError(
                "kv_events.bind: bind one address (127.0.0.1 for engines on this host, the pod's own "
                "address otherwise), not every interface: anyone who reaches it can publish events"
            )
        return self


class WorkerSettings(WorkerTraits):
    """One engine instance behind the router."""

    url: str
    name: str | None = None
    kv_events: KvEventsSettings | None = None

    @field_validator("url")
    @classmethod
    def _check_url(cls, value: str) -> str:
        return normalize_url(value)

    @field_validator("name")
    @classmethod
    def _check_name(cls, value: str | None) -> str | None:
        if value is not None and not _NAME_RE.match(value):
            raise ValueError("1-64 characters among letters, digits and . _ : -")
        return value

    def resolved_name(self) -> str:
        """The configured name, or host:port of the URL."""
        return self.name or self.url.split("://", 1)[1].split("/", 1)[0]


def workers_from_urls(value: Any) -> Any:
    """A ``workers`` list may be given as URLs (comma-separated in an environment variable)."""
    value = split_list(value)
    if isinstance(value, list):
        return [{"url": w} if isinstance(w, str) else w for w in value]
    return value


def unique_worker_names(workers: list[WorkerSettings]) -> list[WorkerSettings]:
    """Refuses two workers of one name (index entries, metrics and shared state are keyed by it), and one
    engine under two names (its load would be counted twice, apart)."""
    names = [w.resolved_name() for w in workers]
    dup = next((n for n in names if names.count(n) > 1), None)
    if dup is not None:
        raise ValueError(f"duplicate worker name {dup!r}")
    urls = [url_identity(w.url) for w in workers]
    same = next((w for w, u in zip(workers, urls, strict=True) if urls.count(u) > 1), None)
    if same is not None:
        raise ValueError(f"the same URL under two names: {same.url}")
    return workers


def normalize_url(value: str) -> str:
    """``http(s)://host[:port][/base]`` without a trailing slash or ``/v1`` (endpoints are appended).
    The host must be a DNS name, an IPv4 address or a bracketed IPv6 address; the port 1-65535."""
    url = value.strip().rstrip("/")
    scheme, sep, rest = url.partition("://")
    if not sep or scheme not in ("http", "https") or not rest or rest.startswith("/"):
        raise ValueError(f"not an http(s) URL: {value!r}")
    if any(c in url for c in "?#@ \t") or not rest.split("/", 1)[0]:
        raise ValueError(
            f"URL must be http(s)://host[:port][/path] without user, query or fragment: {value!r}"
        )
    problem = _authority_problem(url)
    if problem is not None:
        raise ValueError(f"{problem}: {value!r}")
    return url.removesuffix("/v1")


def _authority_problem(url: str) -> str | None:
    try:
        parts = urlsplit(url)
        port = parts.port  # raises on a port that is not a number in 0-65535
    except ValueError as exc:
        return f"invalid URL ({str(exc).split(' as ', 1)[0]})"
    host = parts.hostname
    if not host:
        return "the URL has no host"
    if port == 0 or (parts.netloc.endswith(":") and port is None):
        return "the port must be 1-65535"
    if parts.netloc.startswith("["):
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            return "not an IPv6 address between the brackets"
    elif not _HOST_RE.match(host) or ":" in host:
        return "not a host name or IPv4 address"
    return None


def url_identity(url: str) -> str:
    """What two worker URLs have in common when they reach the same engine: scheme, host (lower case; an
    IP address in its canonical form, so ``127.1``, ``[0:0:0:0:0:0:0:1]`` and ``[::ffff:127.0.0.1]`` are
    ``127.0.0.1`` and ``[::1]``), port (the scheme's default made explicit) and base path (dot segments,
    even percent-encoded, resolved; without ``/v1``). Names are not resolved: ``localhost`` is not
    ``127.0.0.1``."""
    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    host = canonical_host((parts.hostname or "").lower())
    host = f"[{host}]" if ":" in host else host
    path = posixpath.normpath(_DOT.sub(".", parts.path) or "/").rstrip("/").removesuffix("/v1")
    return f"{parts.scheme}://{host}:{port}{path}"


def canonical_host(host: str) -> str:
    """An IP address's one spelling (IPv4 shorthands such as ``127.1`` as inet_aton reads them, IPv6
    compressed, IPv4-mapped IPv6 as IPv4); a name as it is."""
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        if not _IPV4_SHORTHAND.fullmatch(host):
            return host
        try:
            return socket.inet_ntoa(socket.inet_aton(host))
        except OSError:
            return host
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return str(address.ipv4_mapped)
    return address.compressed


class HealthSettings(Section):
    """Active health probes and identification (the models a worker lists, every ``models_interval_s``)."""

    interval_s: float = Field(default=5.0, gt=0)
    timeout_s: float = Field(default=2.0, gt=0)
    path: str | None = None  # default: the engine adapter's path, else /health; /v1/models as fallback
    fail_threshold: int = Field(default=3, ge=1, le=100)
    success_threshold: int = Field(default=2, ge=1, le=100)
    models_interval_s: float = Field(default=30.0, gt=0)

    @field_validator("path")
    @classmethod
    def _check_path(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith("/"):
            raise ValueError("must start with /")
        return value


class ScrapeSettings(Section):
    """Scraping of the engines' ``/metrics`` for queue depth and KV-cache usage."""

    enabled: bool = True
    interval_s: float = Field(default=2.0, gt=0)
    timeout_s: float = Field(default=1.0, gt=0)
    max_bytes: int = Field(default=4 * 1024 * 1024, gt=0)


class DiscoveredWorkerSettings(WorkerTraits):
    """What every discovered worker gets: the fields of a ``workers:`` entry but url and name (discovered
    workers are named ``host:port``, the same on every replica)."""


_K8S_NAME_RE = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")


class DiscoverySettings(Section):
    """Workers found at run time, added to the static ``workers`` (off without ``kind``).
    ``kubernetes``: the serving endpoints of the EndpointSlices of Service ``service`` in ``namespace``;
    ``inferencepool``: the ready Pods the ``InferencePool`` named ``service`` selects, on its target ports
    (at most ``max_pods`` tracked); ``dns``: every address ``service`` resolves to, on ``port``, every
    ``interval_s``."""

    kind: Literal["kubernetes", "inferencepool", "dns"] | None = None
    service: str | None = None  # the Service (kubernetes), the InferencePool, or the name to resolve (dns)
    namespace: str | None = None  # kubernetes; default: the pod's own namespace, else "default"
    port: int | None = Field(default=None, ge=1, le=65535)  # dns (required)
    port_name: str | None = Field(default=None, min_length=1, max_length=63)  # kubernetes; default: first TCP
    scheme: Literal["http", "https"] = "http"
    interval_s: float = Field(default=10.0, gt=0)  # dns: resolve this often
    timeout_s: float = Field(default=5.0, gt=0)  # dns: one lookup
    in_cluster: bool | None = None  # kubernetes: service account (true), ~/.kube/config (false), either
    watch_timeout_s: int = Field(default=60, ge=1, le=3600)  # kubernetes: server-side watch length
    max_slices: int = Field(default=64, ge=1, le=10_000)  # kubernetes: EndpointSlices tracked
    max_pods: int = Field(default=1024, ge=1, le=100_000)  # inferencepool: Pods tracked
    startup_wait_s: float = Field(default=5.0, ge=0)  # start-up waits this long for the first answer
    worker: DiscoveredWorkerSettings = Field(default_factory=DiscoveredWorkerSettings)

    @model_validator(mode="after")
    def _check_kind(self) -> DiscoverySettings:
        problem = discovery_problem(self)
        if problem is not None:
            raise ValueError(problem)
        return self


def discovery_problem(d: DiscoverySettings) -> str | None:
    """What is wrong with a discovery section, naming the key; None when fine."""
    if d.kind is None:
        return None
    if d.service is None:
        return f"service: required with kind {d.kind}"
    if d.kind == "dns":
        return _dns_problem(d)
    return _kubernetes_problem(d)


def _dns_problem(d: DiscoverySettings) -> str | None:
    if not _HOST_RE.match(d.service or ""):
        return f"service: not a DNS name: {d.service!r}"
    if d.port is None:
        return "port: required with kind dns"
    if d.port_name is not None or d.namespace is not None:
        return "port_name, namespace: only with kind kubernetes (dns: service and port)"
    return None


def _kubernetes_problem(d: DiscoverySettings) -> str | None:
    what = "an InferencePool" if d.kind == "inferencepool" else "a Kubernetes Service"
    if not _K8S_NAME_RE.match(d.service or ""):
        return f"service: not {what} name: {d.service!r}"
    if d.kind == "inferencepool" and d.port_name is not None:
        return "port_name: only with kind kubernetes (an InferencePool names its targetPorts)"
    if d.namespace is not None and not _K8S_NAME_RE.match(d.namespace):
        return f"namespace: not a Kubernetes namespace: {d.namespace!r}"
    if d.port is not None:
        return "port: only with kind dns (kubernetes reads ports from the EndpointSlices: use port_name)"
    return None
