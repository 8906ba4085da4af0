"""``PrefixPolicy.select`` of this tree side by side with the same policy at another git revision.

``bench-index``'s set-up (``--workers`` workers, ``--blocks`` indexed blocks), a ``--prompt-chars`` prompt
fully indexed on 3 workers; the decision's ``Context`` is captured from a real ``Router.route`` and both
policies decide on it, alternating, 30 times ``--repeats`` decisions each. Printed: CPU microseconds per
decision (median of the 30) and the ratio. The other revision's ``routing/policies/prefix.py`` is read
with ``git show`` and must import against this tree's modules.

    python benchmarks/policy_select.py --before fb15cbe
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from prefix_router.lab.bench import index_bench

PATH = "src/prefix_router/routing/policies/prefix.py"


def policy_at(revision: str, knobs: Any) -> Any:
    source = subprocess.run(["git", "show", f"{revision}:{PATH}"], check=True, capture_output=True).stdout
    with tempfile.NamedTemporaryFile("wb", suffix=".py", delete=False) as f:
        f.write(source)
    spec = importlib.util.spec_from_file_location("prefix_before", f.name)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    Path(f.name).unlink()
    return module.PrefixPolicy(knobs)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--before", required=True, help="git revision of the policy to compare with")
    p.add_argument("--workers", type=int, default=64)
    p.add_argument("--blocks", type=int, default=200_000)
    p.add_argument("--prompt-chars", type=int, default=16_000)
    p.add_argument("--repeats", type=int, default=300)
    args = p.parse_args()
    cfg = index_bench.IndexBenchSettings(workers=args.workers, blocks=args.blocks)
    router = index_bench.make_router(cfg)
    index_bench.fill(router, cfg.blocks, cfg.seed)
    req = router.keys.build("chat", index_bench.body_of(args.prompt_chars, 2), route_id="hit")
    for worker in router.workers()[: index_bench.HIT_WORKERS]:
        router.index.insert(worker, req.blocks, now=1e6)
    knobs = router.cfg.knobs("prefix")
    policy = type(router.policies["prefix"])  # this tree's, as the router made it
    before, now = policy_at(args.before, knobs), policy(knobs)
    captured: list[Any] = []
    router.policies["prefix"] = now
    now.select = lambda *a: captured.append(a) or policy.select(now, *a)  # type: ignore[method-assign]
    router.route(req, router.workers(), now=1e6, policy="prefix")
    del now.select
    request, workers, ctx = captured[0]
    times: dict[str, list[float]] = {"before": [], "now": []}
    for _ in range(30):
        for name, policy in (("before", before), ("now", now)):
            started = time.process_time()
            for _ in range(args.repeats):
                policy.select(request, workers, ctx)
            times[name].append((time.process_time() - started) / args.repeats * 1e6)
    b, n = statistics.median(times["before"]), statistics.median(times["now"])
    print(
        f"PrefixPolicy.select, {args.workers} candidates, {args.prompt_chars}-char prompt held by 3: "
        f"{args.before} {b:.1f} us, this tree {n:.1f} us per decision: {b / n:.2f}x"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
