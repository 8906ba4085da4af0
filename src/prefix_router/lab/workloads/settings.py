"""Workload options as validated settings: each shape's options are a ``WorkloadSettings`` model (frozen,
unknown fields refused, every field with a default), built by ``make_settings`` from keyword arguments or
from the command line's strings (``--workload-opt tenants=32``).

Values are validated by pydantic as every config section is: ``"32"`` is an int, ``"0.5"`` a float,
``true/false/yes/no/on/off/1/0`` a bool (``flag=ture`` is refused), and ``none``, ``null`` or an empty
string are None for an option that may be None. A bad or unknown option raises ``WorkloadOptionError``
with one line naming the workload and the option; the commands print it and exit 2.
"""

from __future__ import annotations

import typing
from collections.abc import Mapping
from typing import Any, TypeVar

import pydantic

from prefix_router.settings import ConfigError, Section

NONE_WORDS = ("none", "null", "")


class WorkloadSettings(Section):
    """The base of every workload's options (frozen, extra fields forbidden)."""


class WorkloadOptionError(ConfigError):
    """A workload option that is unknown or has a bad value (one line)."""


S = TypeVar("S", bound=WorkloadSettings)


def make_settings(cls: type[S], values: Mapping[str, Any], workload: str = "") -> S:
    """``cls`` validated from ``values`` (options not given keep their defaults)."""
    where = f"workload {workload}: " if workload else ""
    unknown = sorted(set(values) - set(cls.model_fields))
    if unknown:
        valid = ", ".join(cls.model_fields)
        raise WorkloadOptionError(f"{where}unknown option(s) {', '.join(unknown)}; valid: {valid}")
    data = {key: _none_word(cls, key, value) for key, value in values.items()}
    try:
        return cls.model_validate(data)
    except pydantic.ValidationError as exc:
        raise WorkloadOptionError(where + describe(exc)) from None


def describe(exc: pydantic.ValidationError) -> str:
    """``option tenants: Input should be a valid integer ... (got 'x')``: the first error, on one line."""
    err = exc.errors()[0]
    key = ".".join(str(p) for p in err["loc"]) or "options"
    message = str(err["msg"]).removeprefix("Value error, ")
    more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
    return f"option {key}: {message} (got {err.get('input')!r}){more}"


def _none_word(cls: type[WorkloadSettings], key: str, value: Any) -> Any:
    """None for ``none``/``null``/empty given to an option that may be None; the value otherwise."""
    if isinstance(value, str) and value.strip().lower() in NONE_WORDS and _optional(cls, key):
        return None
    return value


def _optional(cls: type[WorkloadSettings], key: str) -> bool:
    return type(None) in typing.get_args(cls.model_fields[key].annotation)
