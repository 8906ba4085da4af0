"""SIGHUP: read the configuration again (the file, ``PREFIX_ROUTER_*`` variables and the flags, as at
start-up) and apply what may change while serving, without dropping a connection.

Applied at once: ``workers`` (static workers added, removed, or replaced when their entry changed; requests
running on a removed worker finish there; workers added by the admin API or found by discovery are left
alone), ``auth`` (client keys, admin token), tenant isolation (``tenants.isolate``: explicit, or as a
fresh start would resolve it from the new key count, so adding a second client key turns it on),
``tenants.forward_client_auth``, ``routing.policy`` and ``routing.policies.*`` (a policy whose knobs
changed is rebuilt), ``routing.sessions`` (but ``max_sessions``), the per-request ``timeouts``,
``retries`` and ``limits`` listed in ``RELOADABLE``, and the logging switches. Anything else that changed
(the listen address, the index and key settings, the replication, discovery, health and scrape sections,
the upstream client...) sizes or starts live state: it is named in the audit line as ``restart_needed``
and keeps its old value until the next start.

The configuration is read and parsed in a thread (the event loop keeps serving), then applied on the loop.
An invalid configuration changes nothing: the audit line says why (one line, URLs' user information
masked: ``mask_userinfo``) and the router goes on
with the configuration it has. Every reload writes one audit line (``node.telemetry.audit``) naming the keys
that changed; values are shown except under ``auth`` and for credentials, which are only named.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable
from typing import Any

from pydantic import SecretStr

from prefix_router.node.config import Config
from prefix_router.node.request.auth import Credentials
from prefix_router.node.state import NodeState
from prefix_router.node.telemetry import logs
from prefix_router.node.telemetry.audit import audit
from prefix_router.pool import PoolError, WorkerSettings
from prefix_router.settings import ConfigError, set_dotted

RELOADABLE = (
    "workers",
    "auth",
    "routing.policy",
    "routing.policies",
    "tenants.isolate",
    "tenants.forward_client_auth",
    "routing.sessions.header",
    "routing.sessions.affinity",
    "routing.sessions.load_factor",
    "routing.sessions.load_slack",
    "timeouts.first_byte_s",
    "timeouts.total_s",
    "timeouts.shutdown_s",
    "timeouts.client_body_s",
    "retries",
    "limits.max_in_flight",
    "limits.max_in_flight_per_worker",
    "limits.max_response_buffer_bytes",
    "limits.max_generated_chars",
    "limits.max_sse_line_bytes",
    "limits.retry_after_s",
    "limits.parse_in_thread_bytes",
    "log_level",
    "log_format",
    "access_log",
)
MAX_SHOWN_CHARS = 80


def reloadable(key: str) -> bool:
    return any(key == prefix or key.startswith(prefix + ".") for prefix in RELOADABLE)


def leaves(value: Any, prefix: str = "") -> dict[str, Any]:
    """A dumped config as ``{dotted key: value}`` (lists are values)."""
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for key, item in value.items():
            out.update(leaves(item, f"{prefix}.{key}" if prefix else str(key)))
        return out
    return {prefix: value}


class Plan:
    """What a reload changes: keys applied and not, static workers added, removed and replaced."""

    def __init__(self, old: Config, new: Config) -> None:
        before, after = leaves(_dump(old)), leaves(_dump(new))
        changed = [key for key in after if before.get(key) != after[key]]
        self.applied = [key for key in changed if reloadable(key)]
        self.restart_needed = [key for key in changed if not reloadable(key)]
        self.before, self.after = before, after
        old_workers = {w.resolved_name(): w for w in old.workers}
        new_workers = {w.resolved_name(): w for w in new.workers}
        self.removed = [n for n in old_workers if n not in new_workers]
        self.added = [w for n, w in new_workers.items() if n not in old_workers]
        self.replaced = [w for n, w in new_workers.items() if n in old_workers and old_workers[n] != w]
        self.config = self._merged(old, new)

    def _merged(self, old: Config, new: Config) -> Config:
        data = old.model_dump()
        for key in self.applied:
            set_dotted(data, key, self.after[key])
        data["workers"] = new.model_dump()["workers"]
        if not data["auth"]["api_keys"]:  # no client keys: left out (an explicit empty list is refused)
            del data["auth"]["api_keys"]
        return Config.model_validate(data)

    def changes(self) -> str:
        return ",".join(f"{key}={self._shown(key)}" for key in self.applied) or "none"

    def _shown(self, key: str) -> str:
        old, new = self.before.get(key), self.after[key]
        if key.startswith("auth.") or _secret(old) or _secret(new):
            return "(changed)"
        text = f"{old}->{new}"
        return text if len(text) <= MAX_SHOWN_CHARS else text[:MAX_SHOWN_CHARS] + "..."


def _dump(config: Config) -> dict[str, Any]:
    data = config.model_dump()
    del data["workers"]  # compared by name (Plan)
    return data


def _secret(value: Any) -> bool:
    return isinstance(value, SecretStr) or (isinstance(value, list) and any(_secret(v) for v in value))


async def reload(state: NodeState, load: Callable[[], Config], source: str) -> Plan | None:
    """Load the configuration again (in a thread: a large file is not parsed on the event loop) and apply
    it; returns the plan (None when the new one is invalid)."""
    try:
        plan = Plan(state.config, await asyncio.to_thread(load))
    except ConfigError as exc:
        audit("config_reload_refused", 30, source=source, error=mask_userinfo(str(exc)))
        return None
    failed = apply(state, plan)
    for worker in [*plan.added, *plan.replaced]:
        added = state.pool.get(worker.resolved_name())
        if added is not None:
            await state.monitor.refresh(added)  # identified and probed before it gets traffic
    audit(
        "config_reload",
        source=source,
        changed=plan.changes(),
        workers_added=_names(plan.added),
        workers_removed=",".join(plan.removed) or "none",
        workers_replaced=_names(plan.replaced),
        workers_failed=",".join(failed) or "none",
        restart_needed=",".join(plan.restart_needed) or "none",
    )
    return plan


def apply(state: NodeState, plan: Plan) -> list[str]:
    """Apply ``plan`` to the running router; returns the workers that could not be added (and why)."""
    config = plan.config
    failed = []
    for name in [*plan.removed, *(w.resolved_name() for w in plan.replaced)]:
        if state.pool.get(name) is not None:
            state.pool.remove(name)
            state.metrics.forget_worker(name)
    for worker in [*plan.added, *plan.replaced]:
        try:
            state.pool.add(worker)
        except PoolError as exc:
            failed.append(f"{worker.resolved_name()}({exc})")
    state.router.retune(config.routing)
    state.client_credentials = Credentials(config.auth.api_keys)
    state.admin_token = Credentials([config.auth.admin_token] if config.auth.admin_token else [])
    logs.configure(config.log_level, config.log_format, config.access_log)
    state.reconfigure(config)
    return failed


def _names(workers: list[WorkerSettings]) -> str:
    return ",".join(w.resolved_name() for w in workers) or "none"


# a URL's scheme and authority up to its user information's "@": ``scheme://`` then no "/", "?", "#", quote
# or space before the "@"
_USERINFO = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*://)[^/?#@\s'\"]*@")


def mask_userinfo(text: str) -> str:
    """``text`` with the user information (user and password) of every URL in it replaced by ``***``:
    ``http://user:pw@host/`` -> ``http://***@host/``. Every message that quotes a configured URL goes
    through it."""
    return _USERINFO.sub(r"\1***@", text) if "@" in text else text
