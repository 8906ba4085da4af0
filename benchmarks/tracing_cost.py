"""What OpenTelemetry tracing costs the request path: the router's handler in-process, as
``request_path.py`` runs it (the app ``serve`` builds, an upstream seam that answers at once, a connection
that drops what is written), with tracing off (the default: ``NodeState.tracing`` is None) and on (the
SDK; every request sampled, or one in ten; spans exported in batches over OTLP/HTTP to a receiver in
another process that drops them), on the same requests, rounds alternating, medians over rounds.

Two figures per request: the CPU time of the request's thread (``time.thread_time_ns``: the spans made,
their attributes and events, the ``traceparent`` sent upstream; what a request waits for) and of the
whole process (``time.process_time_ns``: also the SDK's export thread, encoding and sending the batches).

    python benchmarks/tracing_cost.py --prompt-chars 2000 --cycles 3000
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import statistics
import subprocess
import sys
import time

from request_path import HandlerBench, request_bodies

from prefix_router.lab.bench.overhead import bodies
from prefix_router.node import loop_factory, tracing_from_env

RECEIVER = """
import sys
from aiohttp import web
async def take(request):
    await request.read()
    return web.Response(body=b"", content_type="application/x-protobuf")
app = web.Application(client_max_size=64 << 20)
app.router.add_post("/v1/traces", take)
web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), print=None)
"""
# tracing off; on, every request sampled; on, one request in ten sampled (the rest: spans that record nothing)
SAMPLERS = {"on": "1", "tenth": "0.1"}
SIDES = ("off", *SAMPLERS)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def cycles(sent: list[bytes], stream: bool, warm: int, rounds: int, port: int) -> dict[str, float]:
    """Medians over rounds of each side's CPU us per request: ``<side>`` (the request's thread) and
    ``<side>_process`` (the whole process)."""
    benches = {side: HandlerBench(stream) for side in SIDES}
    traced = []
    for side, ratio in SAMPLERS.items():
        make = tracing_from_env(
            {
                "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{port}",
                "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
                "OTEL_TRACES_SAMPLER": "traceidratio",
                "OTEL_TRACES_SAMPLER_ARG": ratio,
            }
        )
        assert make is not None
        benches[side].state.tracing = made = make()
        traced.append(made)
    raws = request_bodies(sent)
    found: dict[str, list[float]] = {key: [] for side in SIDES for key in (side, f"{side}_process")}
    per_round = (len(raws) - warm) // rounds
    for bench in benches.values():
        await bench.resolve()
        await bench.handle("router", [bench.request_for(raw) for raw in raws[:warm]])
    for r in range(rounds):
        part = raws[warm + r * per_round : warm + (r + 1) * per_round]
        for side, bench in benches.items():
            requests = [bench.request_for(raw) for raw in part]
            thread, process = time.thread_time_ns(), time.process_time_ns()
            await bench.handle("router", requests)
            found[side].append((time.thread_time_ns() - thread) / len(part) / 1e3)
            found[f"{side}_process"].append((time.process_time_ns() - process) / len(part) / 1e3)
    for made in traced:
        await made.close()
    return {key: statistics.median(values) for key, values in found.items()}


def cell(value: float, off: float) -> str:
    """``value`` us, and its ratio to tracing off's."""
    return f"{value:.1f}" if value == off else f"{value:.1f} ({value / off:.2f}x)"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--prompt-chars", default="2000")
    p.add_argument("--cycles", type=int, default=3000, help="timed request cycles per side and row")
    p.add_argument("--warm", type=int, default=300)
    p.add_argument("--rounds", type=int, default=5, help="alternating rounds (medians)")
    args = p.parse_args()
    port = free_port()
    receiver = subprocess.Popen([sys.executable, "-c", RECEIVER, str(port)], env=os.environ.copy())
    try:
        time.sleep(1.5)  # the receiver listening
        print(f"us of CPU per request, medians of {args.rounds} alternating rounds of {args.cycles} requests")
        print(
            "| prompt | kind | thread: off | on | on, 1/10 sampled | process: off | on | on, 1/10 sampled |"
        )
        print("|---:|---|---:|---:|---:|---:|---:|---:|")
        for chars in (int(c) for c in args.prompt_chars.split(",")):
            for stream in (False, True):
                sent = bodies(args.cycles + args.warm, chars, stream)
                with asyncio.Runner(loop_factory=loop_factory("uvloop")) as runner:
                    got = runner.run(cycles(sent, stream, args.warm, args.rounds, port))
                kind = "stream" if stream else "plain"
                thread = " | ".join(cell(got[side], got["off"]) for side in SIDES)
                process = " | ".join(cell(got[f"{side}_process"], got["off_process"]) for side in SIDES)
                print(f"| {chars:,} | {kind} | {thread} | {process} |")
    finally:
        receiver.terminate()
        receiver.wait(10)


if __name__ == "__main__":
    main()
