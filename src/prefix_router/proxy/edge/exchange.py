"""One client request's trip through the router: choose a worker, open the upstream exchange (retrying
on another worker while nothing has reached the client), then relay the answer and settle the accounts.

Retry rule: a connect failure, a timeout or a 5xx before the first byte is sent to the client is retried
on the next best worker (excluding those tried), up to ``retries.max_attempts``, within the request's
first-byte budget (``timeouts.first_byte_s``, all attempts together): an attempt that used the budget up
is not run again elsewhere (a slow generation would only be repeated), while one cut short (a connect
failure, a 5xx, an ejected worker) leaves the rest of the budget to the next. A non-streamed body is read
whole (up to ``limits.max_response_buffer_bytes``) before anything is sent, so it is retryable until
complete; a stream is committed with its first chunk and never retried: a later failure (the engine
breaks, stays silent for ``timeouts.stream_idle_s``, its worker is ejected, ``total_s`` or the shutdown
deadline passes) ends it with an SSE error event naming the cause.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any, TypeAlias

import orjson
from aiohttp import web

from prefix_router.node import (
    CLIENT_GONE,
    PASSTHROUGH_POLICY,
    Cause,
    FailureKind,
    Flight,
    NodeState,
    Parsed,
    ProxyError,
    ReplyAccumulator,
    RequestNote,
    UpstreamError,
    UpstreamRequest,
    UpstreamResponse,
    Watch,
    cached_tokens,
    check_model,
    choose,
    downstream_headers,
    edited,
    is_event_stream,
    nobody,
    overloaded,
    passthrough_req,
    redact,
    safe_path,
    salt_value,
    salted_body,
    settle,
    shutting_down,
    takes_cache_salt,
    tenant_salt,
    upstream_failed,
    upstream_headers,
    upstream_url,
    with_traceparent,
    worker_secret,
)
from prefix_router.pool import Worker
from prefix_router.proxy.edge import head
from prefix_router.proxy.edge.pd import Disaggregation, open_disaggregated
from prefix_router.proxy.edge.request import EdgeRequest
from prefix_router.proxy.edge.responses import RelayResponse
from prefix_router.routing import Decision, Outcome

log = logging.getLogger(__name__)
Writer: TypeAlias = head.Relay | web.StreamResponse  # where a relayed stream is written


@dataclass(init=False, slots=True)  # a written __init__, compiled: see routing/types.py
class Opened:
    """An upstream answer ready to relay: the body read so far and whether that is all of it."""

    flight: Flight
    response: UpstreamResponse
    prefix: bytes
    complete: bool
    stream: bool

    def __init__(
        self,
        flight: Flight,
        response: UpstreamResponse,
        prefix: bytes,
        complete: bool,
        stream: bool,
    ) -> None:
        self.flight = flight
        self.response = response
        self.prefix = prefix
        self.complete = complete
        self.stream = stream


@dataclass(slots=True)
class Failed:
    """Why an attempt failed; ``status`` and ``body`` when the worker answered 5xx."""

    kind: FailureKind
    message: str
    worker: str
    status: int | None = None
    headers: Any = None
    body: bytes = b""


class Exchange:
    def __init__(
        self,
        state: NodeState,
        request: EdgeRequest,
        raw: bytes,
        parsed: Parsed | None,
        model: str | None,
        policy: str | None,
        note: RequestNote,
    ) -> None:
        self.state = state
        self.request = request
        self.note = note
        self.raw = raw
        self.parsed = parsed
        self.model = model
        self.policy = policy if parsed is not None else PASSTHROUGH_POLICY
        label = policy or state.request_config.policy
        self.label = label if parsed is not None else None  # what a routed request is counted under
        note.policy = label if parsed is not None else PASSTHROUGH_POLICY
        self.req = parsed.req if parsed is not None else passthrough_req(state)
        self.path_qs = request.target  # origin form, even for an absolute-form target
        self.started = state.clock()
        self.loop = asyncio.get_running_loop()  # once: each call asks the kernel for the process id
        now = self.loop.time()
        config = state.request_config
        self.deadline = now + config.total_s
        self.first_byte_deadline = min(now + config.first_byte_s, self.deadline)
        self.bodies: dict[bool, bytes] | None = None  # tenants.cache_salt: the bodies sent upstream
        self.pd: Disaggregation | None = None  # the stages of a disaggregated request (proxy/edge/pd.py)
        self.decode_started = now

    async def run(self) -> web.StreamResponse:
        self.check_path()
        check_model(self.state, self.model, self.note)
        try:
            opened = await self.open()
            if opened.complete:
                return await self.send_whole(opened)
            return await self.send_stream(opened)
        finally:
            if self.pd is not None:
                await self.pd.close()

    # ------------------------------------------------------------------ choosing

    def check_path(self) -> None:
        if not safe_path(self.path_qs):
            raise ProxyError(400, "invalid request path", code="invalid_path")

    def eligible(self, excluded: set[str]) -> list[str]:
        """The workers that may take the request now, but those in ``excluded`` (tried already)."""
        pool, config = self.state.pool, self.state.request_config
        if pool.total_in_flight() >= config.max_in_flight:  # admit() checked before the body was read
            raise overloaded("the router is at its in-flight cap", self.state.config.limits.retry_after_s)
        names = pool.candidates(self.model, config.max_in_flight_per_worker)
        if excluded:
            names = [n for n in names if n not in excluded]
        return names

    # ------------------------------------------------------------------ opening, with retries

    async def open(self) -> Opened:
        if self.parsed is not None and self.state.pool.disaggregated:
            return await open_disaggregated(self)
        return await self.open_from(None, None, None)

    async def open_from(
        self, worker: Worker | None, decision: Decision | None, allowed: frozenset[str] | None
    ) -> Opened:
        """The attempts, the first on ``worker`` by ``decision`` when given (chosen already), the others
        among ``allowed`` (None: every eligible worker)."""
        excluded: set[str] = set()
        last: Failed | None = None
        loop = self.loop
        for attempt in range(self.state.request_config.max_attempts):
            if attempt and self.state.deadlines.stopping:
                raise shutting_down(self.state.config.limits.retry_after_s)
            if attempt and loop.time() >= self.first_byte_deadline:
                break  # the first-byte budget is spent: no further generation is started
            if attempt == 0 and worker is not None and decision is not None:
                pick = (worker, decision)
            else:
                names = self.eligible(excluded)
                if allowed is not None:
                    names = [n for n in names if n in allowed]
                if not names:
                    break
                pick = choose(self.state, self.req, names, self.policy, self.label, self.note)
            excluded.add(pick[0].name)
            if attempt:
                self.state.metrics.retries.inc()
            result = await self.attempt(*pick)
            if isinstance(result, Opened):
                return result
            if self.note.trace is not None:
                self.note.trace.attempt_failed(str(result.kind), result.status)
            last = result
        raise self.give_up(last)

    def give_up(self, last: Failed | None) -> Exception:
        if last is None:
            return nobody(self.state, self.model)
        if last.status is not None:
            worker = self.state.pool.get(last.worker)
            secret, base = worker_secret(worker), worker.url if worker is not None else None
            shown = last.worker if self.state.request_config.decision_headers else None
            headers = downstream_headers(last.headers, shown, None, secret, self.note.request_id, base)
            body = redact(last.body, secret)
            return UpstreamReply(web.Response(status=last.status, body=body, headers=headers))
        # the worker's name, not the failure's text: that names internal addresses
        log.info("giving up on %s after %s failure: %s", last.worker, last.kind, last.message)
        message = f"upstream {last.kind} failure on worker {last.worker}"
        return upstream_failed(message, timeout=last.kind == FailureKind.TIMEOUT)

    async def attempt(self, worker: Worker, decision: Decision) -> Opened | Failed:
        if self.pd is not None and self.pd.concurrent:
            return await self.pd.paired_attempt(worker, decision)
        return await self.plain_attempt(worker, decision)

    async def plain_attempt(self, worker: Worker, decision: Decision) -> Opened | Failed:
        flight = self.pd.take(worker) if self.pd is not None else None  # a decode charged at the choice
        if flight is None:
            flight = Flight(self.state, worker, self.req, decision, self.parsed, self.started)
        response: UpstreamResponse | None = None
        try:
            async with self.state.deadlines.watch(worker.name, self.first_byte_deadline):
                response = await self.state.upstream.send(self.upstream_request(worker))
                if response.status >= 500:
                    return await self.server_error(flight, response)
                opened = await self.read_prefix(flight, response)
        except UpstreamError as exc:
            return self.failed(flight, response, exc.kind, str(exc))
        except TimeoutError:
            return self.failed(flight, response, FailureKind.TIMEOUT, "no answer in time")
        except BaseException:
            _abort(response)
            flight.finish(CLIENT_GONE, Outcome(ok=False))
            raise
        self.note.ttft_s = flight.first_byte(opened.response.status)
        if self.note.trace is not None:
            self.note.trace.first_byte(opened.response.status)
        return opened

    def upstream_request(self, worker: Worker) -> UpstreamRequest:
        headers = upstream_headers(
            self.request.headers, worker, self.state.request_config.forward_client_auth, self.note.request_id
        )
        url = upstream_url(worker, self.path_qs)
        if self.note.trace is not None:  # the engine's span is a child of this attempt's
            headers = with_traceparent(headers, self.note.trace.attempt(worker.name))
        return UpstreamRequest(self.request.method, url, headers, self.body_for(worker))

    def body_for(self, worker: Worker) -> bytes:
        """The client's bytes, or (``tenants.cache_salt``, a vLLM worker, a client with a key) the body
        with the tenant's ``cache_salt``, so that the engine's prefix cache is not shared across tenants."""
        if self.pd is not None and self.pd.decode_fields is not None:
            return self.stage_body(self.pd.decode_fields, worker)
        if self.parsed is None or not self.state.request_config.cache_salt:
            return self.raw
        salted = takes_cache_salt(worker)
        if self.bodies is None:
            self.bodies = {}
        body = self.bodies.get(salted)
        if body is None:
            salt = tenant_salt(self.request.headers) if salted else None
            body = self.raw if salt is None else salted_body(self.parsed.body, salt, self.raw)
            self.bodies[salted] = body
        return body

    def salt_fields(self, worker: Worker) -> dict[str, Any]:
        """``{"cache_salt": ...}`` when ``body_for`` salts ``worker``'s body, else nothing."""
        if self.parsed is None or not self.state.request_config.cache_salt or not takes_cache_salt(worker):
            return {}
        salt = tenant_salt(self.request.headers)
        return {} if salt is None else {"cache_salt": salt_value(self.parsed.body, salt)}

    def stage_body(self, fields: dict[str, Any], worker: Worker) -> bytes:
        """The client's body with a disaggregated stage's ``fields`` (and the tenant's salt) set."""
        assert self.parsed is not None  # a disaggregated exchange is a routed one
        return edited(self.parsed.body, self.raw, {**self.salt_fields(worker), **fields})

    async def read_prefix(self, flight: Flight, response: UpstreamResponse) -> Opened:
        if is_event_stream(response.headers):
            first = await response.next_chunk()
            return Opened(flight, response, first, complete=not first, stream=True)
        body, complete = await read_up_to(response, self.state.request_config.max_response_buffer_bytes)
        return Opened(flight, response, body, complete=complete, stream=False)

    async def server_error(self, flight: Flight, response: UpstreamResponse) -> Failed:
        body, complete = await read_up_to(response, 64 * 1024)
        _finish_reading(response, complete)
        flight.fail(FailureKind.STATUS, response.status, f"HTTP {response.status}")
        message = f"HTTP {response.status}"
        return Failed(
            FailureKind.STATUS, message, flight.worker.name, response.status, response.headers, body
        )

    def failed(
        self, flight: Flight, response: UpstreamResponse | None, kind: FailureKind, message: str
    ) -> Failed:
        _abort(response)
        if kind in (FailureKind.CONNECT, FailureKind.IO):  # the engine may have been restarted
            flight.worker.identity_stale = True
        flight.fail(kind, 504 if kind == FailureKind.TIMEOUT else 502, message)
        return Failed(kind, message, flight.worker.name)

    # ------------------------------------------------------------------ relaying

    def response_headers(self, opened: Opened) -> list[tuple[str, str]]:
        predicted = opened.flight.decision.predicted_tokens if self.parsed is not None else None
        worker = opened.flight.worker
        secret = worker_secret(worker)
        rid = self.note.request_id
        headers, base = opened.response.headers, worker.url
        if not self.state.request_config.decision_headers:
            return downstream_headers(headers, None, None, secret, rid, base)
        return downstream_headers(headers, worker.name, predicted, secret, rid, base)

    def reply(self) -> ReplyAccumulator:
        config = self.state.request_config
        endpoint = self.parsed.endpoint if self.parsed is not None else None
        return ReplyAccumulator(endpoint, config.max_generated_chars, config.max_sse_line_bytes)

    async def send_whole(self, opened: Opened) -> web.StreamResponse:
        opened.response.release()
        status = opened.response.status
        body = redact(opened.prefix, worker_secret(opened.flight.worker))
        headers = self.response_headers(opened)
        reply = self.reply()
        try:
            out: web.StreamResponse | None = head.sent(self.request, status, headers, body)
            if out is None:  # not a plain answer: the server writes it
                out = web.Response(status=status, body=body, headers=headers)
                await self.request.respond(out)
                await out.write_eof()
        except BaseException:
            opened.flight.finish(CLIENT_GONE, Outcome(ok=False))
            self.note.status = CLIENT_GONE
            raise
        if self.parsed is not None and 200 <= status < 300:
            reply.feed_body(opened.prefix)
        settle(self.state, opened.flight, reply, status, ok=200 <= status < 300)
        self.trace_answered(opened.flight, reply, 200 <= status < 300)
        return out

    async def send_stream(self, opened: Opened) -> web.StreamResponse:
        status, headers = opened.response.status, self.response_headers(opened)
        out: head.Relay | RelayResponse | None = head.relay(self.request, status, headers)
        if out is None:  # not a plain stream: the server writes it
            out = RelayResponse(status=status, headers=headers)
        reply = self.reply()
        try:
            if isinstance(out, RelayResponse):
                await self.request.respond(out)
            ok = await self.pump(out, opened, reply)
            await out.write_eof()
        except (ConnectionResetError, asyncio.CancelledError) as exc:  # the client went away
            opened.response.abort()
            opened.flight.finish(CLIENT_GONE, Outcome(ok=False))
            self.note.status = CLIENT_GONE
            if isinstance(exc, asyncio.CancelledError):
                raise
            return answered(out)
        settle(self.state, opened.flight, reply, status, ok=ok)
        self.trace_answered(opened.flight, reply, ok)
        return answered(out)

    def trace_answered(self, flight: Flight, reply: ReplyAccumulator, ok: bool) -> None:
        """The answer is relayed whole: its span told what the engine reported it cached (traced only)."""
        trace = self.note.trace
        if trace is not None:
            trace.answered(cached_tokens(reply.usage_body, flight.worker.adapter), ok)

    async def pump(self, out: Writer, opened: Opened, reply: ReplyAccumulator) -> bool:
        """Relay chunks as they come, each within ``stream_idle_s`` of the previous one; on an upstream
        failure end the stream cleanly. Returns success."""
        chunk, response = opened.prefix, opened.response
        idle_s, loop = self.state.request_config.stream_idle_s, self.loop
        watch = self.state.deadlines.watch(
            opened.flight.worker.name, min(loop.time() + idle_s, self.deadline), idle_s
        )
        held = EventHold(self.state.request_config.max_sse_line_bytes) if opened.stream else None
        try:
            async with watch:
                while chunk:
                    if held is not None:
                        reply.feed(chunk)
                        chunk = held.whole_events(chunk)
                    if chunk:
                        await out.write(chunk)
                    self.push_idle(watch, loop.time())
                    chunk = await response.next_chunk()
                if held is not None and held.pending:  # the body ended inside an event: never sent half
                    raise UpstreamError(FailureKind.IO, TRUNCATED)
        except (UpstreamError, TimeoutError) as exc:
            response.abort()
            kind = FailureKind.TIMEOUT if isinstance(exc, TimeoutError) else FailureKind.IO
            self.state.metrics.upstream_errors.inc((opened.flight.worker.name, kind))
            idle = watch.when is not None and watch.when < self.deadline  # not cut by total_s
            await self.end_broken(out, opened, stream_cut(watch, exc, idle))
            return False
        response.release()
        return True

    def push_idle(self, watch: Watch, now: float) -> None:
        """Move a stream's idle deadline on after a chunk, only once it lags by a slack (a reschedule
        costs about 10 us: not once per token), so a silence is cut after between ``idle_s`` - slack and
        ``idle_s`` (an ejection may have shortened ``idle_s``)."""
        idle_s, watched = watch.idle_s or 0.0, watch.when
        until = now + idle_s
        if watched is not None and until - watched > min(1.0, idle_s / 20) and watched < self.deadline:
            watch.push(min(until, self.deadline))

    async def end_broken(self, out: Writer, opened: Opened, cut: tuple[str, str]) -> None:
        if not opened.stream:  # no way to say it inside a plain body: cut the connection
            transport = self.request.transport()
            if transport is not None:
                transport.abort()
            return
        message, code = cut
        log.info("stream from worker %s cut: %s", opened.flight.worker.name, code)
        await out.write(sse_error(message, code))


def answered(out: Writer) -> web.StreamResponse:
    """The response aiohttp's connection handler gets back for a relayed stream."""
    return out if isinstance(out, web.StreamResponse) else out.response()


_EVENT_ENDS = (b"\n\n", b"\n\r\n", b"\r\r")
TRUNCATED = "the stream ended inside an event"  # the failure of a body that ends with a partial event


class EventHold:
    """What of a relayed SSE stream may go to the client now: everything up to the end of its last whole
    event; the start of an event whose end has not come yet is held (up to ``limit`` bytes, then let go),
    so that a stream cut in the middle of an event is followed by the router's error event, never spliced
    into it (``data: {"id": "x", "choidata: {"error": ...}}``)."""

    __slots__ = ("limit", "pending")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.pending = b""

    def whole_events(self, chunk: bytes) -> bytes:
        if not self.pending and chunk.endswith(_EVENT_ENDS):  # ends an event: all of it goes (the usual case)
            return chunk
        data = self.pending + chunk if self.pending else chunk
        end = max((i + len(sep) for sep in _EVENT_ENDS if (i := data.rfind(sep)) >= 0), default=0)
        if end == len(data) or len(data) - end > self.limit:
            self.pending = b""
            return data
        self.pending = data[end:]
        return data[:end]

    def take(self) -> bytes:
        out, self.pending = self.pending, b""
        return out


class UpstreamReply(Exception):
    """A complete response to send as is (the last worker's 5xx)."""

    def __init__(self, response: web.Response) -> None:
        super().__init__("upstream reply")
        self.response = response


def stream_cut(watch: Watch, exc: Exception, idle: bool) -> tuple[str, str]:
    """Why a stream was cut, as the (message, code) of its SSE error event."""
    if isinstance(exc, UpstreamError) and str(exc) == TRUNCATED:
        return "upstream ended its stream inside an event", "upstream_truncated"
    if isinstance(exc, UpstreamError):
        return "upstream failed mid-stream", "upstream_io"
    if watch.cause is Cause.SHUTDOWN:
        return "the router is shutting down", "router_shutdown"
    if not idle:
        return "upstream timed out mid-stream", "upstream_timeout"
    if watch.cause is Cause.EJECTED:
        return "the worker was ejected by health checks and sent nothing more", "worker_ejected"
    return "no data from upstream within timeouts.stream_idle_s", "upstream_idle_timeout"


def sse_error(message: str, code: str) -> bytes:
    error = {"message": message, "type": "upstream_error", "param": None, "code": code}
    return b"data: " + orjson.dumps({"error": error}) + b"\n\n"


async def read_up_to(response: UpstreamResponse, limit: int) -> tuple[bytes, bool]:
    """Read until the end or past ``limit`` bytes; returns (data, reached the end)."""
    parts: list[bytes] = []
    size = 0
    while size <= limit:
        chunk = await response.next_chunk()
        if not chunk:
            return b"".join(parts), True
        parts.append(chunk)
        size += len(chunk)
    return b"".join(parts), False


def _finish_reading(response: UpstreamResponse, complete: bool) -> None:
    if complete:
        response.release()
    else:
        response.abort()


def _abort(response: UpstreamResponse | None) -> None:
    if response is not None:
        response.abort()
