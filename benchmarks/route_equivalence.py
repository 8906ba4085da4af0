"""Whether this tree's routing core decides exactly as another revision's, on random event sequences.

Both cores (the other revision extracted as in ``route_core.py``) get the same random sequence per trial:
chat requests of a few conversations sharing prefixes (two models, sessions, any subset of the workers as
candidates) routed and dispatched, first tokens, finishes (a quarter failing: the index is trimmed;
engine reports of cached and prompt tokens; a reply block extending the prompt), workers removed and
added, engine loads scraped, and other replicas' changes applied (a tail of a recorded change, as merged
inserts may be). Small caches, a global cap and a TTL make entries leave. Every decision (worker, branch,
matched blocks, predicted tokens) is compared; printed: decisions and how many differed (0 for a change
that keeps decisions), with the first differing step of each trial.

    python benchmarks/route_equivalence.py --before 853e261 --trials 300
"""

from __future__ import annotations

import argparse
import dataclasses
import random
import sys
import tempfile
from pathlib import Path
from typing import Any

from route_core import core_at, core_names


def _key_tokens(req: Any) -> int:
    """The key's length under either name (``prompt_tokens`` before issue 21)."""
    return int(getattr(req, "key_tokens", None) or req.prompt_tokens)


def _id_arg(keys: Any, rid: str) -> dict[str, str]:
    """``route_id`` (``request_id`` before issue 21) for ``keys.build``."""
    import inspect

    return {("route_id" if "route_id" in inspect.signature(keys.build).parameters else "request_id"): rid}


def make_router(package: str, seed: int, cap_tokens: int) -> tuple[Any, Any]:
    types = core_names(package)
    learning = {"warmup": 2, "min_sample_tokens": 16}
    # the learning's constants: ``routing.units`` knobs before issue 40, ``UnitTuning`` since
    knobs = "warmup" in types.UnitSettings.model_fields
    cfg = types.RoutingSettings.model_validate(
        {
            "policy": "prefix",
            "keys": {"block_tokens": 16},
            "index": {"worker_capacity_tokens": cap_tokens, "max_total_blocks": 3000, "ttl_s": 50.0},
            "units": learning if knobs else {},
        }
    )
    if knobs:
        return types.Router(cfg, random.Random(seed)), types
    tuning = types.UnitTuning(**learning)
    return types.Router(cfg, random.Random(seed), units=tuning), types


class Trial:
    def __init__(self, packages: list[str], trial: int, steps: int) -> None:
        self.rng = rng = random.Random(trial)
        cap = rng.choice([160, 800, 4000])
        self.cores = [make_router(p, trial, cap) for p in packages]
        self.workers = [f"w{i}" for i in range(rng.randrange(2, 12))]
        self.changes: list[list[Any]] = [[] for _ in packages]
        for (router, _), changes in zip(self.cores, self.changes, strict=True):
            for w in self.workers:
                router.add_worker(w)
            router.on_change = changes.append
        self.convs = [[rng.randrange(3) for _ in range(rng.randrange(1, 6))] for _ in range(6)]
        self.live: list[tuple[str, list[Any], str, bool, int]] = []
        self.steps, self.now, self.decisions, self.differ = steps, 0.0, 0, 0
        self.first_diff: tuple[int, list[Any]] | None = None

    def run(self) -> None:
        rng = self.rng
        for step in range(self.steps):
            self.now += rng.random() * 0.5
            op = rng.random()
            if op < 0.45:
                self.route(step)
            elif op < 0.6:
                self.first_token()
            elif op < 0.85:
                self.finish()
            elif op < 0.9:
                self.membership()
            elif op < 0.95:
                self.scrape()
            else:
                self.replicate()

    def route(self, step: int) -> None:
        rng = self.rng
        conv = rng.randrange(len(self.convs))
        text = " ".join(f"t{c}" * 20 for c in self.convs[conv]) + "x" * rng.randrange(0, 200)
        body = {"model": rng.choice(["m", "m", "n"]), "messages": [{"role": "user", "content": text}]}
        session = rng.choice([None, None, "s1", "s2"])
        if not self.workers:
            return
        candidates = rng.sample(self.workers, rng.randrange(1, len(self.workers) + 1))
        reqs = [
            r.keys.build("chat", body, **_id_arg(r.keys, f"r{step}"), session=session) for r, _ in self.cores
        ]
        decided = [r.route(q, candidates, self.now) for (r, _), q in zip(self.cores, reqs, strict=True)]
        keys = [(d.worker, str(d.branch), d.matched_blocks, d.predicted_tokens) for d in decided]
        self.decisions += 1
        if any(k != keys[0] for k in keys):
            self.differ += 1
            self.first_diff = self.first_diff or (step, keys)
        for (r, _), q, d in zip(self.cores, reqs, decided, strict=True):
            r.dispatched(q, d, self.now)
        self.live.append((f"r{step}", reqs, decided[0].worker, False, conv))

    def first_token(self) -> None:
        if not self.live:
            return
        i = self.rng.randrange(len(self.live))
        rid, reqs, worker, started, conv = self.live[i]
        if not started:
            for r, _ in self.cores:
                r.first_token(rid, self.now)
            self.live[i] = (rid, reqs, worker, True, conv)

    def finish(self) -> None:
        if not self.live:
            return
        rng = self.rng
        _, reqs, worker, _, conv = self.live.pop(rng.randrange(len(self.live)))
        ok, cached, extra = rng.random() < 0.75, rng.choice([None, 0, 16, 64, 1000]), rng.getrandbits(64)
        for (r, types), q in zip(self.cores, reqs, strict=True):
            extension = (*q.blocks, extra) if ok else ()
            r.finished(q, worker, types.Outcome(ok, cached, extension, _key_tokens(q) + 3), self.now)
        if ok:
            self.convs[conv].append(rng.randrange(3))

    def membership(self) -> None:
        rng = self.rng
        if len(self.workers) > 1 and rng.random() < 0.5:
            worker = rng.choice(self.workers)
            self.workers.remove(worker)
            for r, _ in self.cores:
                r.remove_worker(worker)
            return
        name = f"w{rng.randrange(20)}"
        if name not in self.workers:
            self.workers.append(name)
            for r, _ in self.cores:
                r.add_worker(name)

    def scrape(self) -> None:
        if not self.workers:
            return
        worker, depth, kv = self.rng.choice(self.workers), self.rng.randrange(4), self.rng.random()
        for r, _ in self.cores:
            r.set_engine_load(worker, depth, kv, self.now)

    def replicate(self) -> None:
        if not all(self.changes):
            return
        i, cut = self.rng.randrange(min(len(c) for c in self.changes)), self.rng.randrange(64)
        for (r, _), changes in zip(self.cores, self.changes, strict=True):
            change = changes[i]
            start = cut % (len(change.blocks) + 1)
            fields: dict[str, object] = {"blocks": change.blocks[start:], "at": self.now}
            if start and getattr(change, "chained", False):
                fields["chained"] = False  # a chain's tail is not a whole chain (IndexChange's contract)
            r.apply(dataclasses.replace(change, **fields))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--before", required=True, help="git revision of the routing core to compare with")
    p.add_argument("--trials", type=int, default=100)
    p.add_argument("--steps", type=int, default=300, help="events per trial")
    args = p.parse_args()
    decisions = differ = 0
    with tempfile.TemporaryDirectory() as tmp:
        packages = [core_at(args.before, Path(tmp)), "prefix_router"]
        for trial in range(args.trials):
            t = Trial(packages, trial, args.steps)
            t.run()
            decisions, differ = decisions + t.decisions, differ + t.differ
            if t.first_diff is not None:
                print(f"trial {trial}: first differing decision at step {t.first_diff[0]}: {t.first_diff[1]}")
    print(f"{args.before} vs this tree: {decisions} decisions over {args.trials} trials, {differ} differing")
    return 0


if __name__ == "__main__":
    sys.exit(main())
