"""Shared pieces of every package's settings: the frozen section base and the configuration error.

A leaf module: each package owns its settings (``routing.settings``, ``pool.settings``,
``replication.settings``, ``proxy.settings``) built on :class:`Section`; ``prefix_router.proxy.config``
only composes them.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict


class ConfigError(ValueError):
    """A configuration problem, with a one-line message naming the offending key."""


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def split_list(value: Any) -> Any:
    """Lists may be given as comma-separated strings (environment variables)."""
    if isinstance(value, str):
        return [part.strip() for part in value.split(",") if part.strip()]
    return value
