"""Locating the shared public traces, which live beside the checkout and are never copied into it.

Search order: an explicit path; ``$PREFIX_ROUTER_TRACES/<file>`` (a folder);
``<repo>/../shared/traces/<file>`` (the repository root found from this file);
``./../shared/traces/<file>`` (from the working directory).
"""

from __future__ import annotations

import os
from pathlib import Path

TRACES_ENV = "PREFIX_ROUTER_TRACES"
SHAREGPT_FILE = "sharegpt_multiturn_subset.jsonl"
MOONCAKE_FILE = "mooncake_conversation_trace.jsonl"


def candidate_paths(filename: str, explicit: str | None = None) -> list[Path]:
    paths = [Path(explicit)] if explicit else []
    env = os.environ.get(TRACES_ENV)
    if env:
        paths.append(Path(env) / filename)
    repo_root = Path(__file__).resolve().parents[4]
    paths.append(repo_root.parent / "shared" / "traces" / filename)
    paths.append(Path.cwd().parent / "shared" / "traces" / filename)
    return paths


def find_trace(filename: str, explicit: str | None = None) -> Path:
    """The first existing candidate; FileNotFoundError naming every place looked at otherwise."""
    paths = candidate_paths(filename, explicit)
    if explicit:
        paths = paths[:1]
    for path in paths:
        if path.is_file():
            return path
    looked = ", ".join(str(p) for p in paths)
    raise FileNotFoundError(
        f"trace {filename} not found (looked at: {looked}); pass its path or set {TRACES_ENV}"
    )
