"""Literals shared across layers: the OpenAI endpoints the router understands, the HTTP headers it speaks
and the Mooncake trace block. A leaf module (imports nothing of the project), so every layer may use it.
"""

from __future__ import annotations

from typing import Literal

Endpoint = Literal["chat", "completions"]
"""The generation endpoints whose bodies are parsed into routing keys (``/v1/chat/completions`` and
``/v1/completions``); every other ``/v1/*`` call is passed through."""

WORKER_HEADER = "x-prefix-router-worker"
"""Response header: the worker that served the request."""

MATCH_HEADER = "x-prefix-router-prefix-match"
"""Response header: the router's predicted cached prefix, in tokens."""

POLICY_HEADER = "x-prefix-router-policy"
"""Request header: route this request with another policy (A/B tests); never forwarded upstream."""

REQUEST_ID_HEADER = "x-request-id"
"""Request and response header: the request's id, taken from the client (when well formed) or made by the
router, sent to the engine and returned to the client; the access log's ``request_id``."""

SESSION_HEADER = "x-session-id"
"""Request header carrying the session id for sticky routing (the default of ``routing.sessions.header``)."""

MOONCAKE_BLOCK_TOKENS = 512
"""Tokens per ``hash_ids`` entry in the Mooncake trace format (traces read and ``--record`` lines written)."""
