"""The compiled build of the routing core for tests: ``COMPILED_ROUTING_CORE_LIB`` (``make test`` builds it
first) or built here by ``scripts/build-compiled.sh`` (cached per source under ``build/compiled``)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from support import needs

ROOT = Path(__file__).resolve().parents[2]
BUILD_TIMEOUT_S = 1100  # a cold build: about 4 minutes on a busy 2-core machine


def compiled_lib() -> Path:
    needs.require("compiled")
    given = os.environ.get("COMPILED_ROUTING_CORE_LIB")
    if given:
        return Path(given)
    env = os.environ | {"PY": sys.executable}
    built = subprocess.run(
        [str(ROOT / "scripts" / "build-compiled.sh")],
        env=env,
        capture_output=True,
        text=True,
        timeout=BUILD_TIMEOUT_S,
    )
    assert built.returncode == 0, built.stderr[-3000:]
    return Path(built.stdout.strip())
