"""The router's logs: greppable ``key=value`` lines by default, JSON lines on a switch (``log_format``).

Structured lines (the access log, the audit log, the start-up summary) are logged as a :class:`Fields`
message: the text format renders it as ``key=value`` pairs (a value with a space, a quote, ``=`` or a
control character is written as a JSON string, so one request is always one line and a client cannot
forge a field), the JSON format merges its fields into the line's object. Any other record is rendered
as usual (its message under ``message`` in JSON).

Loggers: ``prefix_router.access`` (one line per request, ``access_log``), ``prefix_router.audit``
(configuration reloads and admin changes), ``prefix_router`` (everything else).

A serving process logs through one :class:`LineHandler` on the root logger (``configure``). When a
structured line would reach only that handler (nothing else listens: no test capture, no other handler,
no filter), ``LineHandler.direct`` gives the caller a way around the ``logging`` machinery: the line is
formatted here, exactly as the handler's formatter would (same text, same JSON), and written with the
other lines of the event loop's iteration in one write of at most ``BATCH_BYTES`` (a record logged the
usual way first writes what is pending, so lines keep their order; ``flush`` and interpreter exit write it
too). That is the access
log's path: a ``LogRecord``, its formatter and a locked write per request cost the router about a tenth
of its CPU per request (``bench-overhead``).
"""

from __future__ import annotations

import asyncio
import logging
import re
import sys
import time
from collections.abc import Mapping
from typing import Any, Literal, TextIO

import orjson
from mypy_extensions import mypyc_attr

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
ACCESS_LOGGER = "prefix_router.access"
AUDIT_LOGGER = "prefix_router.audit"
_plain = re.compile(r"[A-Za-z0-9_.:/@+,()<>\-\[\]*]*").fullmatch
MAX_VALUE_CHARS = 256

LogFormat = Literal["text", "json"]
# direct lines are written in batches of at most this many bytes: POSIX's PIPE_BUF, the most one write to a
# pipe is guaranteed not to be interleaved with another process's (``serve --processes``: one stderr)
BATCH_BYTES = 4096


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


@mypyc_attr(native_class=False)  # compiled (setup.py): a subclass of an interpreted class
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


@mypyc_attr(native_class=False)  # compiled (setup.py): a subclass of an interpreted class
class LineHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """The serving process's one handler (stderr), which also writes pre-formatted structured lines."""

    def __init__(self, stream: TextIO, log_format: LogFormat = "text") -> None:
        super().__init__(stream)
        self._pending: list[str] = []
        self._pending_bytes = 0
        self._second = -1  # the second ``_stamp`` is for
        self._stamp = ""
        self.set_format(log_format)

    def set_format(self, log_format: LogFormat) -> None:
        self.json = log_format == "json"
        self.setFormatter(JsonFormatter() if self.json else logging.Formatter(TEXT_FORMAT))

    def direct(self, logger: logging.Logger) -> LineHandler | None:
        """This handler, when a record of ``logger`` would reach it and nothing else; else None."""
        root = logging.root
        handlers = root.handlers
        if len(handlers) != 1 or handlers[0] is not self or self.filters or self.level > logging.INFO:
            return None
        if logger.filters:
            return None
        node: logging.Logger | None = logger
        while node is not None and node is not root:  # every logger on the way up to the root
            if node.handlers or not node.propagate:
                return None
            node = node.parent
        return self

    def write_info(self, name: str, message: Fields, created: float | None = None) -> None:
        """What ``Logger.info(message)`` on logger ``name`` would write through this handler (at
        ``created``, by default now), without a record; written at the end of the event loop's iteration
        (at once outside a running loop)."""
        if created is None:
            created = time.time()
        if self.json:
            ts = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(created))
            msecs = int((created - int(created)) * 1000)
            head = {"ts": f"{ts}.{msecs:03d}Z", "level": "info", "logger": name}
            line = orjson.dumps({**head, **message.fields}, default=str).decode()
        else:
            line = f"{self._asctime(created)} INFO {name}: {message}"
        self._queue(line)

    def write_text(self, name: str, text: str, created: float | None = None) -> None:
        """``write_info`` of a message whose ``key=value`` text is ``text``, in the text format (the JSON
        format needs the fields: ``write_info``)."""
        self._queue(f"{self._asctime(time.time() if created is None else created)} INFO {name}: {text}")

    def _queue(self, line: str) -> None:
        """``line`` written at the end of the event loop's iteration (at once outside a running loop)."""
        size = len(line) + 1 if line.isascii() else 4 * (len(line) + 1)  # UTF-8 bytes, at most
        lock = self.lock  # ``acquire``'s, taken directly: a record logged from another thread (``emit``)
        assert lock is not None  # writes the pending lines too; ``Handler.__init__`` made it
        with lock:
            if self._pending and self._pending_bytes + size > BATCH_BYTES:
                self._write_pending()
            self._pending_bytes += size
            self._pending.append(line)
            first = len(self._pending) == 1
        if first:
            try:
                asyncio.get_running_loop().call_soon(self.flush)
            except RuntimeError:
                self.flush()

    def _asctime(self, created: float) -> str:
        """``logging.Formatter.formatTime``'s default (local time, milliseconds), the date once a second."""
        second = int(created)
        if second != self._second:
            self._second = second
            self._stamp = time.strftime(logging.Formatter.default_time_format, time.localtime(created))
        return self._stamp + "," + format(int((created - second) * 1000), "03d")

    def _write_pending(self) -> None:
        if self._pending:
            lines, self._pending, self._pending_bytes = self._pending, [], 0
            self.stream.write("\n".join(lines) + "\n")

    def emit(self, record: logging.LogRecord) -> None:
        if self._pending:
            self.acquire()
            try:
                self._write_pending()
            finally:
                self.release()
        super().emit(record)

    def flush(self) -> None:
        self.acquire()
        try:
            self._write_pending()
        finally:
            self.release()
        super().flush()


def configure(level: str, log_format: LogFormat = "text", access_log: bool = True) -> None:
    """Set up the root handler (stderr) once per process; later calls (a reload) only change levels and
    the format."""
    # the documented switches that spare every record collecting what no format here shows (the logging
    # HOWTO, "Optimization"): a good part of an access line's cost
    logging.logThreads = logging.logProcesses = logging.logMultiprocessing = False
    root = logging.getLogger()
    handler = next((h for h in root.handlers if isinstance(h, LineHandler)), None)
    if handler is None:
        handler = LineHandler(sys.stderr)
        for old in list(root.handlers):  # one handler, one format: no duplicate lines
            root.removeHandler(old)
        root.addHandler(handler)
    handler.set_format(log_format)
    root.setLevel(level.upper())
    # the access log has its own switch: on, it logs at info whatever ``log_level`` says
    logging.getLogger(ACCESS_LOGGER).setLevel(logging.INFO if access_log else logging.CRITICAL + 1)


def line_handler() -> LineHandler | None:
    """The process's ``LineHandler`` (``configure``), if it has one."""
    return next((h for h in logging.root.handlers if isinstance(h, LineHandler)), None)


def flush() -> None:
    """Write the lines the process's ``LineHandler`` holds back (if any) now."""
    handler = line_handler()
    if handler is not None:
        handler.flush()
