"""A 10-second run of ``benchmarks/soak.py`` (real router and engine-sim processes) with bounds so small
that traffic saturates them: the router's tables fill up to their bounds and never past them, no error
beyond the injected faults (hang-ups, a killed engine), nothing left in flight, no descriptor leak.
(Resident memory levelling off needs the long run: see docs/reliability.md.)"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

SOAK = Path(__file__).resolve().parents[2] / "benchmarks" / "soak.py"


async def test_short_soak_stays_within_bounds(tmp_path: Path) -> None:
    out = tmp_path / "soak.json"
    argv = [str(SOAK), "--duration", "10", "--engines", "2", "--concurrency", "12", "--sample-s", "1"]
    argv += ["--kill-every", "3", "--max-total-blocks", "2000", "--max-sessions", "40", "--out", str(out)]
    proc = await asyncio.create_subprocess_exec(
        sys.executable, *argv, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE
    )
    _, err = await asyncio.wait_for(proc.communicate(), 240)  # a 10 s run took over 90 s on a loaded machine
    assert out.exists(), err.decode()[-2000:]
    report: dict[str, Any] = json.loads(out.read_text())
    summary, samples = report["summary"], report["samples"]
    assert summary["faults_injected"], "an engine should have been killed"
    assert summary["unexpected_errors"] == 0, summary["outcomes"]
    assert summary["outcomes"]["ok"] > 500 and summary["outcomes"].get("hung_up", 0) > 0
    bounds = summary["bounds"]
    assert bounds["index_entries_max"] == 2000  # reached (the bound was exercised) ...
    assert bounds["sessions_max"] == 40
    assert all(s["index_entries"] <= 2000 and s["sessions"] <= 40 for s in samples)  # ... never passed
    assert bounds["tracked_requests_last"] == 0
    assert summary["fds"]["max"] - summary["fds"]["first"] < 32
