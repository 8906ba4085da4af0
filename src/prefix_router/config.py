"""Configuration of ``prefix-router serve``: workers, routing knobs and proxy settings.

Three sources, later ones winning: a YAML file, environment variables, command-line flags.
Environment variables are named ``PREFIX_ROUTER_<KEY>``, nested keys joined by ``__``, values read as YAML
scalars: ``PREFIX_ROUTER_PORT=9000``, ``PREFIX_ROUTER_ROUTING__POLICY=random``,
``PREFIX_ROUTER_WORKERS=http://a:8000,http://b:8000``. Everything is validated at start-up; a bad value
raises ``ConfigError`` with a one-line message naming the key.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import pydantic
import yaml
from pydantic import Field, SecretStr, field_validator

from prefix_router.pool.settings import (
    DiscoverySettings,
    HealthConfig,
    ScrapeConfig,
    WorkerConfig,
)
from prefix_router.routing.config import RoutingConfig
from prefix_router.routing.policies import POLICY_NAMES
from prefix_router.settings import ConfigError, Section, split_list

ENV_PREFIX = "PREFIX_ROUTER_"
# routing knobs that must be strictly positive (the others only non-negative)
_POSITIVE_KNOBS = frozenset(
    {
        "block_chars",
        "chars_per_token",
        "block_tokens",
        "worker_capacity_tokens",
        "max_total_blocks",
        "ttl_s",
        "hash_prefix_chars",
        "load_factor",
        "max_tracked_requests",
        "max_sessions",
        "engine_load_stale_s",
        "max_prefix_chars",
        "max_prefix_blocks",
    }
)


class TimeoutConfig(Section):
    """Upstream timeouts per phase, in seconds. A non-streamed answer arrives whole, so ``first_byte_s``
    bounds its whole generation; streams are bounded by ``total_s``."""

    connect_s: float = Field(default=3.0, gt=0)
    first_byte_s: float = Field(default=300.0, gt=0)
    total_s: float = Field(default=1800.0, gt=0)
    shutdown_s: float = Field(default=30.0, ge=0)  # on SIGTERM: in-flight requests get this long
    # client side: a request head must arrive within client_header_s of the connection opening (or of the
    # previous response: the keep-alive idle limit), and its body within client_body_s (else 408)
    client_header_s: float = Field(default=60.0, gt=0)
    client_body_s: float = Field(default=60.0, gt=0)


class RetryConfig(Section):
    """Attempts per request (the first included) before any byte reached the client."""

    max_attempts: int = Field(default=3, ge=1, le=16)


class LimitsConfig(Section):
    """Caps that keep every queue and table bounded."""

    max_body_bytes: int = Field(default=32 * 1024 * 1024, gt=0)
    max_in_flight: int = Field(default=4096, ge=1)
    max_in_flight_per_worker: int = Field(default=1024, ge=1)
    max_workers: int = Field(default=256, ge=1)
    max_models_per_worker: int = Field(default=1024, ge=1)
    max_response_buffer_bytes: int = Field(default=16 * 1024 * 1024, gt=0)
    max_generated_chars: int = Field(default=256 * 1024, ge=0)
    max_sse_line_bytes: int = Field(default=1024 * 1024, gt=0)
    max_idle_connections: int = Field(
        default=256, ge=1
    )  # upstream client: idle keep-alive connections per worker
    retry_after_s: int = Field(default=1, ge=0)
    # bodies larger than this are parsed (JSON, routing key) in a worker thread: a 7 MB prompt of a million
    # token ids takes about half a second, which would otherwise stall every request on the event loop
    parse_in_thread_bytes: int = Field(default=1024 * 1024, ge=0)


class AuthConfig(Section):
    """Admin token (admin API off without it) and optional client API keys."""

    admin_token: SecretStr | None = None
    api_keys: list[SecretStr] = Field(default_factory=list, max_length=100_000)
    forward_client_auth: bool = False

    _split_keys = field_validator("api_keys", mode="before")(split_list)

    @field_validator("admin_token")
    @classmethod
    def _check_token(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None and len(value.get_secret_value()) < 8:
            raise ValueError("admin token must have at least 8 characters")
        return value


class RecordConfig(Section):
    """``--record FILE``: one Mooncake-format line per request, hashes only."""

    file: str | None = None
    block_tokens: int = Field(default=512, gt=0)
    max_bytes: int = Field(default=1024 * 1024 * 1024, gt=0)
    queue_size: int = Field(default=10_000, gt=0)
    salt: int | None = Field(default=None, ge=0)


class StateSettings(Section):
    """Shared prefix state between router replicas through Redis (``serve --state URL``); off without url."""

    url: str | None = None
    replica_id: str | None = None  # default: HOSTNAME (the pod name under Kubernetes)
    key_prefix: str = Field(default="prefix-router", min_length=1, max_length=128)
    stream_maxlen: int = Field(default=50_000, gt=0)
    outbox_capacity: int = Field(default=50_000, gt=0)
    load_interval_s: float = Field(default=0.5, gt=0)
    load_ttl_s: float = Field(default=5.0, gt=0)
    warmup_timeout_s: float = Field(default=10.0, gt=0)

    @field_validator("url")
    @classmethod
    def _check_url(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith(("redis://", "rediss://", "unix://")):
            raise ValueError("expected redis://HOST:PORT/DB")
        return value


class Config(Section):
    """Everything ``prefix-router serve`` needs."""

    host: str = "127.0.0.1"
    port: int = Field(default=8000, ge=0, le=65535)
    workers: list[WorkerConfig] = Field(default_factory=list)
    routing: RoutingConfig = Field(default_factory=RoutingConfig)
    timeouts: TimeoutConfig = Field(default_factory=TimeoutConfig)
    retries: RetryConfig = Field(default_factory=RetryConfig)
    health: HealthConfig = Field(default_factory=HealthConfig)
    scrape: ScrapeConfig = Field(default_factory=ScrapeConfig)
    limits: LimitsConfig = Field(default_factory=LimitsConfig)
    auth: AuthConfig = Field(default_factory=AuthConfig)
    record: RecordConfig = Field(default_factory=RecordConfig)
    state: StateSettings = Field(default_factory=StateSettings)
    discovery: DiscoverySettings = Field(default_factory=DiscoverySettings)
    session_header: str = Field(default="x-session-id", min_length=1, max_length=128)
    event_loop: Literal["auto", "uvloop", "asyncio"] = "auto"
    processes: int = Field(default=0, ge=0, le=256)  # serving processes on the port; 0: one per core
    log_level: Literal["debug", "info", "warning", "error"] = "info"

    @field_validator("workers", mode="before")
    @classmethod
    def _workers_from_urls(cls, value: Any) -> Any:
        value = split_list(value)
        if isinstance(value, list):
            return [{"url": w} if isinstance(w, str) else w for w in value]
        return value

    @field_validator("routing", mode="before")
    @classmethod
    def _check_routing(cls, value: Any) -> Any:
        if isinstance(value, Mapping):
            _check_routing_knobs(value)
        return value

    @field_validator("workers")
    @classmethod
    def _unique_names(cls, value: list[WorkerConfig]) -> list[WorkerConfig]:
        names = [w.resolved_name() for w in value]
        dup = next((n for n in names if names.count(n) > 1), None)
        if dup is not None:
            raise ValueError(f"duplicate worker name {dup!r}")
        return value


def _check_routing_knobs(knobs: Mapping[str, Any]) -> None:
    fields = {f.name for f in dataclasses.fields(RoutingConfig)}
    policy = knobs.get("policy")
    if policy is not None and policy not in POLICY_NAMES:
        raise ValueError(f"policy: unknown policy {policy!r} (one of {', '.join(POLICY_NAMES)})")
    for key, value in knobs.items():
        if key not in fields:
            raise ValueError(f"unknown routing knob {key!r}")
        if isinstance(value, bool) or not isinstance(value, int | float):
            continue
        if value < 0 or (value == 0 and key in _POSITIVE_KNOBS):
            raise ValueError(f"{key}: must be {'> 0' if key in _POSITIVE_KNOBS else '>= 0'}")


# ---------------------------------------------------------------------------------------------- loading


def load_config(
    path: str | Path | None = None,
    env: Mapping[str, str] | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> Config:
    """Merge the YAML file, then ``PREFIX_ROUTER_*`` variables of ``env``, then ``overrides``.

    ``overrides`` maps dotted keys (``routing.policy``) to values (the CLI flags).
    """
    data = read_yaml(path) if path is not None else {}
    for key, value in env_overrides(env or {}).items():
        set_dotted(data, key, value)
    for key, value in (overrides or {}).items():
        set_dotted(data, key, value)
    return validate(data)


def read_yaml(path: str | Path) -> dict[str, Any]:
    try:
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"config file {path}: {exc.strerror or exc}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"config file {path}: invalid YAML: {str(exc).splitlines()[0]}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path}: the top level must be a mapping")
    return data


def env_overrides(env: Mapping[str, str]) -> dict[str, Any]:
    """``PREFIX_ROUTER_A__B=v`` -> ``{"a.b": yaml_scalar(v)}``."""
    out: dict[str, Any] = {}
    for name, raw in env.items():
        if name.startswith(ENV_PREFIX) and len(name) > len(ENV_PREFIX):
            key = ".".join(name[len(ENV_PREFIX) :].lower().split("__"))
            out[key] = parse_scalar(raw)
    return out


def parse_scalar(raw: str) -> Any:
    """A YAML scalar (``8000`` -> int, ``true`` -> bool); anything else stays the string."""
    try:
        value = yaml.safe_load(raw)
    except yaml.YAMLError:
        return raw
    return value if isinstance(value, str | int | float | bool | list) else raw


def set_dotted(data: dict[str, Any], key: str, value: Any) -> None:
    parts = key.split(".")
    node = data
    for part in parts[:-1]:
        child = node.get(part)
        if not isinstance(child, dict):
            child = {}
            node[part] = child
        node = child
    node[parts[-1]] = value


def validate(data: Mapping[str, Any]) -> Config:
    try:
        return Config.model_validate(data)
    except pydantic.ValidationError as exc:
        raise ConfigError(describe(exc)) from None


def describe(exc: pydantic.ValidationError) -> str:
    """One line naming the first bad key, e.g. ``routing.block_chars: must be > 0``."""
    err = exc.errors()[0]
    key = ".".join(str(p) for p in err["loc"]) or "<top level>"
    msg = str(err["msg"]).removeprefix("Value error, ")
    more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
    return f"invalid config: {key}: {msg}{more}"
