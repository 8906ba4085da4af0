"""The audit log (logger ``prefix_router.audit``): every change of what the router serves or who may use
it, one ``key=value`` line each (JSON with ``log_format: json``): configuration reloads (SIGHUP) and admin
API changes (add, remove, drain, undrain a worker) and refused admin calls. Secrets never appear: a changed
key or token is named, never shown; a worker appears by name and URL (URLs carry no credentials: user
info is refused in worker URLs)."""

from __future__ import annotations

import logging
from typing import Any

from prefix_router.node.telemetry.logs import AUDIT_LOGGER, Fields

audit_log = logging.getLogger(AUDIT_LOGGER)


def audit(action: str, level: int = logging.INFO, **fields: Any) -> None:
    audit_log.log(level, Fields({"audit": action, **fields}))
