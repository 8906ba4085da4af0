"""Shared pieces of every package's settings: the frozen section base, the configuration error, and the
helpers that read a configuration (YAML files, dotted keys, YAML scalars, one-line validation errors).

A leaf module: each package owns its settings (``routing.settings``, ``pool.settings``,
``replication.settings``, ``node.settings``) built on :class:`Section`; ``prefix_router.node.config``
only composes them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pydantic
import yaml
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


def read_yaml(path: str | Path) -> dict[str, Any]:
    try:
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"config file {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"config file {path}: not UTF-8 (byte {exc.start})") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"config file {path}: invalid YAML: {str(exc).splitlines()[0]}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path}: the top level must be a mapping")
    return data


def parse_scalar(raw: str) -> Any:
    """A YAML scalar (``8000`` -> int, ``true`` -> bool); anything else stays the string."""
    try:
        value = yaml.safe_load(raw)
    except yaml.YAMLError:
        return raw
    return value if isinstance(value, str | int | float | bool | list) else raw


def set_dotted(data: dict[str, Any], key: str, value: Any) -> None:
    parts = key.split(".")
    node = data
    for part in parts[:-1]:
        child = node.get(part)
        if not isinstance(child, dict):
            child = {}
            node[part] = child
        node = child
    node[parts[-1]] = value


def describe(exc: pydantic.ValidationError) -> str:
    """One line naming the first bad key, e.g. ``routing.keys.block_chars: Input should be greater than 0``
    (the message is pydantic's)."""
    err = exc.errors()[0]
    key = ".".join(str(p) for p in err["loc"]) or "<top level>"
    msg = str(err["msg"]).removeprefix("Value error, ")
    more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
    return f"invalid config: {key}: {msg}{more}"
