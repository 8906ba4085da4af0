"""Settings of the proxy: its top-level server fields and its sections (``timeouts``, ``retries``,
``limits``, ``auth``, ``record``), frozen and typed, constraints on the fields."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, SecretStr, field_validator

from prefix_router.protocol import MOONCAKE_BLOCK_TOKENS, SESSION_HEADER
from prefix_router.settings import Section, split_list


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
    # with exact-mode models configured (routing.keys.exact_models), rendering the chat template and
    # tokenizing cost milliseconds for a long prompt: bodies over this are keyed in a worker thread
    exact_parse_in_thread_bytes: int = Field(default=8 * 1024, ge=0)


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
    block_tokens: int = Field(default=MOONCAKE_BLOCK_TOKENS, gt=0)
    max_bytes: int = Field(default=1024 * 1024 * 1024, gt=0)
    queue_size: int = Field(default=10_000, gt=0)
    salt: int | None = Field(default=None, ge=0)


class ServerSettings(Section):
    """The proxy's top-level fields: where it listens, how it runs, the session header it reads."""

    host: str = "127.0.0.1"
    port: int = Field(default=8000, ge=0, le=65535)
    session_header: str = Field(default=SESSION_HEADER, min_length=1, max_length=128)
    event_loop: Literal["auto", "uvloop", "asyncio"] = "auto"
    processes: int = Field(default=0, ge=0, le=256)  # serving processes on the port; 0: one per core
    log_level: Literal["debug", "info", "warning", "error"] = "info"
