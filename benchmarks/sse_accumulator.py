"""The proxy's stream accounting (``proxy.sse.ReplyAccumulator``) at a given commit next to this tree's:
microseconds per relayed stream, rounds alternating, in one process.

A stream is the instant worker's (``bench.instant_worker``): ``--events`` chat deltas, a usage event and
``[DONE]``, fed in one chunk or one chunk per event. The module at ``--before`` is read with ``git show``
(it imports only orjson and ``prefix_router.protocol``).

    python benchmarks/sse_accumulator.py --before 853e261
"""

from __future__ import annotations

import argparse
import subprocess
import timeit
import types
from collections.abc import Callable
from pathlib import Path

import orjson

from prefix_router.lab.bench.instant_worker import _event
from prefix_router.node.request import sse

REPO = Path(__file__).resolve().parent.parent


def module_at(commit: str) -> types.ModuleType:
    source = subprocess.run(
        ["git", "-C", str(REPO), "show", f"{commit}:src/prefix_router/proxy/edge/sse.py"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    module = types.ModuleType(f"sse_{commit}")
    exec(compile(source, f"{commit}:sse.py", "exec"), module.__dict__)  # a file of our own history
    return module


def stream(events: int) -> list[bytes]:
    usage = {"id": "i", "choices": [], "usage": {"prompt_tokens": 100, "completion_tokens": events}}
    return [_event(True)] * events + [b"data: " + orjson.dumps(usage) + b"\n\n", b"data: [DONE]\n\n"]


def consumer(module: types.ModuleType, chunks: list[bytes]) -> Callable[[], None]:
    def run() -> None:
        reply = module.ReplyAccumulator("chat", 10**6, 10**6)
        for chunk in chunks:
            reply.feed(chunk)
        reply.generated()

    return run


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--before", required=True, help="a git commit of this repository")
    p.add_argument("--events", type=int, default=8)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--number", type=int, default=10_000, help="streams per timing")
    args = p.parse_args()
    builds = {"before": module_at(args.before), "after": sse}
    events = stream(args.events)
    splits = {"one chunk": [b"".join(events)], "a chunk per event": events}
    best = {(b, s): float("inf") for b in builds for s in splits}
    for _ in range(args.rounds):
        for split, chunks in splits.items():
            for build, module in builds.items():
                took = timeit.timeit(consumer(module, chunks), number=args.number) / args.number
                best[build, split] = min(best[build, split], took)
    for split in splits:
        before, after = best["before", split] * 1e6, best["after", split] * 1e6
        print(f"{split:>18}: before {before:6.1f} us/stream, after {after:6.1f} us/stream, "
              f"after/before {after / before:.2f}")  # fmt: skip


if __name__ == "__main__":
    main()
