"""One request as the endpoint picker sees it, over one ext_proc stream.

The gateway streams the request's headers and body (``FULL_DUPLEX_STREAMED``). The picker buffers the
body to its end, keys it as ``serve`` does (``parse_routed``), asks the same routing core for a worker
among the eligible ones, answers the headers with the destination (and fallbacks), then streams the body
back. A gateway that sends the body ``BUFFERED`` (its ``protocol_config``) gets the headers answered at
once and the destination with the body's answer.

The response is read in the mode the gateway's ``protocol_config`` names: as it passes (``STREAMED``, or
one ``BUFFERED`` message), each chunk sent back as it came (``FULL_DUPLEX_STREAMED``, the reference
gateways'), or not at all (``NONE``: its headers settle it). The first body bytes of a 2xx are the
first token; the usage (cached tokens) and the generated text settle the flight as the HTTP proxy
settles one (``settle``). A stream that ends early is a client gone.

Answers made here instead of a destination (immediate responses, OpenAI error bodies): 400 (invalid body
or path), 401 (client key), 404 (unknown model or a path outside ``/v1/``), 408 (the request not received
within its phase's deadline, ``phases``), 413 (body over ``limits.max_body_bytes``), 429 (shedding: the
in-flight caps), 500 (a bug, logged), 503 (no eligible endpoint, the body budget spent, or shutting
down).

Prefill/decode disaggregation (a pool with ``prefill`` workers: ``routing/pd.py``): the picker chooses both
stages as ``serve`` does (``Router.route_pd``) and follows llm-d's convention for a gateway: the
destination is the decode worker (its fallbacks other decode-capable workers), and the request carries
``x-prefiller-host-port: host:port`` of the prefill worker for the decode pod's sidecar, which runs the
prefill there first (no header: the decider skipped the prefill). The stage bodies of
``disaggregation.flow`` are the sidecar's to make: the gateway's protocol lets the picker send one
request to one destination. The index learns the prefill worker at dispatch, its stage counted done
with the decode's first response message; the decode is dispatched with the choice (charged to its
worker while the sidecar prefills), its prompt predicted handed over (``Router.handed_over``).

Knobs (``EppSettings``): ``fallbacks`` (how many other endpoints follow the choice in the destination
list, least loaded first), ``max_buffered_bytes`` (the body bytes held across all streams: a request body
that would go over it is answered 503 ``body_buffer_full``; a response that would is passed on without
being kept, so nothing is learned from it).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from envoy.service.ext_proc.v3 import external_processor_pb2 as ext
from multidict import CIMultiDict

import prefix_router.epp.extproc as extproc
from prefix_router.epp.phases import CUT_REASONS, Phase
from prefix_router.epp.settings import BUFFERED_BODIES, EppSettings
from prefix_router.node import (
    CLIENT_GONE,
    PASSTHROUGH_POLICY,
    TRACEPARENT,
    FailureKind,
    Flight,
    NodeState,
    Parsed,
    ProxyError,
    ReplyAccumulator,
    RequestNote,
    admit,
    body_model,
    cached_tokens,
    check_model,
    choose,
    is_event_stream,
    nobody,
    note_choice,
    overloaded,
    parse_routed,
    passthrough_req,
    policy_override,
    request_closed,
    request_id,
    safe_path,
    salted_body,
    settle,
    shutting_down,
    takes_cache_salt,
    tenant_salt,
    too_large,
    traced,
    unavailable,
)
from prefix_router.pool import Worker
from prefix_router.protocol import MATCH_HEADER, POLICY_HEADER, REQUEST_ID_HEADER, WORKER_HEADER, Endpoint
from prefix_router.routing import Decision, Outcome, RouteRequest

log = logging.getLogger(__name__)
ADDRESSES_CACHED = 4096  # worker URL -> host:port, parsed once (more workers: parsed again, not kept)
MESSAGE_KINDS = tuple(f.name for f in ext.ProcessingRequest.DESCRIPTOR.oneofs_by_name["request"].fields)
PREFILLER_HEADER = "x-prefiller-host-port"  # llm-d's: where the decode pod's sidecar sends the prefill
ENDPOINTS: dict[str, Endpoint] = {"/v1/chat/completions": "chat", "/v1/completions": "completions"}
Answers = list[ext.ProcessingResponse]


def body_buffer_full(retry_after: int) -> ProxyError:
    """503: the body bytes held across streams are at ``EppSettings.max_buffered_bytes``."""
    message = "the router holds as many request bodies as it may; retry later"
    return ProxyError(
        503, message, type="service_unavailable", code="body_buffer_full", retry_after=retry_after
    )


def address_of(worker: Worker) -> str:
    """A worker's ``host:port`` as the gateway dials it (``ORIGINAL_DST``: workers named by IP)."""
    return _address(worker.url)


@functools.lru_cache(maxsize=ADDRESSES_CACHED)
def _address(url: str) -> str:
    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    host = parts.hostname or ""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


@dataclass(slots=True)
class Edge:
    """What every stream of one picker shares: the node's state (``node.build_app``) and the picker's
    knobs."""

    state: NodeState
    settings: EppSettings
    streams: int = 0  # open ext_proc streams
    # ext_proc messages received, by kind (the six of ``ProcessingRequest``): the picker's cost driver
    messages: dict[str, int] = field(default_factory=lambda: dict.fromkeys(MESSAGE_KINDS, 0))
    buffered: int = 0  # body bytes held by all streams (at most ``budget``)
    # streams the picker ended or refused, by reason (``phases.CUT_REASONS``)
    cut: dict[str, int] = field(default_factory=lambda: dict.fromkeys(CUT_REASONS, 0))

    @property
    def budget(self) -> int:
        """The body bytes all streams may hold at once (``EppSettings.max_buffered_bytes``)."""
        explicit = self.settings.max_buffered_bytes
        return explicit if explicit is not None else BUFFERED_BODIES * self.state.config.limits.max_body_bytes

    def hold(self, size: int) -> bool:
        """Take ``size`` bytes of the budget; False (nothing taken) when they do not fit."""
        if self.buffered + size > self.budget:
            return False
        self.buffered += size
        return True

    def addresses(self) -> dict[str, str]:
        """``host:port`` -> worker name, for the pool as it is now."""
        return {address_of(w): w.name for w in self.state.pool}


@dataclass(slots=True)
class Pick:
    """The request's flight on the worker chosen, and how its response is read."""

    flight: Flight
    reply: ReplyAccumulator
    stream: bool
    status: int = 0
    body: list[bytes] = field(default_factory=list)  # a whole (not SSE) response, up to the buffer cap
    size: int = 0
    first: bool = False
    connect_failed: bool = False  # the gateway could not connect to the worker
    began: bool = False  # the response's first message (headers, or a body without them) was read


class PickerStream:
    """One ext_proc stream: ``answer(message)`` returns what to send back, in order; ``close()`` when the
    stream ends, however it ends."""

    def __init__(self, edge: Edge) -> None:
        self.edge = edge
        self.state = edge.state
        self.headers: CIMultiDict[str] = CIMultiDict()
        self.chunks: list[bytes] = []
        self.size = 0
        self.body_streamed = False
        self.buffered = False  # the gateway sends the request body BUFFERED (its protocol_config says)
        # the gateway's response body mode (its protocol_config; None: not said): FULL_DUPLEX_STREAMED is
        # echoed chunk by chunk, NONE settles at the response headers when no body follows
        self.response_body_mode: int | None = None
        self.subset: list[str] | None = None
        self.note: RequestNote | None = None
        self.pick: Pick | None = None
        self.done = False  # an immediate response was sent, or the response settled
        self.final_status = CLIENT_GONE
        self.started = self.state.clock()
        self.held = 0  # body bytes this stream holds of the edge's budget (``Edge.hold``)
        self.late = False  # the response's deadline passed (``expired``)
        self.prefill: Decision | None = None  # a disaggregated request's prefill stage (``choose``)
        self.prefill_flight: Flight | None = None

    @property
    def phase(self) -> Phase:
        """Where the exchange stands (``phases``): what the picker waits for next."""
        if self.done:
            return Phase.DONE
        if self.pick is not None:
            return Phase.RESPONSE if self.pick.began else Phase.WAITING
        return Phase.HEADERS if self.note is None else Phase.BODY

    def hold(self, size: int) -> bool:
        """Hold ``size`` more body bytes, within the edge's budget."""
        if not self.edge.hold(size):
            return False
        self.held += size
        return True

    def release(self) -> None:
        """Give back every body byte this stream holds (the request body sent on, or the stream over)."""
        self.edge.buffered -= self.held
        self.held = 0
        self.chunks = []

    # ------------------------------------------------------------------ the request

    async def answer(self, message: ext.ProcessingRequest) -> Answers:
        kind = message.WhichOneof("request")
        if kind is not None:
            self.edge.messages[kind] += 1
        if self.done and kind not in ("response_body", "response_trailers", "response_headers"):
            return []
        try:
            if kind == "request_headers":
                return await self.request_headers(message)
            if kind == "request_body":
                return await self.request_body(message.request_body)
            if kind == "request_trailers":
                return [*await self.decide(trailers=True), extproc.continue_trailers(False)]
        except ProxyError as err:
            return [self.refuse(err)]
        except Exception:  # a bug, not the client's fault: still an OpenAI-shaped answer, and logged
            log.exception("unexpected error on request %s", self.note.request_id if self.note else "-")
            return [
                self.refuse(
                    ProxyError(500, "internal router error", type="server_error", code="internal_error")
                )
            ]
        if kind == "response_headers":
            return [self.response_headers(message)]
        if kind == "response_body":
            return self.response_body(message)
        if kind == "response_trailers":
            self.settle()
            return [extproc.continue_trailers(True)]
        return []

    async def request_headers(self, message: ext.ProcessingRequest) -> Answers:
        self.headers = CIMultiDict(extproc.header_map(message.request_headers))
        self.subset = extproc.subset_hint(message)
        self.response_body_mode = extproc.response_body_mode(message)
        rid = request_id(self.headers) or self.state.next_request_id()
        path = self.headers.get(":path", "")
        self.note = RequestNote(rid, self.headers.get(":method", "GET"), path.split("?", 1)[0], self.started)
        traced(self.state, self.note, self.headers)
        admit(self.state, self.headers)
        if self.note.trace is not None:
            self.note.trace.stage("admitted")
        length = self.headers.get("content-length")
        limit = self.state.config.limits.max_body_bytes
        if length is not None and length.isdigit() and int(length) > limit:
            raise too_large(limit)
        if message.request_headers.end_of_stream:
            return await self.decide()
        if extproc.buffered_request(message):  # the body comes whole next; the choice goes with its answer
            self.buffered = True
            answer = extproc.continue_headers(False)
            self.response_mode(answer, request_body=extproc.BUFFERED)
            return [answer]
        return []

    async def request_body(self, body: ext.HttpBody) -> Answers:
        self.body_streamed = True
        self.size += len(body.body)
        limit = self.state.config.limits.max_body_bytes
        if self.size > limit:
            raise too_large(limit)
        if not self.hold(len(body.body)):
            self.edge.cut["body_budget"] += 1
            raise body_buffer_full(self.retry_after)
        self.chunks.append(body.body)
        if body.end_of_stream:
            return await self.decide()
        return []

    async def decide(self, trailers: bool = False) -> Answers:
        """The whole body is here: parse, choose, answer the headers, stream the body back (its end said
        by the trailers that follow, with ``trailers``)."""
        if self.pick is not None:
            return []
        raw = b"".join(self.chunks)
        self.release()
        path = self.headers.get(":path", "")
        if not path.startswith("/v1/"):
            raise ProxyError(404, f"no route for {path.split('?', 1)[0][:64]!r}", code="not_found")
        if not safe_path(path):
            raise ProxyError(400, "invalid request path", code="invalid_path")
        endpoint = ENDPOINTS.get(path.split("?", 1)[0]) if self.headers.get(":method") == "POST" else None
        parsed = await self.parse(endpoint, raw) if endpoint is not None else None
        if parsed is not None:
            model = parsed.body.get("model")
            model = model if isinstance(model, str) else None
        else:
            model = body_model(raw, self.headers.get("content-type", ""))
        policy = policy_override(self.state, self.headers) if parsed is not None else PASSTHROUGH_POLICY
        req = parsed.req if parsed is not None else passthrough_req(self.state)
        assert self.note is not None
        check_model(self.state, model, self.note)
        worker, decision, others = self.choose(req, model, policy, parsed is not None)
        flight = Flight(self.state, worker, req, decision, parsed, self.started)
        prefill = self.prefill_stage(req, parsed)
        config = self.state.request_config
        self.pick = Pick(
            flight,
            ReplyAccumulator(endpoint, config.max_generated_chars, config.max_sse_line_bytes),
            parsed.stream if parsed is not None else False,
        )
        set_headers = {extproc.DESTINATION_HEADER: ",".join([address_of(worker), *others])}
        if prefill is not None:
            set_headers[PREFILLER_HEADER] = address_of(prefill)
        removed = [POLICY_HEADER, PREFILLER_HEADER, *self.upstream_headers(set_headers, worker)]
        if self.note.trace is not None:  # the engine's span is a child of the attempt's
            set_headers[TRACEPARENT] = self.note.trace.attempt(worker.name)
        salted = self.salted(parsed, worker)
        if salted is not None:  # the body changed: its length too
            raw = salted
            set_headers["content-length"] = str(len(raw))
        answer = extproc.destination(set_headers, removed)
        if not self.buffered:  # the answer to the request headers: the response side can be chosen here
            self.response_mode(answer)
        if self.buffered:  # BUFFERED: the choice answers the body message, the body changed only if salted
            return [extproc.as_body_answer(answer, raw if salted is not None else None)]
        if not self.body_streamed:  # the headers ended the request: nothing to stream back
            return [answer]
        return [answer, *extproc.body_chunks(raw, end=not trailers)]

    def prefill_stage(self, req: RouteRequest, parsed: Parsed | None) -> Worker | None:
        """The prefill worker of a disaggregated request (dispatched: the index learns it), or None."""
        if self.prefill is None:
            return None
        worker = self.state.pool.require(self.prefill.worker)
        prefill_req = dataclasses.replace(req, route_id=req.route_id + "/prefill", session=None)
        self.prefill_flight = Flight(self.state, worker, prefill_req, self.prefill, parsed, self.started)
        if self.note is not None:
            self.note.prefill_worker = worker.name
        return worker

    def prefill_done(self, ok: bool) -> None:
        """The decode's response began (ok: a 2xx, the prefill done) or the request ended without one."""
        flight, self.prefill_flight = self.prefill_flight, None
        if flight is None:
            return
        if ok:
            self.state.router.first_token(flight.req.route_id, self.state.clock())
        flight.finish(200 if ok else CLIENT_GONE, Outcome(ok=ok))

    async def parse(self, endpoint: Endpoint, raw: bytes) -> Parsed:
        """Keyed as ``serve`` keys it (``parse_routed``: tenant, session, cache salt, precise render)."""
        parsed = await parse_routed(self.state, endpoint, raw, self.headers)
        if self.note is not None and self.note.trace is not None:
            self.note.trace.keyed(parsed.req.key_tokens, len(parsed.req.blocks))
        return parsed

    def choose(
        self, req: RouteRequest, model: str | None, policy: str | None, routed: bool
    ) -> tuple[Worker, Decision, list[str]]:
        """The routing core's choice among the eligible workers (the pool's candidates, within the subset
        hint), and the fallbacks after it."""
        state, note = self.state, self.note
        assert note is not None
        names = state.pool.candidates(model, state.request_config.max_in_flight_per_worker)
        if self.subset is not None:
            names = self.within_subset(names)
        if not names:
            if self.subset is not None:
                raise overloaded("every eligible worker is at its in-flight cap", self.retry_after)
            raise nobody(state, model)
        label = policy or state.request_config.policy
        if routed and state.pool.disaggregated:
            worker, decision, names = self.choose_pd(req, names, policy, label)
        else:
            worker, decision = choose(state, req, names, policy, label if routed else None, note)
        note.policy = label if routed else PASSTHROUGH_POLICY
        others = sorted((n for n in names if n != decision.worker), key=state.pool.in_flight)
        fallbacks = [address_of(state.pool.require(n)) for n in others[: self.edge.settings.fallbacks]]
        return worker, decision, fallbacks

    def choose_pd(
        self, req: RouteRequest, names: list[str], policy: str | None, label: str
    ) -> tuple[Worker, Decision, list[str]]:
        """Both stages (``Router.route_pd``): the decode worker, its decision and the workers its fallbacks
        come from (the decode-capable ones); the prefill decision kept in ``prefill``."""
        state, note = self.state, self.note
        assert note is not None
        prefill, decode = state.pool.split(names)
        pd = state.router.route_pd(
            req,
            prefill,
            decode,
            state.clock(),
            skip_prefill_tokens=state.config.disaggregation.skip_prefill_tokens,
            policy=policy,
        )
        # the decode is dispatched at once (charged at the choice), its prompt predicted handed over
        chosen = pd.decode if pd.prefill is None else state.router.handed_over(req, pd.decode)
        note_choice(state, chosen, label, note, req)
        self.prefill = pd.prefill
        note.pd = "split" if pd.skipped is None else str(pd.skipped)
        state.metrics.pd_requests.inc((note.pd,))
        return state.pool.require(chosen.worker), chosen, decode or prefill

    def within_subset(self, names: list[str]) -> list[str]:
        """``names`` within the gateway's subset hint (503 when no worker of the subset is available)."""
        assert self.subset is not None
        by_address = self.edge.addresses()
        allowed = {by_address[a] for a in self.subset if a in by_address}
        if not any(self.state.pool.require(n).available for n in allowed):
            raise unavailable("no eligible endpoint in the gateway's subset", self.retry_after)
        return [n for n in names if n in allowed]

    @property
    def retry_after(self) -> int:
        return self.state.config.limits.retry_after_s

    def salted(self, parsed: Parsed | None, worker: Worker) -> bytes | None:
        """``tenants.cache_salt``: the body with the client's ``cache_salt`` for the chosen worker (a vLLM
        one; a client with a key), so that the engine's prefix cache is not shared across tenants, as
        ``serve`` sends it (``salted_body``). None: the body goes unchanged."""
        if parsed is None or not self.state.config.tenants.cache_salt or not takes_cache_salt(worker):
            return None
        salt = tenant_salt(self.headers)
        return None if salt is None else salted_body(parsed.body, salt, parsed.raw)

    def upstream_headers(self, set_headers: dict[str, str], worker: Worker) -> list[str]:
        """The worker's own key replaces the client's (or the client's is dropped, as ``serve`` does
        unless ``tenants.forward_client_auth``); the request's id goes upstream. Returns the headers to
        remove."""
        assert self.note is not None
        removed = []
        if worker.api_key is not None:
            set_headers["authorization"] = f"Bearer {worker.api_key.get_secret_value()}"
        elif not self.state.config.tenants.forward_client_auth and "authorization" in self.headers:
            removed.append("authorization")
        set_headers[REQUEST_ID_HEADER] = self.note.request_id
        return removed

    def response_mode(self, answer: ext.ProcessingResponse, request_body: int = 0) -> None:
        """The response side this request needs (``extproc.RESPONSE_MODE``), unless the gateway sends its
        body FULL_DUPLEX_STREAMED (Envoy would ignore the override)."""
        if self.response_body_mode != extproc.DUPLEX:
            extproc.response_mode(answer, request_body)

    def refuse(self, err: ProxyError) -> ext.ProcessingResponse:
        """An immediate OpenAI error answer; counted as ``serve`` counts its refusals."""
        self.state.metrics.rejected.inc((str(err.status),))
        self.done, self.final_status = True, err.status
        self.release()
        headers = {} if err.retry_after is None else {"retry-after": str(err.retry_after)}
        if self.note is not None:
            headers[REQUEST_ID_HEADER] = self.note.request_id
        return extproc.immediate(err.status, err.body(), headers, f"prefix_router_{err.code or err.status}")

    # ------------------------------------------------------------------ the response

    def response_headers(self, message: ext.ProcessingRequest) -> ext.ProcessingResponse:
        pick = self.pick
        if pick is None:
            return extproc.continue_headers(True)
        headers = CIMultiDict(extproc.header_map(message.response_headers))
        status = headers.get(":status", "0")
        self.response_began(message, int(status) if status.isdigit() else 0)
        pick.stream = is_event_stream(headers)
        if message.response_headers.end_of_stream:
            self.settle()
        answer = extproc.continue_headers(True)
        if self.state.config.tenants.decision_headers:
            shown = {WORKER_HEADER: pick.flight.worker.name}
            if pick.flight.parsed is not None:
                shown[MATCH_HEADER] = str(pick.flight.decision.predicted_tokens)
            answer.response_headers.response.header_mutation.CopyFrom(extproc.mutation(shown))
        return answer

    def response_began(self, message: ext.ProcessingRequest, status: int) -> None:
        """The first message of the response (its headers, or its first body message when the headers are
        skipped): its status, the endpoint that served it, whether the connection to it failed."""
        pick = self.pick
        assert pick is not None
        pick.status, pick.began = status, True
        self.prefill_done(200 <= status < 300)
        self.served(extproc.served_endpoint(message))
        pick.connect_failed = extproc.connect_failed(message)

    def served(self, endpoint: str | None) -> None:
        """The gateway used ``endpoint``: when it is not the worker chosen (a fallback), the flight moves
        to the worker it names (its prediction void: nothing was matched there)."""
        pick = self.pick
        if pick is None or endpoint is None or endpoint == address_of(pick.flight.worker):
            return
        name = self.edge.addresses().get(endpoint)
        worker = self.state.pool.get(name) if name is not None else None
        if worker is None:
            return
        old = pick.flight
        old.finish(0, Outcome(ok=False))
        decision = Decision(worker.name, old.decision.branch)
        pick.flight = Flight(self.state, worker, old.req, decision, old.parsed, old.started)
        if self.note is not None:
            self.note.worker, self.note.attempts = worker.name, self.note.attempts + 1

    def response_body(self, message: ext.ProcessingRequest) -> Answers:
        """A response body message. Without its headers (the gateway's ``response_header_mode: SKIP``)
        the first one carries the status and the endpoint as attributes; the body is then read as the
        request asked (an event stream for a streamed 2xx, else whole), and sent back when the gateway
        streams it FULL_DUPLEX_STREAMED."""
        pick, body = self.pick, message.response_body
        if pick is not None and not pick.began:
            self.response_began(message, extproc.response_status(message))
            pick.stream = pick.stream and 200 <= pick.status < 300
        data = body.body
        if pick is not None and data:
            if not pick.first:
                pick.first = True
                assert self.note is not None
                self.note.ttft_s = pick.flight.first_byte(pick.status)
                if self.note.trace is not None:
                    self.note.trace.first_byte(pick.status)
            if pick.stream:
                pick.reply.feed(data)
            elif pick.size <= self.cap:
                self.keep(pick, data)
        if self.response_body_mode == extproc.DUPLEX:  # FULL_DUPLEX_STREAMED: the chunk sent back as it came
            answers = list(extproc.body_chunks(data, response=True, end=body.end_of_stream))
        else:  # STREAMED or BUFFERED: read, passed on unchanged
            answers = [extproc.body_continue()]
        if body.end_of_stream:
            self.settle()
        return answers

    def settle(self) -> None:
        """The response is over: learn from it as ``serve`` does (a 2xx only), once."""
        pick = self.pick
        if pick is None or self.done:
            return
        self.done = True
        status, flight = pick.status, pick.flight
        self.final_status = status
        trace = self.note.trace if self.note is not None else None
        if status >= 500:
            kind = FailureKind.CONNECT if pick.connect_failed else FailureKind.STATUS
            flight.fail(kind, status, f"HTTP {status}")
            if trace is not None:
                trace.attempt_failed(str(kind), status)
            return
        ok = 200 <= status < 300
        if ok and not pick.stream and flight.parsed is not None and pick.size <= self.cap:
            pick.reply.feed_body(b"".join(pick.body))
        pick.body = []
        self.release()
        settle(self.state, flight, pick.reply, status, ok=ok)
        if trace is not None:
            trace.answered(cached_tokens(pick.reply.usage_body, flight.worker.adapter), ok)

    def keep(self, pick: Pick, data: bytes) -> None:
        """Keep a chunk of a whole response to learn from at its end, within the edge's budget (over it:
        the response is no longer kept, as one over the cap)."""
        if self.hold(len(data)):
            pick.body.append(data)
            pick.size += len(data)
        else:
            pick.body, pick.size = [], self.cap + 1
            self.release()

    @property
    def cap(self) -> int:
        return self.state.config.limits.max_response_buffer_bytes

    def expired(self, shutdown: bool, timeout_s: float) -> ext.ProcessingResponse | None:
        """The current phase's deadline passed (``phases``): the answer for a request still being read
        (408, or 503 when the drain ``shutdown`` cut it); None when the response is late (its flight ends
        as a timeout, its in-flight slot freed) or the stream was answered already."""
        phase = self.phase
        if phase in (Phase.HEADERS, Phase.BODY):
            self.edge.cut["header_timeout" if phase is Phase.HEADERS else "body_timeout"] += 1
            if shutdown:
                return self.refuse(shutting_down(self.retry_after))
            what = "headers" if phase is Phase.HEADERS else "body"
            message = f"request {what} not received within {timeout_s:g} s"
            return self.refuse(ProxyError(408, message, code="request_timeout"))
        if phase is not Phase.DONE and self.pick is not None:
            self.edge.cut["response_timeout"] += 1
            self.done = self.late = True
            self.pick.flight.fail(FailureKind.TIMEOUT, 504, "the response did not arrive in time")
            self.final_status = 504
        return None

    def close(self) -> None:
        """The stream ended: a response not settled is a client gone (or the gateway's stream cut), except
        one whose headers came and whose body the gateway does not send (NONE, the override not applied):
        that one is over."""
        self.release()
        self.prefill_done(False)
        pick = self.pick
        if pick is not None and pick.began and not pick.first and self.response_body_mode == extproc.NO_BODY:
            self.settle()
        if self.pick is not None and not self.done:
            self.done = True
            self.pick.flight.finish(CLIENT_GONE, Outcome(ok=False))
            self.final_status = CLIENT_GONE
        if self.note is not None:
            request_closed(self.state, self.note, self.final_status)
            self.note = None
