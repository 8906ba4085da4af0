"""A recorded routing trace, replayed on whichever build of ``prefix_router`` is first on the path.

``record`` drives a router with seeded random events (chat requests of a few conversations sharing
prefixes, two models, sessions, any subset of the workers as candidates; first tokens; finishes, a quarter
failing, with engine reports and a reply extending the prompt; workers removed and added; engine loads
scraped; other replicas' changes applied as a tail of a recorded change) over small caches, a global cap
and a TTL, and writes the events. ``replay`` runs those events and prints, one JSON line per step, what
the core decided and kept: each decision (worker, branch, matched blocks, predicted tokens), the request's
key (blocks, key tokens, hash key), and after every step the router's summary. The events name the worker
that finished as the recording's decision, so a replay that decides differently keeps going on the same
events and every later difference is reported too.

Run as a script (the compiled-vs-pure test runs it in a subprocess per build)::

    python tests/support/trace.py record OUT.json --seed 1 --steps 400
    python tests/support/trace.py replay IN.json  > decisions.jsonl
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
import sys
from typing import Any

Event = dict[str, Any]


def make_router(seed: int, cap_tokens: int) -> Any:
    from prefix_router.routing.router import Router
    from prefix_router.routing.settings import RoutingSettings
    from prefix_router.routing.units import UnitTuning

    cfg = RoutingSettings.model_validate(
        {
            "policy": "prefix",
            "keys": {"block_tokens": 16},
            "index": {"worker_capacity_tokens": cap_tokens, "max_total_blocks": 3000, "ttl_s": 50.0},
        }
    )
    return Router(cfg, random.Random(seed), units=UnitTuning(warmup=2, min_sample_tokens=16))


class Replay:
    """A router that runs events one at a time and says what it decided and holds after each."""

    def __init__(self, seed: int, cap_tokens: int, workers: list[str]) -> None:
        self.router = make_router(seed, cap_tokens)
        for w in workers:
            self.router.add_worker(w)
        self.changes: list[Any] = []
        self.router.on_change = self.changes.append
        self.requests: dict[str, Any] = {}

    def step(self, event: Event) -> list[Any]:
        """``act``, then the router's summary."""
        return [*self.act(event), json.loads(json.dumps(self.router.summary(), default=str))]

    def act(self, event: Event) -> list[Any]:
        """Run one event; what was decided (a route's decision and key)."""
        r, now, op = self.router, event["now"], event["op"]
        seen: list[Any] = [op]
        if op == "route":
            req = r.keys.build("chat", event["body"], route_id=event["id"], session=event["session"])
            d = r.route(req, event["candidates"], now)
            r.dispatched(req, d, now)
            self.requests[event["id"]] = req
            seen += [d.worker, str(d.branch), d.matched_blocks, d.predicted_tokens]
            seen += [[str(b) for b in req.blocks], req.key_tokens, str(req.hash_key)]
        elif op == "first_token":
            r.first_token(event["id"], now)
        elif op == "finish":
            self._finish(event)
        elif op == "remove":
            r.remove_worker(event["worker"])
        elif op == "add":
            r.add_worker(event["worker"])
        elif op == "scrape":
            r.set_engine_load(event["worker"], event["depth"], event["kv"], now)
        elif op == "apply":
            self._apply(event)
        return seen

    def _finish(self, event: Event) -> None:
        from prefix_router.routing.types import Outcome

        req = self.requests.pop(event["id"])
        extension = (*req.blocks, event["extra"]) if event["ok"] else ()
        outcome = Outcome(event["ok"], event["cached"], extension, req.key_tokens + 3)
        self.router.finished(req, event["worker"], outcome, event["now"])

    def _apply(self, event: Event) -> None:
        change = self.changes[event["change"] % len(self.changes)]
        start = event["cut"] % (len(change.blocks) + 1)
        fields: dict[str, object] = {"blocks": change.blocks[start:], "at": event["now"]}
        if start and change.chained:
            fields["chained"] = False  # a chain's tail is not a whole chain (IndexChange's contract)
        self.router.apply(dataclasses.replace(change, **fields))


def record(seed: int, steps: int) -> dict[str, Any]:
    """Seeded events, run on the build at hand as they are drawn (where a request went: its decision)."""
    rng = random.Random(seed)
    cap = rng.choice([160, 800, 4000])
    workers = [f"w{i}" for i in range(rng.randrange(2, 12))]
    replay = Replay(seed, cap, workers)
    trace = {"seed": seed, "cap_tokens": cap, "workers": list(workers), "events": []}
    convs = [[rng.randrange(3) for _ in range(rng.randrange(1, 6))] for _ in range(6)]
    live: list[list[Any]] = []  # [route id, worker, started, conversation]
    now = 0.0
    for step in range(steps):
        now += rng.random() * 0.5
        op, event = rng.random(), None
        if op < 0.45 and workers:
            conv = rng.randrange(len(convs))
            text = " ".join(f"t{c}" * 20 for c in convs[conv]) + "x" * rng.randrange(0, 200)
            body = {"model": rng.choice(["m", "m", "n"]), "messages": [{"role": "user", "content": text}]}
            candidates = rng.sample(workers, rng.randrange(1, len(workers) + 1))
            session = rng.choice([None, None, "s1", "s2"])
            event = {
                "op": "route",
                "id": f"r{step}",
                "body": body,
                "session": session,
                "candidates": candidates,
            }
            live.append([f"r{step}", None, False, conv])
        elif op < 0.6 and live:
            entry = live[rng.randrange(len(live))]
            if not entry[2]:
                entry[2] = True
                event = {"op": "first_token", "id": entry[0]}
        elif op < 0.85 and live:
            rid, worker, _, conv = live.pop(rng.randrange(len(live)))
            ok, cached, extra = rng.random() < 0.75, rng.choice([None, 0, 16, 64, 1000]), rng.getrandbits(64)
            event = {"op": "finish", "id": rid, "worker": worker, "ok": ok, "cached": cached, "extra": extra}
            if ok:
                convs[conv].append(rng.randrange(3))
        elif op < 0.9:
            if len(workers) > 1 and rng.random() < 0.5:
                event = {"op": "remove", "worker": workers.pop(rng.randrange(len(workers)))}
            elif (name := f"w{rng.randrange(20)}") not in workers:
                workers.append(name)
                event = {"op": "add", "worker": name}
        elif op < 0.95 and workers:
            event = {
                "op": "scrape",
                "worker": rng.choice(workers),
                "depth": rng.randrange(4),
                "kv": rng.random(),
            }
        elif op >= 0.95 and replay.changes:
            event = {"op": "apply", "change": rng.randrange(len(replay.changes)), "cut": rng.randrange(64)}
        if event is None:
            continue
        event["now"] = now
        seen = replay.step(event)
        if event["op"] == "route":
            live[-1][1] = seen[1]
        trace["events"].append(event)  # type: ignore[union-attr]
    return trace


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("mode", choices=["record", "replay"])
    p.add_argument("path")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--trials", type=int, default=1, help="record: this many traces, seeds seed..seed+n-1")
    args = p.parse_args()
    if args.mode == "record":
        traces = [record(args.seed + i, args.steps) for i in range(args.trials)]
        with open(args.path, "w") as out:
            json.dump(traces, out)
        return 0
    with open(args.path) as src:
        traces = json.load(src)
    for trace in traces:
        replay = Replay(trace["seed"], trace["cap_tokens"], trace["workers"])
        for event in trace["events"]:
            sys.stdout.write(json.dumps(replay.step(event)) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
