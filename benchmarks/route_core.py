"""The routing core of this tree side by side with the same core at another git revision, in one process.

The other revision's ``src/prefix_router`` is extracted (``git archive``) into a temporary directory as the
package ``prefix_router_before`` (its imports rewritten), so both cores run interleaved in one process on
the same machine state. For each ``--workers`` count, both get the same router (``prefix`` policy,
``--blocks`` random indexed blocks as in ``bench-index``, text-key units learned from 16 reports) and the
same background load (``--busy`` requests in flight per worker, half of them past their first token).
Then, per ``--prompt-chars``, a chat prompt fully indexed on 3 workers is timed, ``--rounds`` rounds of
``--repeats`` calls each, alternating the two cores every round:

- ``route``: the decision (``Router.route`` over every worker as candidate);
- ``cycle``: what a routed request costs the core in all: route, dispatched, first_token and finished
  with an outcome reporting cached and prompt tokens and the prompt extended by a two-block reply (as the
  proxy's ``keys.extend`` gives it);
- ``key``: the routing key the proxy builds per request: ``keys.build`` of the chat body (a system and a
  user message) and ``keys.extend`` by a reply.

Printed: the p50 wall time per call of each core (microseconds, over all rounds) and the ratio; and the
number of decisions on which the two cores disagreed (worker, branch, matched blocks, predicted tokens)
or whose keys (blocks, extension) differ, which must be 0 for a change that keeps decisions.

    python benchmarks/route_core.py --before 853e261
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import io
import random
import re
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from prefix_router.lab.workloads.text import random_text, rng_for

CHAIN_BLOCKS = 64
HIT_WORKERS = 3
NOW = 1e6
_NAME = re.compile(r"\bprefix_router\b")


def core_at(revision: str, into: Path) -> str:
    """Extract ``revision``'s package as ``prefix_router_before`` under ``into``; returns the package name."""
    tar = subprocess.run(
        ["git", "archive", revision, "src/prefix_router"], check=True, capture_output=True
    ).stdout
    with tarfile.open(fileobj=io.BytesIO(tar)) as archive:
        for member in archive.getmembers():
            if not member.isfile():
                continue
            source = archive.extractfile(member)
            assert source is not None
            relative = Path(member.name).relative_to("src/prefix_router")
            target = into / "prefix_router_before" / relative
            target.parent.mkdir(parents=True, exist_ok=True)
            data = source.read()
            if target.suffix == ".py":
                data = _NAME.sub("prefix_router_before", data.decode()).encode()
            target.write_bytes(data)
    sys.path.insert(0, str(into))
    return "prefix_router_before"


# where a revision's routing core defines each name its front door may list (``Router``, ``Outcome``, ...)
_HOMES = {
    "Router": "router",
    "IndexSettings": "settings",
    "RoutingSettings": "settings",
    "UnitSettings": "settings",
    "Outcome": "types",
    "RouteRequest": "types",
    "UnitTuning": "units",
}


def core_names(package: str) -> SimpleNamespace:
    """The names of ``package``'s routing core (``_HOMES``): from its front door (``{package}.routing``)
    where it lists them, as any edge takes them; from the module defining them in a revision whose front
    door does not list them yet (``UnitTuning`` missing: a revision without it)."""
    door = importlib.import_module(f"{package}.routing")
    listed = set(getattr(door, "__all__", ()))
    found: dict[str, Any] = {}
    for name, home in _HOMES.items():
        if name in listed:
            found[name] = getattr(door, name)
            continue
        try:
            module = importlib.import_module(f"{package}.routing.{home}")  # an older revision's layout
        except ModuleNotFoundError:
            continue
        if hasattr(module, name):
            found[name] = getattr(module, name)
    return SimpleNamespace(**found)


class Core:
    """One revision's routing core, set up as ``bench-index`` does."""

    def __init__(self, package: str, workers: int, blocks: int, busy: int) -> None:
        self.types = names = core_names(package)
        fields = {f.name for f in dataclasses.fields(self.types.RouteRequest)}  # names before/after issue 21
        self.id_field = "route_id" if "route_id" in fields else "request_id"
        self.len_field = "key_tokens" if "key_tokens" in fields else "prompt_tokens"
        index = names.IndexSettings(
            max_total_blocks=max(2_000_000, blocks * 2), ttl_s=1e9, worker_capacity_tokens=1 << 40
        )
        self.router: Any = names.Router(
            names.RoutingSettings(policy="prefix", index=index), rng=random.Random(0)
        )
        for i in range(workers):
            self.router.add_worker(f"w{i}")
        self.names: list[str] = self.router.workers()
        rng = random.Random(0)
        for n, start in enumerate(range(0, blocks, CHAIN_BLOCKS)):
            chain = tuple(rng.getrandbits(64) for _ in range(min(CHAIN_BLOCKS, blocks - start)))
            self.router.index.insert(self.names[n % workers], chain, now=float(n))
        self._learn_units()
        self._background(busy)
        self.count = 0

    def _learn_units(self) -> None:
        for i in range(16):
            req = self.build(4_000, 100 + i, f"u{i}")
            decision = self.router.route(req, self.names, NOW - 10)
            self.router.dispatched(req, decision, NOW - 10)
            outcome = self.types.Outcome(True, None, (), round(getattr(req, self.len_field) * 1.2))
            self.router.finished(req, decision.worker, outcome, NOW - 10)

    def _background(self, busy: int) -> None:
        """``busy`` requests in flight per worker (every other one past its first token)."""
        for i in range(busy * len(self.names)):
            req = self.build(1_000 + 37 * (i % 50), 1_000 + i, f"b{i}")
            decision = self.router.route(req, self.names, NOW - 5 + i * 1e-4)
            self.router.dispatched(req, decision, NOW - 5 + i * 1e-4)
            if i % 2:
                self.router.first_token(getattr(req, self.id_field), NOW - 4 + i * 1e-4)

    def build(self, chars: int, seed: int, request_id: str) -> Any:
        text = random_text(rng_for("route-core", seed, chars), chars // 4 + 1)[:chars]
        body = {"model": "m", "messages": [{"role": "user", "content": text}]}
        return self.router.keys.build("chat", body, **{self.id_field: request_id})

    def key(self, body: dict[str, Any], reply: dict[str, Any]) -> tuple[tuple[int, ...], tuple[int, ...]]:
        keys = self.router.keys
        req = keys.build("chat", body, **{self.id_field: "k"})
        return req.blocks, keys.extend(req, "chat", body, reply)

    def hit(self, chars: int) -> Any:
        req = self.build(chars, 2, "hit")
        for worker in self.names[:HIT_WORKERS]:
            self.router.index.insert(worker, req.blocks, now=NOW)
        return req

    def route(self, req: Any) -> Any:
        return self.router.route(req, self.names, NOW)

    def cycle(self, req: Any, extension: tuple[int, ...]) -> Any:
        self.count += 1
        one = dataclasses.replace(req, **{self.id_field: f"c{self.count}"})
        router = self.router
        decision = router.route(one, self.names, NOW)
        router.dispatched(one, decision, NOW)
        router.first_token(getattr(one, self.id_field), NOW)
        outcome = self.types.Outcome(
            True, decision.predicted_tokens, extension, round(getattr(one, self.len_field) * 1.2)
        )
        router.finished(one, decision.worker, outcome, NOW)
        return decision


def _key(decision: Any) -> tuple[Any, ...]:
    return decision.worker, str(decision.branch), decision.matched_blocks, decision.predicted_tokens


def _timed(fn: Callable[[], Any], repeats: int, samples: list[float], out: list[Any]) -> None:
    for _ in range(repeats):
        started = time.perf_counter_ns()
        result = fn()
        samples.append((time.perf_counter_ns() - started) / 1000.0)
        out.append(result)


def compare(cores: dict[str, Core], chars: int, rounds: int, repeats: int) -> dict[str, Any]:
    reqs = {name: core.hit(chars) for name, core in cores.items()}
    first = next(iter(reqs.values()))
    extra = tuple(random.Random(chars).getrandbits(64) for _ in range(2))
    times: dict[str, dict[str, list[float]]] = {n: {"route": [], "cycle": [], "key": []} for n in cores}
    decided: dict[str, list[Any]] = {n: [] for n in cores}
    keyed: dict[str, list[Any]] = {n: [] for n in cores}
    text = random_text(rng_for("route-core", 3, chars), chars // 4 + 1)[:chars]
    body = {"model": "m", "messages": [{"role": "system", "content": "Answer briefly."},
                                       {"role": "user", "content": text}], "max_tokens": 64}  # fmt: skip
    reply = {"role": "assistant", "content": random_text(rng_for("route-core", 4, 300), 80)[:300]}
    for _ in range(rounds):
        for name, core in cores.items():
            req = reqs[name]
            _timed(lambda c=core, r=req: c.route(r), repeats, times[name]["route"], decided[name])  # type: ignore[misc]
            ext = req.blocks + extra
            _timed(lambda c=core, r=req, e=ext: c.cycle(r, e), repeats, times[name]["cycle"], decided[name])  # type: ignore[misc]
            _timed(lambda c=core: c.key(body, reply), repeats, times[name]["key"], keyed[name])  # type: ignore[misc]
    names = list(cores)
    differ = sum(_key(a) != _key(b) for a, b in zip(decided[names[0]], decided[names[1]], strict=True))
    differ += sum(a != b for a, b in zip(keyed[names[0]], keyed[names[1]], strict=True))
    return {
        "blocks": len(first.blocks),
        "p50": {n: {k: statistics.median(v) for k, v in t.items()} for n, t in times.items()},
        "differ": differ,
        "decisions": len(decided[names[0]]) + len(keyed[names[0]]),
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--before", required=True, help="git revision of the routing core to compare with")
    p.add_argument("--workers", type=int, nargs="+", default=[8, 16, 64])
    p.add_argument("--prompt-chars", type=int, nargs="+", default=[2_000, 16_000])
    p.add_argument("--blocks", type=int, default=200_000)
    p.add_argument("--busy", type=int, default=2, help="requests in flight per worker (background load)")
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--repeats", type=int, default=100)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        before = core_at(args.before, Path(tmp))
        print(f"routing core: {args.before} (before) vs this tree (now); p50 us per call, before/now")
        print(f"{'workers':>7} {'chars':>6} {'blocks':>6} {'route before':>12} {'now':>6} {'ratio':>6}"
              f" {'cycle before':>12} {'now':>6} {'ratio':>6} {'key before':>10} {'now':>6} {'ratio':>6}"
              "  decisions and keys differing")  # fmt: skip
        for workers in args.workers:
            cores = {
                "before": Core(before, workers, args.blocks, args.busy),
                "now": Core("prefix_router", workers, args.blocks, args.busy),
            }
            for chars in args.prompt_chars:
                r = compare(cores, chars, args.rounds, args.repeats)
                b, n = r["p50"]["before"], r["p50"]["now"]
                print(f"{workers:>7} {chars:>6} {r['blocks']:>6} {b['route']:>12.1f} {n['route']:>6.1f}"
                      f" {b['route'] / n['route']:>5.2f}x {b['cycle']:>12.1f} {n['cycle']:>6.1f}"
                      f" {b['cycle'] / n['cycle']:>5.2f}x {b['key']:>10.1f} {n['key']:>6.1f}"
                      f" {b['key'] / n['key']:>5.2f}x  {r['differ']} of {r['decisions']}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
