"""The endpoint picker's own knobs (``prefix-router epp`` flags); everything else is ``serve``'s config."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

EXT_PROC_SERVICE = "envoy.service.ext_proc.v3.ExternalProcessor"
GRPC_PORT = 9002  # the reference picker's (llm-d) default
BUFFERED_BODIES = 4  # the default body budget, in ``limits.max_body_bytes``


class EppSettings(BaseModel):
    """``grpc_host``/``grpc_port``: where the ext_proc and health services listen. ``fallbacks``: how many
    other endpoints follow the choice in the destination list (least loaded first), which Envoy's
    ``override_host`` policy tries in order on retries (0: the choice alone, what an ``ORIGINAL_DST``
    cluster reads; a list breaks it). ``max_streams``: ext_proc streams served at once (one per request
    in flight through the gateway); one more is refused with ``RESOURCE_EXHAUSTED`` (the gRPC health
    service is outside this cap). ``max_buffered_bytes``: the body bytes (requests being read, responses
    kept to learn from) held across all streams at once (None: ``BUFFERED_BODIES`` x
    ``limits.max_body_bytes``). ``grace_s``: on SIGTERM, how long streams in flight may finish."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    grpc_host: str = "127.0.0.1"
    grpc_port: int = Field(default=GRPC_PORT, ge=0, le=65535)
    fallbacks: int = Field(default=0, ge=0, le=16)
    max_streams: int = Field(default=4096, ge=1, le=1_000_000)
    max_buffered_bytes: int | None = Field(default=None, ge=1)
    grace_s: float = Field(default=10.0, ge=0, le=3600)
