"""What goes upstream and what comes back: URLs and the headers that cross the proxy."""

from __future__ import annotations

from collections.abc import Mapping
from urllib.parse import unquote

from multidict import CIMultiDict

from prefix_router.pool.worker import Worker
from prefix_router.protocol import MATCH_HEADER, POLICY_HEADER, WORKER_HEADER

# never forwarded in either direction (RFC 9110 section 7.6.1, plus what the proxy sets itself)
HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "content-length",
        "host",
    }
)
_NOT_UPSTREAM = HOP_BY_HOP | {"authorization", "accept-encoding", "expect", "cookie", POLICY_HEADER}
_NOT_DOWNSTREAM = HOP_BY_HOP | {"server", "date", "set-cookie", WORKER_HEADER, MATCH_HEADER}


def upstream_url(worker: Worker, path_qs: str) -> str:
    """The worker's base URL joined with a path and query that passed ``safe_path``."""
    return worker.url + path_qs


def safe_path(path_qs: str) -> bool:
    """Whether an origin-form path (``request.rel_url``, never the raw request target, which may be an
    absolute URL) can be appended to a worker's URL: it starts with ``/v1/`` (so the worker's authority
    cannot be altered) and has no dot segments or backslashes, even percent-encoded (so it cannot climb
    out of ``/v1/`` on the worker)."""
    path = path_qs.split("?", 1)[0]
    if not path.startswith("/v1/"):
        return False
    decoded = unquote(path)
    if "\\" in decoded or any(c < " " for c in decoded):
        return False
    return not any(segment in (".", "..") for segment in decoded.split("/"))


def upstream_headers(incoming: Mapping[str, str], worker: Worker, forward_auth: bool) -> dict[str, str]:
    """Client headers minus hop-by-hop ones; the worker's own credentials replace the client's."""
    dropped = _NOT_UPSTREAM | connection_tokens(incoming)
    out = {k: v for k, v in incoming.items() if k.lower() not in dropped}
    out["Accept-Encoding"] = "identity"  # bodies cross unchanged and stay readable for accounting
    if worker.api_key is not None:
        out["Authorization"] = f"Bearer {worker.api_key.get_secret_value()}"
    elif forward_auth and "Authorization" in incoming:
        out["Authorization"] = incoming["Authorization"]
    return out


def connection_tokens(headers: Mapping[str, str]) -> frozenset[str]:
    """Headers named in ``Connection`` are hop-by-hop too."""
    value = headers.get("Connection")
    if not value:
        return frozenset()
    return frozenset(token.strip().lower() for token in value.split(","))


def downstream_headers(
    upstream: Mapping[str, str], worker: str, predicted_tokens: int | None, secret: str | None = None
) -> CIMultiDict[str]:
    """The upstream's headers that matter, plus the router's decision headers. A header echoing the
    worker's credential (``secret``) is dropped."""
    dropped = _NOT_DOWNSTREAM | connection_tokens(upstream)
    out: CIMultiDict[str] = CIMultiDict(
        (k, v) for k, v in upstream.items() if k.lower() not in dropped and not (secret and secret in v)
    )
    out[WORKER_HEADER] = worker
    if predicted_tokens is not None:
        out[MATCH_HEADER] = str(predicted_tokens)
    return out


def worker_secret(worker: Worker | None) -> str | None:
    return worker.api_key.get_secret_value() if worker is not None and worker.api_key else None


def redact(body: bytes, secret: str | None) -> bytes:
    """A buffered body with the worker's credential blanked out, should the engine echo it."""
    if not secret:
        return body
    token = secret.encode("utf-8", "surrogatepass")
    return body.replace(token, b"[redacted]") if token in body else body


def is_event_stream(headers: Mapping[str, str]) -> bool:
    return headers.get("Content-Type", "").startswith("text/event-stream")
