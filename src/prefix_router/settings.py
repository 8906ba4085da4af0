"""Shared pieces of every package's settings: the frozen section base and the configuration error.

A leaf module: each package owns its settings (``routing.settings``, ``pool.settings``,
``replication.settings``, ``proxy.settings``) built on :class:`Section`; ``prefix_router.proxy.config``
only composes them.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, SecretStr


class ConfigError(ValueError):
    """A configuration problem, with a one-line message naming the offending key."""


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def split_list(value: Any) -> Any:
    """Lists may be given as comma-separated strings (environment variables)."""
    if isinstance(value, str):
        return [part.strip() for part in value.split(",") if part.strip()]
    return value


def header_secret(value: SecretStr) -> SecretStr:
    """A credential that travels in an HTTP header. Surrounding whitespace (the trailing newline of a key
    read from a secret file) is removed; an empty key, or one with inner whitespace or a control
    character, is refused. The message never contains the key."""
    text = value.get_secret_value().strip()
    if not text:
        raise ValueError("empty key")
    if any(c.isspace() or not c.isprintable() for c in text):
        raise ValueError("the key contains whitespace or a control character (not allowed in an HTTP header)")
    return value if text == value.get_secret_value() else SecretStr(text)
