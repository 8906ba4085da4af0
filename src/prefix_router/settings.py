"""Shared pieces of every package's settings: the frozen section base, the configuration error, and the
helpers that read a configuration (YAML files, dotted keys, YAML scalars, one-line validation errors).

The keys a release renamed or removed (``RETIRED_KEYS``) are refused for one release with a hint to their
new name (``retired_key``), from every source: YAML, ``PREFIX_ROUTER_*`` variables, ``--set`` flags.

A leaf module: each package owns its settings (``routing.settings``, ``pool.settings``,
``replication.settings``, ``node.settings``) built on :class:`Section`; ``prefix_router.node.config``
only composes them.
"""

from __future__ import annotations

from collections.abc import Mapping
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
    """One line naming the first bad key, e.g. ``routing.keys.block_tokens: Input should be greater than 0``
    (the message is pydantic's; a check across sections names its keys in its own message)."""
    err = exc.errors()[0]
    key = ".".join(str(p) for p in err["loc"])
    msg = str(err["msg"]).removeprefix("Value error, ")
    more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
    return f"invalid config: {key + ': ' if key else ''}{msg}{more}"


# old dotted key -> what to write instead, refused for one release (``retired_key``: ``A.*`` stands for every
# key of section ``A``)
_DERIVED = "removed: derived from"
_CONSTANT = "removed: a constant of"
RETIRED_KEYS: dict[str, str] = {
    # the key modes, named by what they read
    "routing.keys.tokenizer_path": "renamed routing.keys.tokenizer (with routing.keys.mode: tokenizer)",
    "routing.keys.exact_models": "renamed routing.keys.templates (with routing.keys.mode: template)",
    "routing.keys.block_chars": f"{_DERIVED} routing.keys.block_tokens x chars_per_token: set block_tokens",
    "routing.keys.hash_prefix_chars": f"{_CONSTANT} routing/keys.py (HASH_PREFIX_CHARS, 512)",
    # tenants, in one section
    "routing.keys.isolate_tenants": "renamed tenants.isolate",
    "auth.forward_client_auth": "renamed tenants.forward_client_auth",
    # sessions, in one section
    "session_header": "renamed routing.sessions.header",
    # the engines' events: the inputs of key mode events
    "routing.precise.block_tokens": "renamed routing.events.block_tokens",
    "routing.precise.render": "renamed routing.events.render",
    "routing.precise.home_load_factor": f"{_DERIVED} routing.sessions.load_factor",
    "routing.precise.home_load_slack": f"{_DERIVED} routing.sessions.load_slack",
    "routing.precise.render_timeout_s": f"{_CONSTANT} node/request/render.py (RENDER_TIMEOUT_S, 2 s)",
    "routing.precise.max_rendered": f"{_CONSTANT} node/request/render.py (MAX_RENDERED, 10000)",
    "routing.precise.*": f"{_CONSTANT} routing/precise.py (PreciseTuning); the section is routing.events",
    "limits.exact_parse_in_thread_bytes": "renamed limits.template_parse_in_thread_bytes",
    # constants beside their algorithms
    "routing.feedback.page_tokens": f"{_CONSTANT} routing/feedback.py (FeedbackTuning, vLLM's 16-token page)",
    "routing.feedback.*": f"{_CONSTANT} routing/feedback.py (FeedbackTuning)",
    "routing.units.learn": "",  # still a key (listed so that its section's entry below spares it)
    "routing.units.*": f"{_CONSTANT} routing/units.py (UnitTuning); routing.units.learn stays",
    "routing.trackers.engine_load_stale_s": f"{_CONSTANT} routing/load.py (ENGINE_LOAD_STALE_S, 10 s)",
    "routing.policies.consistent_hash.max_rings": (
        f"{_CONSTANT} routing/policies/consistent_hash.py (MAX_RINGS, 32)"
    ),
    "routing.policies.sglang_cache_aware.chars_per_token": (
        f"{_CONSTANT} routing/policies/sglang_cache_aware.py (CHARS_PER_TOKEN, 4)"
    ),
    "routing.policies.sglang_cache_aware.max_tree_blocks": (
        f"{_CONSTANT} routing/policies/sglang_cache_aware.py (MAX_TREE_BLOCKS)"
    ),
}


def retired_key(data: Mapping[str, Any], table: Mapping[str, str] = RETIRED_KEYS) -> str | None:
    """The first key of ``data`` (nested mappings) that ``table`` retires, as ``"KEY: HINT"``; None when
    there is none. An entry ``A.B`` retires that key (and anything under it: KEY is ``A.B``); ``A.*``
    every key in section ``A`` (KEY is the one given). The longest entry decides; an empty hint spares
    the key."""
    for leaf in _leaf_keys(data):
        parts = leaf.split(".")
        for end in range(len(parts), 0, -1):
            key = ".".join(parts[:end])
            hint, named = table.get(key), key
            if hint is None and end < len(parts):
                hint, named = table.get(key + ".*"), ".".join(parts[: end + 1])
            if hint is not None:
                if hint:
                    return f"{named}: {hint}"
                break
    return None


def _leaf_keys(data: Mapping[str, Any], prefix: str = "") -> list[str]:
    out: list[str] = []
    for name, value in data.items():
        key = f"{prefix}{name}"
        if isinstance(value, Mapping) and value:
            out += _leaf_keys(value, key + ".")
        else:
            out.append(key)
    return out
