"""``prefix-router fidelity``: the routing-fidelity benchmark (see ``run.py``)."""

from __future__ import annotations

import argparse
from pathlib import Path

from prefix_router.lab.bench.fidelity.run import run


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "fidelity",
        help="how closely predicted prefix matches follow a real chat template and tokenizer",
        description="Compare the router's predicted prefix matches (default and exact keys) with the longest "
        "common token prefix of request pairs rendered by a real chat template and tokenizer.",
    )
    p.add_argument(
        "--model-dir",
        type=Path,
        metavar="DIR",
        help="a local model directory (tokenizer.json, tokenizer_config.json with chat_template); default: "
        "the SmolLM2 GGUF's own template and four bundled layouts over its vocabulary",
    )
    p.add_argument("--gguf", type=Path, metavar="FILE", help="the GGUF to derive model directories from")
    p.add_argument("--size", choices=("small", "full"), default="full", help="corpus size (default full)")
    p.add_argument("--json", type=Path, metavar="OUT", help="write summaries, pairs and costs to OUT")
    p.add_argument("--no-cost", action="store_true", help="skip the per-request cost measurement")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    return run(args.model_dir, args.size, args.json, args.gguf, cost=not args.no_cost)
