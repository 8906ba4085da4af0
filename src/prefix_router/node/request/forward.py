"""What goes upstream and what comes back: URLs and the headers that cross the router."""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Mapping
from typing import Any
from urllib.parse import unquote

import orjson

from prefix_router.node.request import decoding
from prefix_router.node.request.errors import ProxyError
from prefix_router.pool import Worker
from prefix_router.protocol import MATCH_HEADER, POLICY_HEADER, REQUEST_ID_HEADER, WORKER_HEADER

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
_NOT_UPSTREAM = HOP_BY_HOP | {
    "authorization",
    "accept-encoding",
    "expect",
    "cookie",
    POLICY_HEADER,
    REQUEST_ID_HEADER,  # x-request-id crosses both ways as the request's own id (``node.request.access``)
}
_NOT_DOWNSTREAM = HOP_BY_HOP | {
    "server",
    "date",
    "set-cookie",
    WORKER_HEADER,
    MATCH_HEADER,
    REQUEST_ID_HEADER,
}

# this process's name in the ``Via`` header of what it forwards: a request that comes back with it went round
# a loop (a worker's URL pointing at the router), refused by ``refuse_loops``
HOP = f"prefix-router-{secrets.token_hex(6)}"
VIA = f"1.1 {HOP}"


# engine endpoints outside /v1 that are passed through like any other call (vLLM's and SGLang's)
ROOT_PASSTHROUGH = ("/tokenize", "/detokenize")
_LONG_NUMBER = re.compile(rb"[0-9]{20}").search  # an integer orjson may not read exactly (or digits in text)
_UNSAFE_IN_PATH = re.compile(r"[\x00-\x1f\\]").search  # a control character or a backslash
# paths that pass ``safe_path``'s rules as they are: the generation endpoints' (every routed request's) and
# ``ROOT_PASSTHROUGH``; looked up first, the rules themselves (split, unquote, scan) run for the others
GENERATION_PATHS = ("/v1/chat/completions", "/v1/completions")  # routed by the router itself
SAFE_AS_IS = frozenset({*GENERATION_PATHS, *ROOT_PASSTHROUGH})


def upstream_url(worker: Worker, path_qs: str) -> str:
    """The worker's base URL joined with a path and query that passed ``safe_path``."""
    return worker.url + path_qs


def safe_path(path_qs: str) -> bool:
    """Whether an origin-form path (``request.rel_url``, never the raw request target, which may be an
    absolute URL) can be appended to a worker's URL: it is one of ``ROOT_PASSTHROUGH`` exactly, or it
    starts with ``/v1/`` (so the worker's authority cannot be altered) and has no dot segments or
    backslashes, even percent-encoded (so it cannot climb out of ``/v1/`` on the worker), and it does not
    decode to a generation endpoint (``/v1/chat%2Fcompletions``: the engine would run it as one, past the
    router's routing and the tenant's ``cache_salt``)."""
    return path_qs in SAFE_AS_IS or safe_by_rules(path_qs)


def safe_by_rules(path_qs: str) -> bool:
    """``safe_path``'s rules, applied to ``path_qs`` (which ``SAFE_AS_IS`` all pass)."""
    path = path_qs.split("?", 1)[0]
    if path in ROOT_PASSTHROUGH:
        return True
    if not path.startswith("/v1/"):
        return False
    decoded = unquote(path)
    if _UNSAFE_IN_PATH(decoded):
        return False
    if decoded != path and decoded.rstrip("/") in GENERATION_PATHS:
        return False
    return "." not in decoded or not any(segment in (".", "..") for segment in decoded.split("/"))


def upstream_headers(
    incoming: Mapping[str, str], worker: Worker, forward_auth: bool, request_id: str
) -> dict[str, str]:
    """Client headers minus hop-by-hop ones; the worker's own credentials replace the client's; the
    request's id (``node.request.access``) replaces the client's ``x-request-id``; ``Via`` names this
    router after the hops the client's named (``refuse_loops``)."""
    dropped = hop_by_hop(incoming, _NOT_UPSTREAM)
    encoding = incoming.get("Content-Encoding")
    if decoding.decodes(encoding):  # read decoded (``parse.read_body``): it goes upstream decoded
        dropped = dropped | {"content-encoding"}
    out = {k: v for k, v in incoming.items() if k.lower() not in dropped}
    out["Accept-Encoding"] = "identity"  # bodies cross unchanged and stay readable for accounting
    out["X-Request-Id"] = request_id
    via = incoming.get("Via")
    out["Via"] = f"{via}, {VIA}" if via else VIA
    if worker.api_key is not None:
        out["Authorization"] = f"Bearer {worker.api_key.get_secret_value()}"
    elif forward_auth and "Authorization" in incoming:
        out["Authorization"] = incoming["Authorization"]
    return out


def refuse_loops(headers: Mapping[str, str]) -> None:
    """508 for a request that this router forwarded already (its ``Via`` names ``HOP``): it came back
    through a worker whose URL points at the router, and would go round until the in-flight cap."""
    via = headers.get("Via")
    if via is not None and HOP in via:
        message = "the request came back to the router that forwarded it (a worker's URL points at it)"
        raise ProxyError(508, message, type="server_error", code="loop_detected")


def hop_by_hop(headers: Mapping[str, str], always: frozenset[str]) -> frozenset[str]:
    """The (lower-case) header names not to forward: ``always``, and those that ``Connection`` names (it
    is the same set, not a copy, when there is no ``Connection`` header: the usual case, per request)."""
    value = headers.get("Connection")
    if not value:
        return always
    return always | {token.strip().lower() for token in value.split(",")}


def downstream_headers(
    upstream: Mapping[str, str],
    worker: str | None,
    predicted_tokens: int | None,
    secret: str | None = None,
    request_id: str | None = None,
    base: str | None = None,
) -> list[tuple[str, str]]:
    """The upstream's headers that matter, plus the request's id and the router's decision headers (none
    without ``worker``: ``tenants.decision_headers: false``), as (name, value) pairs for an aiohttp
    response (which makes its own headers object from them). A header echoing the worker's credential
    (``secret``) is dropped; a ``Location`` or ``Content-Location`` that points at the worker (its URL,
    ``base``) is made relative to the router (``local_location``)."""
    dropped = hop_by_hop(upstream, _NOT_DOWNSTREAM)
    if secret:
        kept = [(k, v) for k, v in upstream.items() if k.lower() not in dropped and secret not in v]
    else:
        kept = [(k, v) for k, v in upstream.items() if k.lower() not in dropped]
    if base is not None and ("Location" in upstream or "Content-Location" in upstream):
        kept = relocated(kept, base)
    # the router's own headers are never taken from upstream (``_NOT_DOWNSTREAM``): appended, not replaced
    if request_id is not None:
        kept.append((REQUEST_ID_HEADER, request_id))
    if worker is None:
        return kept
    kept.append((WORKER_HEADER, worker))
    if predicted_tokens is not None:
        kept.append((MATCH_HEADER, str(predicted_tokens)))
    return kept


_LOCATIONS = ("location", "content-location")


def relocated(headers: list[tuple[str, str]], base: str) -> list[tuple[str, str]]:
    """``headers`` with their locations made relative to the router (``local_location``)."""
    out: list[tuple[str, str]] = []
    for name, value in headers:
        if name.lower() in _LOCATIONS:
            local = local_location(value, base)
            if local is None:
                continue
            value = local
        out.append((name, value))
    return out


def local_location(value: str, base: str) -> str | None:
    """``value`` (a ``Location`` of the worker's at ``base``) as the client may see it: under ``base``, its
    path and query from there (relative to the router); elsewhere on the worker's origin (its scheme and
    authority), None (dropped: it names the worker's address); any other value as it is."""
    if value[: len(base)].lower() == base.lower() and value[len(base) : len(base) + 1] in ("", "/", "?"):
        rest = value[len(base) :]
        return rest if rest.startswith("/") else "/" + rest
    scheme, sep, tail = base.partition("://")
    origin = scheme + sep + tail.split("/", 1)[0]
    if value[: len(origin)].lower() == origin.lower() and value[len(origin) : len(origin) + 1] in (
        "",
        "/",
        "?",
    ):
        return None
    return value


def worker_secret(worker: Worker | None) -> str | None:
    return worker.api_key.get_secret_value() if worker is not None and worker.api_key else None


def redact(body: bytes, secret: str | None) -> bytes:
    """A buffered body with the worker's credential blanked out, should the engine echo it."""
    if not secret:
        return body
    token = secret.encode("utf-8", "surrogatepass")
    return body.replace(token, b"[redacted]") if token in body else body


def takes_cache_salt(worker: Worker) -> bool:
    """Whether the worker's engine keys its prefix cache by the request's ``cache_salt`` (vLLM)."""
    engine = worker.adapter.name if worker.adapter is not None else worker.engine
    return engine == "vllm"


def has_long_number(raw: bytes) -> bool:
    """``raw`` holds 20 digits in a row: an integer orjson may not read exactly (or digits in a text)."""
    return _LONG_NUMBER(raw) is not None


def salt_value(body: Mapping[str, Any], salt: str) -> str:
    """The ``cache_salt`` sent upstream: the tenant's ``salt``, then the client's own if it gave one."""
    own = body.get("cache_salt")
    return f"{salt}-{own}" if isinstance(own, str) and own else salt


def salted_body(body: Mapping[str, Any], salt: str, raw: bytes) -> bytes:
    """The body (``body``, parsed from ``raw``) with ``cache_salt`` set to ``salt``, followed by the
    client's own salt if it gave one (so it can still partition its own cache, but never share another
    tenant's). Every other value as the client sent it: a body with a number of 20 digits or more (an
    integer past 64 bits, which ``orjson`` reads as a float) is read again from ``raw`` exactly."""
    value = salt_value(body, salt)
    if _LONG_NUMBER(raw) is None:
        return orjson.dumps({**body, "cache_salt": value})
    exact = json.loads(raw)
    exact["cache_salt"] = value
    return json.dumps(exact, ensure_ascii=False, separators=(",", ":")).encode()


def is_event_stream(headers: Mapping[str, str]) -> bool:
    return headers.get("Content-Type", "").startswith("text/event-stream")
