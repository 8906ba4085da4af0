"""Settings of the proxy: its top-level server fields and its sections (``timeouts``, ``retries``,
``limits``, ``auth``, ``tenants``, ``record``), frozen and typed, constraints on the fields."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, SecretStr, field_validator

from prefix_router.protocol import MOONCAKE_BLOCK_TOKENS
from prefix_router.settings import Section, header_secret, split_list


class TimeoutSettings(Section):
    """Upstream timeouts per phase, in seconds. ``first_byte_s`` is the request's budget for its first
    byte, all attempts together (retries happen within it, so a slow generation is never run again on
    another worker once it used the budget up); a non-streamed answer arrives whole, so it bounds its
    whole generation. A stream is bounded by ``total_s``, and by ``stream_idle_s`` between two chunks."""

    connect_s: float = Field(default=3.0, gt=0)
    first_byte_s: float = Field(default=300.0, gt=0)
    total_s: float = Field(default=1800.0, gt=0)
    stream_idle_s: float = Field(default=120.0, gt=0)
    shutdown_s: float = Field(default=30.0, ge=0)  # on SIGTERM: in-flight requests get this long
    # client side: a request head must arrive within client_header_s of the connection opening (or of the
    # previous response: the keep-alive idle limit), and its body within client_body_s (else 408)
    client_header_s: float = Field(default=60.0, gt=0)
    client_body_s: float = Field(default=60.0, gt=0)


class RetrySettings(Section):
    """Attempts per request (the first included) before any byte reached the client."""

    max_attempts: int = Field(default=3, ge=1, le=16)


class LimitsSettings(Section):
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
    # with chat templates configured (routing.keys.templates), rendering the chat template and
    # tokenizing cost milliseconds for a long prompt: bodies over this are keyed in a worker thread
    template_parse_in_thread_bytes: int = Field(default=8 * 1024, ge=0)


class AuthSettings(Section):
    """Admin token (admin API off without it) and optional client API keys."""

    admin_token: SecretStr | None = None
    api_keys: list[SecretStr] = Field(default_factory=list, max_length=100_000)

    @field_validator("api_keys", mode="before")
    @classmethod
    def _split_keys(cls, value: Any) -> Any:
        """An empty list given explicitly (``PREFIX_ROUTER_AUTH__API_KEYS=""``) would turn authentication
        off without a word: refused. Without client keys, leave the setting out."""
        value = split_list(value)
        if isinstance(value, list) and not value:
            raise ValueError("an empty list would turn client authentication off; leave the setting out")
        return value

    @field_validator("api_keys")
    @classmethod
    def _check_keys(cls, value: list[SecretStr]) -> list[SecretStr]:
        return [header_secret(key) for key in value]

    @field_validator("admin_token")
    @classmethod
    def _check_token(cls, value: SecretStr | None) -> SecretStr | None:
        if value is None:
            return None
        value = header_secret(value)
        if len(value.get_secret_value()) < 8:
            raise ValueError("admin token must have at least 8 characters")
        return value


class TenantsSettings(Section):
    """How far tenants (clients told apart by their bearer token) are kept apart, and what they learn of
    the router's decisions (docs/security.md). ``isolate``: the tenant seeds every routing key's namespace
    (none: decided by the composition root, on with more than one client key or with
    ``forward_client_auth``)."""

    isolate: bool | None = None
    forward_client_auth: bool = False  # the client's Authorization goes to the engines (else dropped)
    decision_headers: bool = True  # x-prefix-router-worker / -prefix-match on every routed answer
    cache_salt: bool = False  # set vLLM's per-request cache_salt per tenant in bodies sent to vLLM workers


class RecordSettings(Section):
    """``--record FILE``: one Mooncake-format line per request, hashes only."""

    file: str | None = None
    block_tokens: int = Field(default=MOONCAKE_BLOCK_TOKENS, gt=0)
    max_bytes: int = Field(default=1024 * 1024 * 1024, gt=0)
    queue_size: int = Field(default=10_000, gt=0)
    salt: int | None = Field(default=None, ge=0)


class ServerSettings(Section):
    """The proxy's top-level fields: where it listens and how it runs."""

    host: str = "127.0.0.1"
    port: int = Field(default=8000, ge=0, le=65535)
    event_loop: Literal["auto", "uvloop", "asyncio"] = "auto"
    # lean: the router's own connection handler serves the generation requests and hands anything else to
    # aiohttp's (proxy/run/lean.py); aiohttp: aiohttp's serves every request
    http_server: Literal["lean", "aiohttp"] = "lean"
    processes: int = Field(default=0, ge=0, le=256)  # serving processes on the port; 0: one per core
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    log_format: Literal["text", "json"] = "text"  # text: key=value lines; json: one JSON object per line
    access_log: bool = True  # one line per /v1/* request (logger prefix_router.access)
    # the router's random tie-breaks start from this seed in every serving process (runs that are to be
    # compared decide alike); None: seeded by the OS
    seed: int | None = Field(default=None, ge=0)
