"""``python -m prefix_router.lab.sim``: a simulated engine (the options of ``prefix-router engine-sim``)."""

from __future__ import annotations

import sys

from prefix_router.lab.sim.cli import engine_sim_parser, run_engine_sim


def main(argv: list[str] | None = None) -> int:
    return run_engine_sim(engine_sim_parser().parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
