"""Where a worker's engine says it publishes its KV cache events, for workers without ``kv_events``.

SGLang's ``GET /server_info`` (``/get_server_info`` on older releases) is its server arguments as a flat
JSON object: ``kv_events_config`` (null, or the JSON string given to ``--kv-events-config``:
``{"publisher": "zmq", "endpoint": "tcp://*:5557", "topic": ..., "replay_endpoint": ...}``),
``page_size`` (the KV block size), ``dp_size``, ``enable_dp_attention``, ``served_model_name``.
``advertised`` turns it into the worker's ``kv_events``:

- a wildcard endpoint (``tcp://*:PORT``, ``tcp://0.0.0.0:PORT``, ``tcp://[::]:PORT``): the engine binds,
  so the router connects to the worker's own host on that port (``bind: false``); the replay endpoint
  likewise;
- not advertised, another publisher, or an endpoint the router cannot reach from the advert (a host name:
  the engine connects to a router it was told of; ipc: another machine's path): nothing, the reason
  returned for the log;
- several data-parallel ranks (``dp_size`` > 1): each publishes on its own port with its own sequence,
  one subscription per worker cannot follow them: nothing (configure one worker per rank).

The block size is not taken from the advert: the event-fed view checks each event's against
``routing.events.block_tokens`` and routes a worker whose engine differs on the approximate view.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from prefix_router.pool.settings import KvEventsSettings

SERVER_INFO_PATHS = ("/server_info", "/get_server_info")
_WILDCARD = re.compile(r"^tcp://(\*|0\.0\.0\.0|\[::\]|::):([0-9]+)$")


@dataclass(frozen=True, slots=True)
class Advert:
    """What a worker's server info says: its events' settings, or why there are none (``reason``)."""

    settings: KvEventsSettings | None
    reason: str


def advertised(info: dict[str, Any], worker_url: str) -> Advert:
    """The ``kv_events`` a worker at ``worker_url`` advertises in ``info`` (its ``/server_info``)."""
    raw = info.get("kv_events_config")
    if raw is None:
        return Advert(None, "no kv_events_config advertised")
    try:
        config = json.loads(raw) if isinstance(raw, str) else raw
    except ValueError:
        return Advert(None, "kv_events_config is not JSON")
    if not isinstance(config, dict):
        return Advert(None, "kv_events_config is not an object")
    if config.get("publisher", "zmq") != "zmq" or config.get("enable_kv_cache_events") is False:
        return Advert(None, f"publisher {config.get('publisher')!r}: no ZMQ events")
    dp = info.get("dp_size", 1)
    if isinstance(dp, int) and dp > 1:
        return Advert(None, f"dp_size {dp}: one publisher per rank (configure one worker per rank)")
    host = urlsplit(worker_url).hostname
    endpoint = _reachable(config.get("endpoint", "tcp://*:5557"), host)
    if endpoint is None:
        return Advert(
            None, f"endpoint {config.get('endpoint')!r} is not a wildcard the router can connect to"
        )
    replay = config.get("replay_endpoint")
    replay_at = _reachable(replay, host) if isinstance(replay, str) else None
    topic = config.get("topic", "")
    settings = KvEventsSettings(
        endpoint=endpoint,
        bind=False,
        topic=topic if isinstance(topic, str) else "",
        replay_endpoint=replay_at,
    )
    return Advert(settings, f"advertised {config.get('endpoint')!r}")


def _reachable(endpoint: object, host: str | None) -> str | None:
    """A wildcard tcp endpoint as seen from the router: the worker's host, the same port."""
    if not isinstance(endpoint, str) or host is None:
        return None
    found = _WILDCARD.match(endpoint)
    if found is None:
        return None
    shown = f"[{host}]" if ":" in host else host
    return f"tcp://{shown}:{found.group(2)}"
