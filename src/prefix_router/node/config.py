"""The one configuration of ``prefix-router serve``: every package's settings composed, and loaded.

Each package owns its settings (``routing.settings``, ``pool.settings``, ``replication.settings``,
``node.settings``); this module only composes them into ``Config`` and reads them from three sources,
later ones winning: a YAML file, environment variables, command-line flags. Environment variables are
named ``PREFIX_ROUTER_<KEY>``, nested keys joined by ``__``, values read as YAML scalars:
``PREFIX_ROUTER_PORT=9000``, ``PREFIX_ROUTER_ROUTING__POLICY=random``,
``PREFIX_ROUTER_ROUTING__POLICIES__PREFIX__LOAD_FACTOR=1.5``,
``PREFIX_ROUTER_WORKERS=http://a:8000,http://b:8000``. Everything is validated at start-up; a bad value
raises ``ConfigError`` with a one-line message naming the key; so does an unknown ``PREFIX_ROUTER_*`` key,
and a key renamed or removed (``prefix_router.settings.RETIRED_KEYS``: the message names the new key).

Kubernetes service links are not configuration: Kubernetes gives every pod variables for every Service of
its namespace (unless the pod says ``enableServiceLinks: false``), named after the Service, and the
Services ``prefix-router`` and ``prefix-router-redis`` make them start with ``PREFIX_ROUTER_``. A variable
is such a link, and is ignored, when its name (after ``PREFIX_ROUTER_``) has no ``__`` and is
``[<SVC>_]SERVICE_HOST``, ``[<SVC>_]SERVICE_PORT[_<PORT NAME>]`` or ``[<SVC>_]PORT_<N>_<TCP|UDP|SCTP>[_PROTO|
_PORT|_ADDR]``, or is ``[<SVC>_]PORT`` with a value ``tcp://ADDRESS:PORT`` (udp, sctp). So
``PREFIX_ROUTER_PORT=tcp://10.96.0.12:80`` is ignored while ``PREFIX_ROUTER_PORT=9000`` sets the port.
The lab's variables (``NOT_CONFIG``: ``PREFIX_ROUTER_TRACES``, the trace folder) are ignored too.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pydantic
from pydantic import Field, field_validator, model_validator

from prefix_router.node.settings import (
    AuthSettings,
    LimitsSettings,
    RecordSettings,
    RetrySettings,
    ServerSettings,
    TenantsSettings,
    TimeoutSettings,
)
from prefix_router.pool import (
    DiscoverySettings,
    HealthSettings,
    ScrapeSettings,
    WorkerSettings,
    unique_worker_names,
    workers_from_urls,
)
from prefix_router.replication import ReplicationSettings
from prefix_router.routing import DisaggregationSettings, RoutingSettings
from prefix_router.settings import ConfigError, describe, parse_scalar, read_yaml, retired_key, set_dotted

ENV_PREFIX = "PREFIX_ROUTER_"
_LINK_NAME = re.compile(
    r"(?:[A-Z0-9_]+_)?(?:SERVICE_HOST|SERVICE_PORT(?:_[A-Z0-9_]+)?|PORT_\d+_(?:TCP|UDP|SCTP)(?:_PROTO|_PORT|_ADDR)?)"
)
_LINK_PORT = re.compile(r"(?:[A-Z0-9_]+_)?PORT")
_LINK_URL = re.compile(r"(?:tcp|udp|sctp)://[^\s/]+:\d+")


class Config(ServerSettings):
    """Everything ``prefix-router serve`` needs: the proxy's top-level fields and one section per package."""

    workers: list[WorkerSettings] = Field(default_factory=list)
    routing: RoutingSettings = Field(default_factory=RoutingSettings)
    timeouts: TimeoutSettings = Field(default_factory=TimeoutSettings)
    retries: RetrySettings = Field(default_factory=RetrySettings)
    health: HealthSettings = Field(default_factory=HealthSettings)
    scrape: ScrapeSettings = Field(default_factory=ScrapeSettings)
    limits: LimitsSettings = Field(default_factory=LimitsSettings)
    auth: AuthSettings = Field(default_factory=AuthSettings)
    tenants: TenantsSettings = Field(default_factory=TenantsSettings)
    record: RecordSettings = Field(default_factory=RecordSettings)
    replication: ReplicationSettings = Field(default_factory=ReplicationSettings)
    discovery: DiscoverySettings = Field(default_factory=DiscoverySettings)
    disaggregation: DisaggregationSettings = Field(default_factory=DisaggregationSettings)

    _workers_from_urls = field_validator("workers", mode="before")(workers_from_urls)
    _unique_names = field_validator("workers")(unique_worker_names)

    @model_validator(mode="after")
    def _isolation(self) -> Config:
        """``tenants.isolate`` unset: on when clients are told apart by more than one key, or their own
        credentials go to the engines; the routing core reads it as ``routing.keys.isolate_tenants``."""
        tenants = self.tenants
        if tenants.isolate is None:
            isolate = len(self.auth.api_keys) > 1 or tenants.forward_client_auth
            tenants = tenants.model_copy(update={"isolate": isolate})
        keys = self.routing.keys.model_copy(update={"isolate_tenants": tenants.isolate})
        # set on this instance (frozen, so past pydantic's guard): an "after" validator's returned copy is
        # dropped when the model is built by ``Config(...)`` rather than ``model_validate``
        object.__setattr__(self, "tenants", tenants)
        object.__setattr__(self, "routing", self.routing.model_copy(update={"keys": keys}))
        return self

    @model_validator(mode="after")
    def _events_mode(self) -> Config:
        """A worker's ``kv_events`` are read in key mode ``events`` only."""
        mode = self.routing.keys.mode
        given = next((i for i, w in enumerate(self.workers) if w.kv_events is not None), None)
        if given is not None and mode != "events":
            raise ValueError(f"workers.{given}.kv_events: needs routing.keys.mode: events (mode is {mode})")
        return self


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


# ``PREFIX_ROUTER_<name>`` variables that belong to the lab, not to ``serve``: TRACES, the trace folder
NOT_CONFIG = frozenset({"TRACES"})


def env_overrides(env: Mapping[str, str]) -> dict[str, Any]:
    """``PREFIX_ROUTER_A__B=v`` -> ``{"a.b": yaml_scalar(v)}``; Kubernetes service links are skipped."""
    out: dict[str, Any] = {}
    for name, raw in env.items():
        if name.startswith(ENV_PREFIX) and len(name) > len(ENV_PREFIX):
            rest = name[len(ENV_PREFIX) :]
            if rest in NOT_CONFIG or service_link(rest, raw):
                continue
            out[".".join(rest.lower().split("__"))] = parse_scalar(raw)
    return out


def service_link(name: str, value: str) -> bool:
    """Whether ``PREFIX_ROUTER_<name>=<value>`` is a Kubernetes service-link variable (module docstring)."""
    if "__" in name:  # configuration keys nest with "__"; Service names never give one
        return False
    if _LINK_NAME.fullmatch(name):
        return True
    return _LINK_PORT.fullmatch(name) is not None and _LINK_URL.fullmatch(value.strip()) is not None


def validate(data: Mapping[str, Any]) -> Config:
    retired = retired_key(data)
    if retired is not None:
        raise ConfigError(f"invalid config: {retired}")
    try:
        return Config.model_validate(data)
    except pydantic.ValidationError as exc:
        raise ConfigError(describe(exc)) from None
