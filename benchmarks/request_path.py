"""The proxy's own request path in-process: what the router's ``chat_completions`` handler costs in CPU
per request, apart from the HTTP server, the sockets and the kernel.

The app ``serve`` builds (``create_app`` on the default config, one worker serving the benchmark's model,
the process's log handler as ``serve`` configures it, its lines written to ``/dev/null``), its handler of
``POST /v1/chat/completions`` resolved by the app's own router, fed the benchmark's own requests
(``bench.overhead.bodies``: a shared system prompt of ``--prompt-chars``, a question of each request's own)
as aiohttp's server makes them, on an in-memory connection that drops what is written to it, against an
upstream seam that answers at once (the instant worker's answers). Beside it, a forward-only handler on
the same stack (aiohttp's request and response, the same seam: read, send, relay): the difference is the
proxy's own path (its layers, parsing, the key, the decision, the exchange, accounting, metrics, the
access line), routing core included. Timed with ``time.thread_time_ns`` (the thread's CPU time:
preemption by the rest of the machine does not count), rounds alternating between the two handlers,
medians over rounds.

The process does nothing else, so its caches are hot: a lower bound of the same calls inside a server.
What this leaves out (the HTTP server, the upstream client's I/O, the kernel) ``benchmarks/floor.py``
measures with forward-only servers on the same stack. ``--before DIR`` runs the script alternately with
``DIR`` (a tree's ``src`` or a compiled build) and with this process's ``PYTHONPATH``, each cell the
median of ``--runs``.

    python benchmarks/request_path.py --prompt-chars 2000,32000 --cycles 3000
    PYTHONPATH=$(scripts/build-compiled.sh) python benchmarks/request_path.py --before OTHER_BUILD --runs 5
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import random
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Mapping

import orjson
from aiohttp import StreamReader, web
from aiohttp.http_writer import StreamWriter
from aiohttp.test_utils import make_mocked_request
from multidict import CIMultiDict, CIMultiDictProxy

from prefix_router.lab.bench.connection import MemoryTransport, ServerSide
from prefix_router.lab.bench.instant_worker import MODEL, _event, _whole
from prefix_router.lab.bench.overhead import bodies
from prefix_router.node import (
    HOP_BY_HOP,
    STATE,
    Config,
    UpstreamRequest,
    UpstreamResponse,
    configure_logs,
    loop_factory,
)
from prefix_router.proxy import create_app
from prefix_router.routing import PrefixIndex

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

WHOLE = _whole(True)
EVENTS = [_event(True)] * 8 + [b"data: [DONE]\n\n"]


def app_for(stream: bool) -> web.Application:
    """The app ``serve`` builds on the default config, one worker (healthy) serving the benchmark's model,
    its upstream answering at once; the process's log handler as ``serve`` configures it, its lines written
    to ``/dev/null``."""
    configure_logs("info")
    for handler in logging.root.handlers:
        if isinstance(handler, logging.StreamHandler):
            handler.setStream(open(os.devnull, "w"))  # noqa: SIM115 (lives with the run)
    config = Config.model_validate(
        {
            "workers": [{"url": "http://127.0.0.1:9", "name": "w0", "models": [MODEL]}],
            "routing": {"policy": "prefix"},
        }
    )
    app = create_app(config, upstream=InstantUpstream(stream), rng=random.Random(0))
    state = app[STATE]
    for worker in state.pool:
        state.pool.report(worker, True, "")
    return app


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
    kept = [(k, v) for k, v in answer.headers.items() if k.lower() not in HOP_BY_HOP]
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


HANDLERS = ("router", "forward_only")
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class HandlerBench:
    """The app, an in-memory client connection and requests for the handlers (``HANDLERS``: the app's own
    for the path, resolved once by its router as aiohttp's server resolves it, and ``forward_only``), made
    as aiohttp's server makes them, against an upstream seam that answers at once."""

    def __init__(self, stream: bool) -> None:
        self.loop = asyncio.get_running_loop()
        self.app = app_for(stream)
        self.state = self.app[STATE]
        self.app.freeze()
        self.transport = MemoryTransport(keep=False)
        self.protocol = ServerSide(self.loop)
        self.protocol.connection_made(self.transport)
        self.handlers: dict[str, Handler] = {"forward_only": forward_only}

    async def resolve(self) -> None:
        """The app's handler of ``POST /v1/chat/completions``, as its router resolves the path."""
        match = await self.app.router.resolve(self.request_for(b"{}"))
        self.handlers["router"] = match.handler

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
        handler = self.handlers[name]
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
    await bench.resolve()
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
    """One row per prompt size and kind: the two handlers' CPU us per request (``router``,
    ``forward_only``)."""
    rows: list[dict[str, object]] = []
    for chars in (int(c) for c in args.prompt_chars.split(",")):
        for stream in (False, True):
            sent = bodies(args.cycles + args.warm, chars, stream)
            with asyncio.Runner(loop_factory=loop_factory("uvloop")) as runner:
                found = runner.run(handler_cycles(sent, stream, args.warm, args.rounds))
            rows.append({"prompt": chars, "kind": "stream" if stream else "plain", **found})
    return rows


def build_name() -> str:
    """``pure`` or ``compiled``: whether the routing core's index module came from source."""
    path = sys.modules[PrefixIndex.__module__].__file__
    return "pure" if path and path.endswith(".py") else "compiled"


def side_by_side(args: argparse.Namespace) -> list[tuple[str, list[dict[str, object]]]]:
    """``--before DIR``: this script run ``--runs`` times on each side, alternating, in child processes
    (``before``: ``DIR`` first on ``PYTHONPATH``; ``after``: this process's path); each cell the median
    over the runs."""
    argv = [sys.executable, __file__, "--json", "--prompt-chars", args.prompt_chars, "--cycles",
            str(args.cycles), "--warm", str(args.warm), "--rounds", str(args.rounds)]  # fmt: skip
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


def show(label: str, rows: list[dict[str, object]]) -> None:
    for row in rows:
        head = f"| {row['prompt']:,} | {row['kind']} | {label} |"
        ours, floor = float(row["router"]), float(row["forward_only"])  # type: ignore[arg-type]
        print(f"{head} {ours:.1f} | {floor:.1f} | {ours - floor:.1f} |")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--prompt-chars", default="2000,32000")
    p.add_argument("--cycles", type=int, default=3000, help="timed request cycles per setting")
    p.add_argument("--warm", type=int, default=300)
    p.add_argument("--handler", action="store_true", help=argparse.SUPPRESS)  # the only mode (older commands)
    p.add_argument("--rounds", type=int, default=5, help="alternating rounds (medians)")
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
    print("| prompt | kind | side | router's handler | forward-only handler | router over forward-only |")
    print("|---:|---|---|---:|---:|---:|")
    for label, rows in sides:
        show(label, rows)


if __name__ == "__main__":
    main()
