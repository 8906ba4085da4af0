"""``prefix-router dashboard --replay FILE``: the dashboard over a decision file (``simulate --decisions``,
``bench --decisions``), offline: a what-if run becomes something to look at, not only a table.

A small local server (127.0.0.1, no token: it serves a file the user already has) answers the page and
its assets as the router does (``node.control.dashboard``) and ``/dashboard/data`` from the file: the
decisions of one policy played back at ``--speed`` times their own pace, looping. The document has the
router's shape; what a file does not hold (health, queues, KV usage, the index's holdings) is shown as
unknown or derived from the decisions: a prefix is held where its requests went (the largest predicted
hit there), its home is where most of its last requests went (as the router's map says), a move is its
home changing. Marked ``simulated`` when
the file says so.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import time
from bisect import bisect_right
from collections import Counter, deque
from pathlib import Path
from typing import Any

import orjson
from aiohttp import web

from prefix_router.node import dashboard

View = dict[str, Any]


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("dashboard", help="the dashboard over a decision file (simulate/bench --decisions)")
    p.add_argument("--replay", required=True, type=Path, help="a decision file (JSON lines)")
    p.add_argument("--policy", default=None, help="whose decisions (default: the file's first policy)")
    p.add_argument("--speed", type=float, default=1.0, help="playback speed (2: twice as fast)")
    p.add_argument("--port", type=int, default=8077, help="local port (0: any free one, printed)")
    p.set_defaults(func=run)


def load(path: Path, policy: str | None) -> list[View]:
    """The file's decisions of ``policy`` (default: the first one's), in decision order."""
    views = [orjson.loads(line) for line in path.read_bytes().splitlines() if line.strip()]
    if not views:
        raise ValueError(f"{path}: no decisions")
    wanted = policy or views[0]["policy"]
    mine = sorted((v for v in views if v["policy"] == wanted), key=lambda v: (v["t"], v["seq"]))
    if not mine:
        raise ValueError(f"{path}: no decisions of policy {wanted!r}")
    return mine


class Replay:
    """Documents of a decision file at any playback time."""

    def __init__(self, views: list[View]) -> None:
        self.views = views
        self.times = [v["t"] for v in views]
        self.workers = sorted({v["worker"] for v in views})
        self.end = self.times[-1] + dashboard.BUCKET_S

    def document(self, t: float) -> dict[str, Any]:
        t = t % self.end
        upto = bisect_right(self.times, t)
        seen = self.views[:upto]
        recent = seen[bisect_right(self.times, t - dashboard.WINDOW_S) :]
        return {
            "t": t,
            "policy": self.views[0]["policy"],
            "decisions_total": upto,
            "workers": [self.worker(name, recent) for name in self.workers],
            "series": series(recent),
            "decisions": seen[-dashboard.DECISIONS_SHOWN :],
            "prefixes": prefixes(recent),
            "moves": moves(recent),
            "replication": None,
            "simulated": bool(self.views[0].get("simulated")),
        }

    def worker(self, name: str, recent: list[View]) -> dict[str, Any]:
        mine = [v for v in recent if v["worker"] == name]
        return {
            "name": name, "health": "healthy", "draining": False, "in_flight": None, "queue": None,
            "kv_usage": None, "indexed_tokens": None, "decisions": len(mine),
            "hit_predicted": predicted_rate(mine), "hit_reported": reported_rate(mine), "precise": None,
        }  # fmt: skip


def predicted_rate(views: list[View]) -> float | None:
    pairs = [(v["predicted_tokens"], v["prompt_tokens"]) for v in views if v.get("prompt_tokens")]
    prompt = sum(p for _, p in pairs)
    return sum(c for c, _ in pairs) / prompt if prompt else None


def reported_rate(views: list[View]) -> float | None:
    pairs = [(v["cached_tokens"], v["reported_prompt_tokens"]) for v in views
             if v.get("cached_tokens") is not None and v.get("reported_prompt_tokens")]  # fmt: skip
    prompt = sum(p for _, p in pairs)
    return sum(c for c, _ in pairs) / prompt if prompt else None


def series(recent: list[View]) -> list[dict[str, Any]]:
    buckets: dict[int, list[View]] = {}
    for v in recent:
        buckets.setdefault(math.floor(v["t"] / dashboard.BUCKET_S), []).append(v)
    out = []
    for k in sorted(buckets):
        views = buckets[k]
        observed = [v["observed_ttft_ms"] for v in views if v.get("observed_ttft_ms") is not None]
        predicted = [v["predicted_ttft_ms"] for v in views if v.get("predicted_ttft_ms") is not None]
        out.append({
            "t": k * dashboard.BUCKET_S, "decisions": len(views), "hit_predicted": predicted_rate(views),
            "hit_reported": reported_rate(views),
            "ttft_ms": sum(observed) / len(observed) if observed else None,
            "predicted_ttft_ms": sum(predicted) / len(predicted) if predicted else None,
        })  # fmt: skip
    return out


def prefixes(recent: list[View]) -> list[dict[str, Any]]:
    counts: Counter[str] = Counter(v["prefix"] for v in recent if v.get("prefix"))
    held: dict[str, dict[str, int]] = {}
    last: dict[str, View] = {}
    went: dict[str, deque[str]] = {}  # where each prefix's last requests went
    for v in recent:
        if v.get("prefix"):
            sizes = held.setdefault(v["prefix"], {})
            sizes[v["worker"]] = max(
                sizes.get(v["worker"], 0), v["predicted_tokens"], v.get("cached_tokens") or 0
            )
            last[v["prefix"]] = v
            went.setdefault(v["prefix"], deque(maxlen=dashboard.HOME_REQUESTS)).append(v["worker"])
    out = []
    for prefix, n in counts.most_common(dashboard.PREFIXES_SHOWN):
        home = dashboard.home_of(went[prefix])
        order = sorted(held[prefix].items(), key=lambda kv: (kv[0] != home, -kv[1]))
        out.append({
            "prefix": prefix, "tenant": last[prefix].get("tenant"), "requests": n,
            "blocks": last[prefix].get("prefix_blocks"),
            "holders": [{"worker": w, "tokens": tokens} for w, tokens in order],
        })  # fmt: skip
    return out


def moves(recent: list[View]) -> list[dict[str, Any]]:
    """A prefix's home (where most of its last requests went) changing, request by request."""
    home: dict[str, str] = {}
    went: dict[str, deque[str]] = {}
    out: list[dict[str, Any]] = []
    for v in recent:
        prefix = v.get("prefix")
        if not prefix:
            continue
        workers = went.setdefault(prefix, deque(maxlen=dashboard.HOME_REQUESTS))
        workers.append(v["worker"])
        now, before = dashboard.home_of(workers), home.get(prefix)
        if before is not None and before != now:
            out.append({"t": v["t"], "prefix": prefix, "tenant": v.get("tenant"), "from": before, "to": now})
        home[prefix] = now
    return out[-dashboard.MOVES_KEPT :]


def build_app(replay: Replay, speed: float) -> web.Application:
    started = time.monotonic()

    async def page(request: web.Request) -> web.StreamResponse:
        return dashboard.page_response("index.html")

    async def static(request: web.Request) -> web.StreamResponse:
        name = request.match_info["name"]
        if name not in dashboard.STATIC:
            raise web.HTTPNotFound()
        return web.Response(body=dashboard.asset(name), content_type=dashboard.STATIC[name])

    async def data(request: web.Request) -> web.StreamResponse:
        doc = replay.document((time.monotonic() - started) * speed)
        return web.Response(body=orjson.dumps(doc), content_type="application/json")

    app = web.Application()
    app.router.add_get("/dashboard", page)
    app.router.add_get("/dashboard/static/{name}", static)
    app.router.add_get("/dashboard/data", data)
    return app


def run(args: argparse.Namespace) -> int:
    try:
        replay = Replay(load(args.replay, args.policy))
    except (OSError, ValueError, KeyError) as exc:
        print(f"prefix-router dashboard: {exc}")
        return 2
    asyncio.run(serve(build_app(replay, args.speed), args.port))
    return 0


async def serve(app: web.Application, port: int) -> None:
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", port)
    await site.start()
    host, bound = runner.addresses[0][:2]
    print(f"replaying on http://{host}:{bound}/dashboard (Ctrl-C to stop)", flush=True)
    try:
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()
