"""Merge per-router benchmark JSON files into one comparison table (terminal + Markdown + JSON).

    .venv/bin/python benchmarks/peers_table.py OUT/*.json --baseline "prefix-router random" \
        --json OUT/peers.json --markdown OUT/peers.md
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from prefix_router.bench.merge import markdown, merge
from prefix_router.bench.table import render


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("files", nargs="+", type=Path)
    parser.add_argument("--baseline", help="label the ratios are taken against")
    parser.add_argument("--json", type=Path, help="write the merged document here")
    parser.add_argument("--markdown", type=Path, help="write the Markdown table here")
    args = parser.parse_args(argv)
    document = merge([json.loads(f.read_text()) for f in args.files], args.baseline)
    render(document)
    if args.json:
        args.json.write_text(json.dumps(document, indent=2) + "\n")
    if args.markdown:
        args.markdown.write_text(markdown(document, first_column="router / policy"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
