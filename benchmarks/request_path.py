"""The proxy's own request path, stage by stage, in-process (issue 26): what each step of a request's trip
costs in CPU, apart from the HTTP server, the sockets and the routing core's per-block work.

The same objects ``serve`` builds (``node.life.build.build_state`` on the default config, one worker serving
the benchmark's model), fed the benchmark's own requests (``bench.overhead.bodies``: a shared system prompt of
``--prompt-chars``, a question of each request's own) and the instant worker's answers. Every cycle runs
the proxy's calls for one request, each stage timed with ``time.thread_time_ns`` (the thread's CPU time:
preemption by the rest of the machine does not count):

- ``validation``: the request id, the ``RequestNote``, ``admit`` (shutdown, client key, in-flight cap), the
  session header, the policy header, the path check, the model check;
- ``json``: the body's JSON parse and its ``stream`` flag;
- ``key``: the routing key (``keys.build``; the routing core: compiled in the compiled build);
- ``route``: the decision (``Router.route`` over the worker) and the branch metrics;
- ``headers``: the upstream request's headers and URL, the response's headers;
- ``deadlines``: the first-byte ``Deadlines.watch`` entered and left (and, for streams, the idle watch and
  its pushes), inside a running event loop;
- ``read_body``: the body taken from aiohttp's ``StreamReader`` (all of it came with the head, as a
  2 KB or 32 KB body on loopback does) with its limits and its timeout;
- ``accounting``: the ``Flight`` (``dispatched``), its first byte, the reply read back
  (``ReplyAccumulator.feed_body``, or ``feed`` and ``EventHold`` over the stream's events: the SSE
  reader) and ``settle`` (the extension key and ``finished``: routing core calls inside);
- ``metrics``: the request's and the attempt's counters and latency histograms;
- ``access_log``: the access line, written by the serving process's ``LineHandler`` to ``/dev/null``.

The process does nothing else, so its caches are hot: a lower bound of the same calls inside a server.
What this leaves out (the HTTP server, the upstream client's I/O, the kernel) ``benchmarks/floor.py``
measures with forward-only servers on the same stack.

``--handler`` times the router's whole ``chat_completions`` handler instead (its own layers included:
``guarded``, parsing, ``Exchange``, the response written to a connection that drops it), against an
upstream seam that answers at once, beside a forward-only handler on the same stack (aiohttp's request
and response, the same seam: read, send, relay). ``--before DIR`` runs the script alternately with ``DIR``
(a tree's ``src`` or a compiled build) and with this process's ``PYTHONPATH``, each cell the median of
``--runs``.

    python benchmarks/request_path.py --prompt-chars 2000,32000 --cycles 3000
    PYTHONPATH=$(scripts/build-compiled.sh) python benchmarks/request_path.py   # the compiled core
    PYTHONPATH=$(scripts/build-compiled.sh) python benchmarks/request_path.py --handler --before OTHER_BUILD
"""

from __future__ import annotations

import argparse
import asyncio
import io
import logging
import os
import random
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

import orjson
from aiohttp import StreamReader, web
from aiohttp.base_protocol import BaseProtocol
from aiohttp.http_writer import StreamWriter
from aiohttp.test_utils import make_mocked_request
from multidict import CIMultiDict, CIMultiDictProxy

from prefix_router.lab.bench.connection import MemoryTransport, ServerSide
from prefix_router.lab.bench.instant_worker import MODEL, _event, _whole
from prefix_router.lab.bench.overhead import bodies
from prefix_router.node import (
    Config,
    Parsed,
    ReplyAccumulator,
    RequestNote,
    build_app,
    loop_factory,
    request_id,
    settle,
)
from prefix_router.node.request import forward
from prefix_router.node.request.access import log_access
from prefix_router.node.request.parse import read_body
from prefix_router.node.state import STATE, NodeState
from prefix_router.node.steps.accounting import Flight
from prefix_router.node.telemetry.logs import LineHandler
from prefix_router.node.upstream.seam import UpstreamRequest, UpstreamResponse
from prefix_router.proxy.edge import handlers as handlers_module
from prefix_router.proxy.edge.exchange import EventHold
from prefix_router.proxy.edge.handlers import admit
from prefix_router.proxy.edge.request import EdgeRequest

STAGES = (
    "validation",
    "read_body",
    "json",
    "key",
    "route",
    "headers",
    "deadlines",
    "accounting",
    "metrics",
    "access_log",
)
PATH = "/v1/chat/completions"
REQUEST_HEADERS = {
    "Host": "127.0.0.1:9000",
    "Content-Type": "application/json",
    "Content-Length": "2100",
    "Accept": "application/json",
    "User-Agent": "OpenAI/Python 1.0",
    "Authorization": "Bearer unused",
}
WORKER_HEADERS = {"Content-Type": "application/json", "Content-Length": "180", "Date": "x", "Server": "y"}


PROTOCOL: BaseProtocol | None = None


class _Request:
    """What the stages read of an aiohttp request: its headers and its body's stream, fed whole."""

    def __init__(self, raw: bytes) -> None:
        self.headers = CIMultiDictProxy(CIMultiDict(REQUEST_HEADERS))
        self.content_length = len(raw)
        self.content = StreamReader(PROTOCOL, 2**16, loop=asyncio.get_running_loop())
        self.content.feed_data(raw)
        self.content.feed_eof()


def state_for() -> NodeState:
    return app_for()[STATE]


def app_for() -> web.Application:
    """The app ``serve`` builds (no routes: the benchmark calls the handlers) on the default config, one
    worker serving the benchmark's model, access lines written by a ``LineHandler`` to ``/dev/null``."""
    config = Config.model_validate(
        {
            "workers": [{"url": "http://127.0.0.1:9", "name": "w0", "models": [MODEL]}],
            "routing": {"policy": "prefix"},
        }
    )
    app = build_app(config, None, None, time.monotonic, random.Random(0))
    state = app[STATE]
    for worker in state.pool:
        state.pool.report(worker, True, "")
    handler = LineHandler(io.TextIOWrapper(open("/dev/null", "wb")))  # noqa: SIM115 (lives with the run)
    logging.root.handlers[:] = [handler]
    logging.root.setLevel(logging.INFO)
    state.log_handler = handler
    return app


class Timer:
    """CPU time per stage; the timer's own cost (an empty stage, measured first) taken off each use."""

    def __init__(self, overhead_ns: float = 0.0) -> None:
        self.ns = dict.fromkeys(STAGES, 0.0)
        self.overhead_ns = overhead_ns

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        start = time.thread_time_ns()
        yield
        self.ns[name] += time.thread_time_ns() - start - self.overhead_ns


def timer_overhead(n: int = 20_000) -> float:
    """Mean CPU ns of an empty ``Timer.stage``."""
    t = Timer()
    for _ in range(n):
        with t.stage("json"):
            pass
    return t.ns["json"] / n


async def cycle(state: NodeState, raw: bytes, stream: bool, t: Timer) -> None:
    request = _Request(raw)
    loop = asyncio.get_running_loop()
    with t.stage("validation"):
        headers = request.headers
        rid = request_id(headers) or state.next_request_id()
        note = RequestNote(rid, "POST", "/v1/chat/completions", state.clock())
        admit(state, EdgeRequest(state, "POST", PATH, PATH, headers, True, True))
        forward.safe_path("/v1/chat/completions")
        state.pool.knows_model(MODEL)
        note.model = MODEL
    with t.stage("read_body"):
        limits = state.config.limits
        got = await read_body(request, limits.max_body_bytes, state.config.timeouts.client_body_s)  # type: ignore[arg-type]
    with t.stage("json"):
        body = orjson.loads(got)
        body.get("stream")
    with t.stage("key"):
        route = state.router.keys.build("chat", body, route_id=state.next_id())
    parsed = Parsed("chat", raw, body, route, stream, None)
    with t.stage("route"):
        names = [w.name for w in state.pool]
        decision = state.router.route(route, names, state.clock(), None)
        state.metrics.branches.inc(("prefix", decision.branch))
        state.metrics.predicted.observe(decision.predicted_tokens)
        worker = state.pool.require(decision.worker)
    with t.stage("accounting"):
        flight = Flight(state, worker, route, decision, parsed, state.clock())
    with t.stage("headers"):
        up = forward.upstream_headers(headers, worker, False, rid)
        forward.upstream_url(worker, "/v1/chat/completions")
    with t.stage("deadlines"):
        async with state.deadlines.watch(worker.name, loop.time() + 60.0):
            pass
    with t.stage("accounting"):
        note.ttft_s = flight.first_byte(200)
    with t.stage("headers"):
        worker_headers = CIMultiDictProxy(CIMultiDict(WORKER_HEADERS))
        forward.downstream_headers(worker_headers, worker.name, decision.predicted_tokens, None, rid)
    reply = ReplyAccumulator(
        "chat", state.config.limits.max_generated_chars, state.config.limits.max_sse_line_bytes
    )
    if stream:
        await relay_stream(state, worker.name, reply, t)
    else:
        with t.stage("accounting"):
            reply.feed_body(WHOLE)
    with t.stage("accounting"):
        settle(state, flight, reply, 200, ok=True)
    with t.stage("metrics"):
        state.metrics.request_done(note.worker, note.model, note.policy, 200)
    with t.stage("access_log"):
        log_access(note, 200, state.clock(), state.log_handler)
    del up


WHOLE = _whole(True)
EVENTS = [_event(True)] * 8 + [b"data: [DONE]\n\n"]


async def relay_stream(state: NodeState, worker: str, reply: ReplyAccumulator, t: Timer) -> None:
    loop = asyncio.get_running_loop()
    with t.stage("deadlines"):
        watch = state.deadlines.watch(worker, loop.time() + 60.0, 60.0)
        await watch.__aenter__()
    held = EventHold(state.config.limits.max_sse_line_bytes)
    for event in EVENTS:
        with t.stage("accounting"):
            reply.feed(event)
            held.whole_events(event)
        with t.stage("deadlines"):
            watch.when  # noqa: B018 (push_idle's read)
    with t.stage("deadlines"):
        await watch.__aexit__(None, None, None)


async def run(state: NodeState, sent: list[bytes], stream: bool, warm: int) -> dict[str, float]:
    global PROTOCOL
    PROTOCOL = BaseProtocol(asyncio.get_running_loop())
    raws = [orjson.dumps(orjson.loads(r.split(b"\r\n\r\n", 1)[1])) for r in sent]
    t = Timer()
    for raw in raws[:warm]:
        await cycle(state, raw, stream, t)
    t = Timer(timer_overhead())
    for raw in raws[warm:]:
        await cycle(state, raw, stream, t)
    n = len(raws) - warm
    return {stage: ns / n / 1e3 for stage, ns in t.ns.items()}


class InstantAnswer:
    """The instant worker's answer as the upstream seam hands it over: its head, then its chunks."""

    __slots__ = ("_chunks", "headers", "status")

    def __init__(self, stream: bool) -> None:
        self.status = 200
        kind = "text/event-stream" if stream else "application/json"
        self.headers: Mapping[str, str] = CIMultiDictProxy(
            CIMultiDict({**WORKER_HEADERS, "Content-Type": kind})
        )
        self._chunks = [b"", *reversed(EVENTS)] if stream else [b"", WHOLE]

    async def next_chunk(self) -> bytes:
        return self._chunks.pop() if self._chunks else b""

    def release(self) -> None:
        pass

    def abort(self) -> None:
        pass


class InstantUpstream:
    """The upstream seam, answered at once (no socket): what the handler does around the exchange."""

    def __init__(self, stream: bool) -> None:
        self.stream = stream

    async def send(self, request: UpstreamRequest) -> UpstreamResponse:
        return InstantAnswer(self.stream)


async def forward_only(request: web.Request) -> web.StreamResponse:
    """A forward-only handler on the same stack: read the body, send it to the worker, relay its answer
    (a whole body, or its chunks as they come), nothing else."""
    app_state = request.app[STATE]
    body = await request.read()
    headers = {"Content-Type": request.headers.get("Content-Type", "")}
    answer = await app_state.upstream.send(
        UpstreamRequest("POST", "http://w/v1/chat/completions", headers, body)
    )
    kept = [(k, v) for k, v in answer.headers.items() if k.lower() not in forward.HOP_BY_HOP]
    first = await answer.next_chunk()
    if not answer.headers.get("Content-Type", "").startswith("text/event-stream"):
        rest = await answer.next_chunk()
        return web.Response(status=answer.status, body=first + rest, headers=kept)
    out = web.StreamResponse(status=answer.status, headers=kept)
    await out.prepare(request)
    while first:
        await out.write(first)
        first = await answer.next_chunk()
    await out.write_eof()
    return out


HANDLERS = {"router": handlers_module.chat_completions, "forward_only": forward_only}


class HandlerBench:
    """The app, an in-memory client connection and requests for the handlers (``HANDLERS``), made as
    aiohttp's server makes them, against an upstream seam that answers at once."""

    def __init__(self, stream: bool) -> None:
        self.loop = asyncio.get_running_loop()
        self.app = app_for()
        self.state = self.app[STATE]
        self.state.upstream = InstantUpstream(stream)
        self.app.freeze()
        self.transport = MemoryTransport(keep=False)
        self.protocol = ServerSide(self.loop)
        self.protocol.connection_made(self.transport)

    def request_for(self, raw: bytes) -> web.Request:
        headers = {**REQUEST_HEADERS, "Content-Length": str(len(raw))}
        payload = StreamReader(self.protocol, 2**16, loop=self.loop)
        payload.feed_data(raw)
        payload.feed_eof()
        writer = StreamWriter(self.protocol, self.loop)
        return make_mocked_request(
            "POST", "/v1/chat/completions", headers=headers, app=self.app, writer=writer,
            protocol=self.protocol, transport=self.transport, payload=payload, loop=self.loop,
        )  # fmt: skip

    async def handle(self, name: str, requests: list[web.Request]) -> None:
        handler = HANDLERS[name]
        for request in requests:
            response = await handler(request)
            if response.status != 200:
                raise RuntimeError(f"{name}: status {response.status}")


def request_bodies(sent: list[bytes]) -> list[bytes]:
    """The bodies of ``bench.overhead.bodies``' requests (which are whole HTTP requests)."""
    return [orjson.dumps(orjson.loads(r.split(b"\r\n\r\n", 1)[1])) for r in sent]


async def handler_cycles(sent: list[bytes], stream: bool, warm: int, rounds: int) -> dict[str, float]:
    """CPU us per request of the router's whole handler (``chat_completions``: admission, parsing, the
    key, the decision, the exchange against an instant upstream, the response written to a connection
    that drops it, accounting, metrics, the access line) and of ``forward_only`` on the same requests,
    rounds alternating; medians over rounds."""
    bench = HandlerBench(stream)
    raws = request_bodies(sent)
    found: dict[str, list[float]] = {name: [] for name in HANDLERS}
    per_round = (len(raws) - warm) // rounds
    for name in HANDLERS:
        await bench.handle(name, [bench.request_for(raw) for raw in raws[:warm]])
    for r in range(rounds):
        part = raws[warm + r * per_round : warm + (r + 1) * per_round]
        for name in HANDLERS:
            requests = [bench.request_for(raw) for raw in part]
            start = time.thread_time_ns()
            await bench.handle(name, requests)
            found[name].append((time.thread_time_ns() - start) / len(part) / 1e3)
    bench.state.log_handler.flush()  # type: ignore[union-attr]
    return {name: statistics.median(values) for name, values in found.items()}


def measure(args: argparse.Namespace) -> list[dict[str, object]]:
    """One row per prompt size and kind: the stages (with ``total``), or with ``--handler`` the two
    handlers' totals (``router``, ``forward_only``)."""
    rows: list[dict[str, object]] = []
    for chars in (int(c) for c in args.prompt_chars.split(",")):
        for stream in (False, True):
            sent = bodies(args.cycles + args.warm, chars, stream)
            with asyncio.Runner(loop_factory=loop_factory("uvloop")) as runner:
                if args.handler:
                    found = runner.run(handler_cycles(sent, stream, args.warm, args.rounds))
                else:
                    found = runner.run(run(state_for(), sent, stream, args.warm))
                    found["total"] = sum(found.values())
            rows.append({"prompt": chars, "kind": "stream" if stream else "plain", **found})
    return rows


def build_name() -> str:
    from prefix_router.routing import index as index_module

    return "pure" if index_module.__file__ and index_module.__file__.endswith(".py") else "compiled"


def side_by_side(args: argparse.Namespace) -> list[tuple[str, list[dict[str, object]]]]:
    """``--before DIR``: this script run ``--runs`` times on each side, alternating, in child processes
    (``before``: ``DIR`` first on ``PYTHONPATH``; ``after``: this process's path); each cell the median
    over the runs."""
    argv = [sys.executable, __file__, "--json", "--prompt-chars", args.prompt_chars, "--cycles",
            str(args.cycles), "--warm", str(args.warm), "--rounds", str(args.rounds)]  # fmt: skip
    if args.handler:
        argv.append("--handler")
    own = os.environ.get("PYTHONPATH", "")
    paths = {"before": args.before, "after": own}
    found: dict[str, list[list[dict[str, object]]]] = {side: [] for side in paths}
    for _ in range(args.runs):
        for side, path in paths.items():
            env = {**os.environ, "PYTHONPATH": path}
            out = subprocess.run(argv, env=env, check=True, capture_output=True, text=True).stdout
            found[side].append(orjson.loads(out.splitlines()[-1]))
    merged = []
    for side, runs in found.items():
        rows = []
        for cells in zip(*runs, strict=True):
            row = dict(cells[0])
            for key, value in row.items():
                if isinstance(value, float):
                    row[key] = statistics.median(float(str(c[key])) for c in cells)
            rows.append(row)
        merged.append((side, rows))
    return merged


def show(label: str, rows: list[dict[str, object]], handler: bool) -> None:
    for row in rows:
        head = f"| {row['prompt']:,} | {row['kind']} | {label} |"
        if handler:
            ours, floor = float(row["router"]), float(row["forward_only"])  # type: ignore[arg-type]
            print(f"{head} {ours:.1f} | {floor:.1f} | {ours - floor:.1f} |")
        else:
            cells = " | ".join(f"{float(row[s]):.1f}" for s in STAGES)  # type: ignore[arg-type]
            total = float(row["total"])  # type: ignore[arg-type]
            own = total - float(row["key"]) - float(row["route"])  # type: ignore[arg-type]
            print(f"{head} {cells} | {total:.1f} | {own:.1f} |")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--prompt-chars", default="2000,32000")
    p.add_argument("--cycles", type=int, default=3000, help="timed request cycles per setting")
    p.add_argument("--warm", type=int, default=300)
    p.add_argument(
        "--handler", action="store_true", help="the whole handler against a forward-only one, not the stages"
    )
    p.add_argument("--rounds", type=int, default=5, help="--handler: alternating rounds (medians)")
    p.add_argument("--before", help="a package directory (a tree's src, a compiled build) to compare with")
    p.add_argument("--runs", type=int, default=3, help="--before: alternating runs per side (medians)")
    p.add_argument("--json", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.json:
        print(orjson.dumps(measure(args)).decode())
        return
    sides = side_by_side(args) if args.before else [(build_name(), measure(args))]
    unit = (
        f"medians of {args.runs} alternating runs per side"
        if args.before
        else f"{args.cycles} cycles per row"
    )
    print(f"build: {build_name()}; us of CPU per request (thread time), {unit}")
    if args.before:
        print(f"before: {args.before}; after: {os.environ.get('PYTHONPATH', '')}")
    if args.handler:
        print("| prompt | kind | side | router's handler | forward-only handler | router over forward-only |")
        print("|---:|---|---|---:|---:|---:|")
    else:
        print("| prompt | kind | side | " + " | ".join(STAGES) + " | total | total without key, route |")
        print("|---:|---|---|" + "---:|" * (len(STAGES) + 2))
    for label, rows in sides:
        show(label, rows, args.handler)


if __name__ == "__main__":
    main()
