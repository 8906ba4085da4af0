"""The router's logs: greppable ``key=value`` lines by default, JSON lines on a switch (``log_format``).

Structured lines (the access log, the audit log, the start-up summary) are logged as a :class:`Fields`
message: the text format renders it as ``key=value`` pairs (a value with a space, a quote, ``=`` or a
control character is written as a JSON string, so one request is always one line and a client cannot
forge a field), the JSON format merges its fields into the line's object. Any other record is rendered
as usual (its message under ``message`` in JSON).

Loggers: ``prefix_router.access`` (one line per request, ``access_log``), ``prefix_router.audit``
(configuration reloads and admin changes), ``prefix_router`` (everything else).
"""

from __future__ import annotations

import logging
import re
import sys
import time
from collections.abc import Mapping
from typing import Any, Literal

import orjson

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
ACCESS_LOGGER = "prefix_router.access"
AUDIT_LOGGER = "prefix_router.audit"
_plain = re.compile(r"[A-Za-z0-9_.:/@+,()<>\-\[\]*]*").fullmatch
MAX_VALUE_CHARS = 256

LogFormat = Literal["text", "json"]


class Fields:
    """A structured log message: rendered only when a handler formats it (never for a disabled level)."""

    __slots__ = ("fields",)

    def __init__(self, fields: Mapping[str, Any]) -> None:
        self.fields = fields

    def __str__(self) -> str:
        return " ".join([f"{key}={text_value(value)}" for key, value in self.fields.items()])


def text_value(value: Any) -> str:
    """A value as it appears after ``key=``: bare when plain, else a JSON string (escaped, one line)."""
    kind = type(value)
    if kind is int:
        return str(value)
    if kind is float:
        return f"{value:.1f}"
    if value is None:
        return "-"
    text = value if kind is str else str(value)
    if len(text) > MAX_VALUE_CHARS:
        text = text[:MAX_VALUE_CHARS] + "..."
    if text and _plain(text):
        return text
    return orjson.dumps(text).decode()


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ``ts`` (UTC, ISO 8601), ``level``, ``logger``, then the message's fields
    (a :class:`Fields` message) or ``message``; an exception as ``exception`` (one string)."""

    def format(self, record: logging.LogRecord) -> str:
        ts = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        line: dict[str, Any] = {
            "ts": f"{ts}.{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
        }
        if isinstance(record.msg, Fields) and not record.args:
            line.update(record.msg.fields)
        else:
            line["message"] = record.getMessage()
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return orjson.dumps(line, default=str).decode()


def configure(level: str, log_format: LogFormat = "text", access_log: bool = True) -> None:
    """Set up the root handler (stderr) once per process; later calls (a reload) only change levels and
    the format."""
    # the documented switches that spare every record collecting what no format here shows (the logging
    # HOWTO, "Optimization"): a good part of an access line's cost
    logging.logThreads = logging.logProcesses = logging.logMultiprocessing = False
    root = logging.getLogger()
    handler = next((h for h in root.handlers if getattr(h, "prefix_router", False)), None)
    if handler is None:
        handler = logging.StreamHandler(sys.stderr)
        handler.prefix_router = True  # type: ignore[attr-defined]
        for old in list(root.handlers):  # one handler, one format: no duplicate lines
            root.removeHandler(old)
        root.addHandler(handler)
    handler.setFormatter(JsonFormatter() if log_format == "json" else logging.Formatter(TEXT_FORMAT))
    root.setLevel(level.upper())
    # the access log has its own switch: on, it logs at info whatever ``log_level`` says
    logging.getLogger(ACCESS_LOGGER).setLevel(logging.INFO if access_log else logging.CRITICAL + 1)
