"""The state the router keeps about one engine instance."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pydantic import SecretStr

from prefix_router.pool.engines.base import EngineAdapter
from prefix_router.pool.settings import KvEventsSettings, WorkerSettings


@dataclass(slots=True)
class HealthState:
    """Consecutive probe results and the verdict drawn from them. A new worker is ``pending``: not
    healthy until its first probe passes (it is admitted then, with no success threshold)."""

    healthy: bool = False
    pending: bool = True
    ejections: int = 0
    failures: int = 0
    successes: int = 0
    failed_results: int = 0  # failed probes and requests, ever: the engine's own sign it may have restarted
    last_error: str | None = None

    @property
    def verdict(self) -> str:
        return "pending" if self.pending else "healthy" if self.healthy else "ejected"


@dataclass(slots=True, eq=False)
class Worker:
    """One engine behind the router. ``models`` is None until known (then any model is accepted)."""

    name: str
    url: str
    weight: float = 1.0
    engine: str = "auto"
    api_key: SecretStr | None = None
    capacity_tokens: int | None = None
    role: str = "both"  # prefill | decode | both (``routing/pd.py``)
    bootstrap_port: int | None = None  # a prefill worker's SGLang bootstrap server
    configured_models: frozenset[str] = frozenset()
    listed_models: dict[str, dict[str, Any]] | None = None  # from the worker's ``/v1/models``
    kv_events: KvEventsSettings | None = None  # where its KV cache events come from (precise mode)
    kv_events_advertised: bool = False  # kv_events read from the engine's server info, not configured
    adapter: EngineAdapter | None = None
    health: HealthState = field(default_factory=HealthState)
    health_path: str | None = None
    draining: bool = False
    learned_capacity: int | None = None
    last_scrape_s: float | None = None
    # a failed probe or request, or a broken connection: the engine may have been restarted (with another
    # model); its models are read again at the next probe (``PoolMonitor``), not at the next 30 s refresh
    identity_stale: bool = False

    @classmethod
    def from_config(cls, cfg: WorkerSettings) -> Worker:
        return cls(
            name=cfg.resolved_name(),
            url=cfg.url,
            weight=cfg.weight,
            engine=cfg.engine,
            api_key=cfg.api_key,
            capacity_tokens=cfg.capacity_tokens,
            role=cfg.role,
            bootstrap_port=cfg.bootstrap_port,
            configured_models=frozenset(cfg.models),
            kv_events=cfg.kv_events,
        )

    @property
    def available(self) -> bool:
        """Healthy and accepting new requests."""
        return self.health.healthy and not self.draining

    def serves(self, model: str) -> bool:
        """Configured models win; then the listed ones; a worker with no known list accepts any model."""
        if self.configured_models:
            return model in self.configured_models
        if self.listed_models is not None:
            return model in self.listed_models
        return True

    def model_ids(self) -> list[str]:
        if self.configured_models:
            return sorted(self.configured_models)
        return list(self.listed_models or ())

    def public(self, in_flight: int) -> dict[str, Any]:
        """A JSON-able view for the admin API (``in_flight`` is the routing core's count): never the
        upstream credentials."""
        return {
            "name": self.name,
            "url": self.url,
            "weight": self.weight,
            "role": self.role,
            "engine": self.adapter.name if self.adapter is not None else self.engine,
            "models": self.model_ids(),
            "healthy": self.health.healthy,
            "health": self.health.verdict,
            "draining": self.draining,
            "in_flight": in_flight,
            "consecutive_failures": self.health.failures,
            "last_error": self.health.last_error,
            "has_api_key": self.api_key is not None,
        }
