"""``python -m prefix_router.proxy serve ...``: the proxy's commands without the top-level CLI."""

from __future__ import annotations

import argparse
import sys

from prefix_router.proxy.run.cli import register


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m prefix_router.proxy")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args()
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
