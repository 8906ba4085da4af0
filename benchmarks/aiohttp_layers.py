"""What aiohttp's Application layer (URL dispatch, match info, the response-prepare signal) costs over its
low-level ``web.Server``, side by side in one run (issue 26: the server's share of prefix-router's CPU).

Two servers, each its own process on uvloop, the same one-function handler (read the body, answer a fixed
180-byte JSON body) and the same connection-handler settings as ``serve`` (``handler_cancellation``, no
access log): ``app`` registers it on a ``web.Application`` with routes shaped like the router's (a
plain POST path, a ``/v1/{tail}`` pattern, a GET path); ``server`` hands it to ``web.Server`` directly.
``bench.loadgen`` sends the benchmark's 2,000-character chat bodies; the rounds alternate the servers
(their order reversed every other round); printed per server: CPU per request (``/proc``, user + system),
the median and the least over the rounds, and the best rate.

    python benchmarks/aiohttp_layers.py --rounds 6 --requests 3000
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys

BODY = (
    b'{"id":"x","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant",'
    b'"content":"ok"}}],"usage":{"prompt_tokens":500,"completion_tokens":1}}'
)
KINDS = ("app", "server")


def serve(kind: str, port: int) -> None:
    import uvloop
    from aiohttp import web

    async def handle(request: web.Request) -> web.StreamResponse:
        await request.read()
        return web.Response(body=BODY, headers={"Content-Type": "application/json"})

    async def main() -> None:
        runner: web.BaseRunner
        if kind == "app":
            app = web.Application()
            app.router.add_post("/v1/chat/completions", handle)
            app.router.add_route("*", "/v1/{tail:.+}", handle)
            app.router.add_get("/health", handle)
            runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
        else:
            runner = web.ServerRunner(web.Server(handle, handler_cancellation=True, access_log=None))
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port, backlog=2048).start()
        await asyncio.Event().wait()

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(main())


async def measure(args: argparse.Namespace, pids: dict[str, int], ports: dict[str, int]) -> None:
    from prefix_router.lab.bench import loadgen
    from prefix_router.lab.bench.overhead import bodies, cpu_seconds, wait_listening

    for port in ports.values():
        await wait_listening(port)
    sent = bodies(args.requests, args.prompt_chars, False)
    cpu: dict[str, list[float]] = {k: [] for k in KINDS}
    rate: dict[str, float] = dict.fromkeys(KINDS, 0.0)
    for round_ in range(args.rounds):
        for kind in KINDS if round_ % 2 == 0 else KINDS[::-1]:
            before = cpu_seconds(pids[kind])
            result = await loadgen.run(ports[kind], sent, args.concurrency)
            assert result.errors == 0, f"{kind}: {result.errors} errors"
            cpu[kind].append((cpu_seconds(pids[kind]) - before) / len(sent) * 1e6)
            rate[kind] = max(rate[kind], result.rate)
    print("| server | CPU us/req, median | least | best req/s |")
    print("|---|---:|---:|---:|")
    for kind in KINDS:
        print(f"| {kind} | {statistics.median(cpu[kind]):.1f} | {min(cpu[kind]):.1f} | {rate[kind]:,.0f} |")
    added = statistics.median(cpu["app"]) - statistics.median(cpu["server"])
    print(f"Application over web.Server: {added:.1f} us per request (medians)")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--requests", type=int, default=3000)
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--prompt-chars", type=int, default=2000)
    p.add_argument("--port", type=int, default=0, help="the first of two ports (0: any free ones)")
    p.add_argument("--serve", choices=KINDS, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.serve:
        serve(args.serve, args.port)
        return 0
    from prefix_router.lab.launch.net import free_port

    ports = {k: (args.port + i if args.port else free_port()) for i, k in enumerate(KINDS)}
    procs = {
        k: subprocess.Popen([sys.executable, __file__, "--serve", k, "--port", str(ports[k])]) for k in KINDS
    }
    try:
        asyncio.run(measure(args, {k: p.pid for k, p in procs.items()}, ports))
    finally:
        for proc in procs.values():
            proc.terminate()
            proc.wait(10)
    return 0


if __name__ == "__main__":
    sys.exit(main())
