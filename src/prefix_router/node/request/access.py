"""One client request as the operator sees it: its id, what the router decided, how it ended.

``RequestNote`` is made when a ``/v1/*`` request arrives (``handlers.guarded``), filled in by the exchange
(worker, policy branch, predicted tokens and first-token time, time to first byte, attempts; its
entry in the decision feed, ``node.telemetry.decisions``) and closed once with the status the
client got: that counts ``prefix_router_requests_total`` (requests, not attempts) and writes the access log
line (``access_log``, logger ``prefix_router.access``):

    method=POST path=/v1/chat/completions status=200 model=m worker=a policy=prefix branch=prefix_hit
    predicted_tokens=208 predicted_ttft_ms=10.5 ttft_ms=12.3 duration_ms=345.6 attempts=1
    request_id=0b6f3c5e-9a41-4d27-8e1f-00000000002a

A disaggregated request (``docs/disaggregation.md``) adds, before its request id, how it ran (``pd``:
``split``, or why its prefill stage was skipped), its prefill worker and the prefill stage's time
(``worker`` is the decode worker, the one that answered):
``... attempts=1 pd=split prefill_worker=p1 prefill_ms=812.0 request_id=...``.

Request ids: a client's ``x-request-id`` is kept when it is 1-128 characters among letters, digits and
``. _ : -`` (anything else could forge log fields or headers); otherwise the router makes one, shaped as a
UUID (llama-cpp-python's server refuses any other id with a 400). Either way it is sent to the engine and
returned to the client.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping

from prefix_router.node.telemetry.decisions import DecisionEntry
from prefix_router.node.telemetry.logs import ACCESS_LOGGER, Fields, LineHandler, text_value
from prefix_router.node.telemetry.tracing import RequestTrace
from prefix_router.protocol import REQUEST_ID_HEADER

access_log = logging.getLogger(ACCESS_LOGGER)
_VALID_ID = re.compile(r"[A-Za-z0-9._:\-]{1,128}")
NONE = "none"  # a label value: no worker / no policy / no model
SHOWN_MAX = 256  # texts held by ``shown``
SHOWN_MAX_CHARS = 128  # the longest text held
_shown: dict[str, str] = {}
# the access line's fields, in its order (``RequestNote.values``, ``access_text``)
FIELDS = ("method", "path", "status", "model", "worker", "policy", "branch", "predicted_tokens",
          "predicted_ttft_ms", "ttft_ms", "duration_ms", "attempts", "pd", "prefill_worker", "prefill_ms",
          "request_id")  # fmt: skip


class RequestNote:
    __slots__ = (
        "attempts",
        "branch",
        "decision",
        "method",
        "model",
        "path",
        "pd",
        "policy",
        "predicted_tokens",
        "predicted_ttft_s",
        "prefill_s",
        "prefill_worker",
        "request_id",
        "started",
        "status",
        "trace",
        "ttft_s",
        "worker",
    )

    def __init__(self, request_id: str, method: str, path: str, started: float) -> None:
        self.request_id = request_id
        self.method = method
        self.path = path
        self.started = started
        self.model = NONE  # a label: a model the pool knows, else "none"
        self.worker = NONE
        self.policy = NONE
        self.branch: str | None = None
        self.predicted_tokens: int | None = None
        self.predicted_ttft_s: float | None = None  # the policy's prediction (None: it makes none)
        self.decision: DecisionEntry | None = None  # the routed attempt's entry in the decision feed
        self.ttft_s: float | None = None
        self.trace: RequestTrace | None = None  # its span, when tracing is on (``accounting.traced``)
        self.attempts = 0
        self.status: int | None = None  # set when it differs from the response's (499: the client left)
        self.pd: str | None = None  # disaggregated: "split", or why the prefill stage was skipped
        self.prefill_worker: str | None = None
        self.prefill_s: float | None = None

    def values(self, status: int, now: float) -> tuple[object, ...]:
        """The access line's field values, in ``FIELDS``' order."""
        ttft_ms = None if self.ttft_s is None else self.ttft_s * 1e3
        prefill_ms = None if self.prefill_s is None else self.prefill_s * 1e3
        predicted_ms = None if self.predicted_ttft_s is None else self.predicted_ttft_s * 1e3
        return (
            self.method, self.path, status, self.model, self.worker, self.policy, self.branch,
            self.predicted_tokens, predicted_ms, ttft_ms, (now - self.started) * 1e3, self.attempts,
            self.pd, self.prefill_worker, prefill_ms, self.request_id,
        )  # fmt: skip

    def line(self, status: int, now: float) -> str:
        """``str(AccessLine(self.fields(status, now)))``, without the fields."""
        return access_text(*self.values(status, now))

    def fields(self, status: int, now: float) -> dict[str, object]:
        return dict(zip(FIELDS, self.values(status, now), strict=True))


def request_id(headers: Mapping[str, str]) -> str | None:
    """The client's ``x-request-id`` when well formed, else None (the router makes one)."""
    value = headers.get(REQUEST_ID_HEADER)
    return value if value is not None and _VALID_ID.fullmatch(value) else None


def log_access(note: RequestNote, status: int, now: float, handler: LineHandler | None = None) -> None:
    """One access line: written by the serving process's ``handler`` directly when nothing else would see
    the record (``LineHandler.direct``), else as a record made directly (``Logger.info`` would also look
    up the caller's frame, a good part of the cost)."""
    if not access_log.isEnabledFor(logging.INFO):
        return
    direct = handler.direct(access_log) if handler is not None else None
    if direct is not None and not direct.json:  # the text line straight from the note
        direct.write_text(ACCESS_LOGGER, note.line(status, now))
        return
    line = AccessLine(note.fields(status, now))
    if direct is not None:
        direct.write_info(ACCESS_LOGGER, line)
    else:
        access_log.handle(access_log.makeRecord(ACCESS_LOGGER, logging.INFO, "", 0, line, (), None))


class AccessLine(Fields):
    """The access line's fields, its text built in one go: the method (an HTTP token), numbers, policy and
    branch names and the (validated or generated) request id are plain by construction; the path, the
    model and the worker go through ``text_value``."""

    __slots__ = ()

    def __str__(self) -> str:
        return access_text(*[self.fields.get(key) for key in FIELDS])


def access_text(
    method: object,
    path: object,
    status: object,
    model: object,
    worker: object,
    policy: object,
    branch: object,
    predicted_tokens: object,
    predicted_ttft_ms: object,
    ttft_ms: object,
    duration_ms: object,
    attempts: object,
    pd: object,
    prefill_worker: object,
    prefill_ms: object,
    request_id: object,
) -> str:
    """The access line's ``key=value`` text (``AccessLine``, ``RequestNote.line``). The numbers are
    formatted by ``format`` beforehand: mypyc makes a format spec inside an f-string of untyped values
    about 0.8 us dearer each."""
    ttft = "-" if ttft_ms is None else format(ttft_ms, ".1f")
    duration = format(duration_ms, ".1f")
    predicted = "-" if predicted_tokens is None else predicted_tokens
    predicted_ttft = "-" if predicted_ttft_ms is None else format(predicted_ttft_ms, ".1f")
    where = f"path={shown(path)} status={status} model={shown(model)}"
    how = f"worker={shown(worker)} policy={policy} branch={branch or '-'}"
    split = ""
    if pd is not None:  # a disaggregated request
        prefill = "-" if prefill_ms is None else format(prefill_ms, ".1f")
        split = f" pd={pd} prefill_worker={shown(prefill_worker or '-')} prefill_ms={prefill}"
    return (
        f"method={method} {where} {how} predicted_tokens={predicted} predicted_ttft_ms={predicted_ttft}"
        f" ttft_ms={ttft} duration_ms={duration} attempts={attempts}{split} request_id={request_id}"
    )


def shown(value: object) -> str:
    """``text_value(value)``: for a short string, remembered (the path, the model and the worker repeat
    from line to line), up to ``SHOWN_MAX`` of them; longer strings and the rest are rendered each time."""
    if type(value) is not str:
        return text_value(value)
    text = _shown.get(value)
    if text is None:
        text = text_value(value)
        if len(value) <= SHOWN_MAX_CHARS and len(_shown) < SHOWN_MAX:
            _shown[value] = text
    return text
