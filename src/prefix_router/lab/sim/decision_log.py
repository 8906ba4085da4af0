"""The decision feed written to a file (JSON lines), by the simulator (``simulate --decisions FILE``) and
``bench`` (``--decisions FILE``), for ``prefix-router dashboard --replay FILE`` to show offline.

A line is one decision as ``GET /admin/decisions`` shows it (``bench`` copies its in-process router's
feed; the simulator makes the same entries) (``node.telemetry.decisions``: the worker,
branch, predicted tokens and first-token time, each candidate's figures, the outcome; tenants and
prefixes as salted hashes), written when its request finished, with ``"simulated": true`` when it comes
from the simulator. A file holds at most ``MAX_LINES`` (then lines are counted as dropped, not written).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

import orjson

from prefix_router.node import DecisionEntry, Hasher
from prefix_router.routing import Decision, RouteRequest

MAX_LINES = 1_000_000


def _same(name: str) -> str:
    return name


class DecisionLog:
    """Lines of decisions to ``path``; ``names``: how workers are shown (the simulator's are plain)."""

    def __init__(self, path: str | Path, simulated: bool, names: Callable[[str], str] = _same) -> None:
        self.path = Path(path)
        self.simulated = simulated
        self.names = names
        self.hasher = Hasher()
        self.written = 0
        self.dropped = 0
        self._seq = 0
        self.copied = -1  # the last node feed entry copied here (``bench``)
        self._open: dict[str, DecisionEntry] = {}  # by request id, until it finishes
        self._file: IO[bytes] | None = None

    def __enter__(self) -> DecisionLog:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = self.path.open("wb")
        return self

    def __exit__(self, *exc: object) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def decided(self, rid: str, at: float, policy: str, decision: Decision, req: RouteRequest) -> None:
        self._open[rid] = DecisionEntry(self._seq, at, policy, decision, req)
        self._seq += 1

    def first_token(self, rid: str, ttft_s: float) -> None:
        entry = self._open.get(rid)
        if entry is not None:
            entry.observed_ttft_s = ttft_s

    def finished(self, rid: str, status: int, cached: int | None, prompt: int | None) -> None:
        entry = self._open.pop(rid, None)
        if entry is None:
            return
        entry.status, entry.cached_tokens, entry.reported_prompt_tokens = status, cached, prompt
        self.write(entry.view(self.names, self.hasher, 0.0))

    def write(self, view: dict[str, Any]) -> None:
        if self._file is None:
            raise RuntimeError("DecisionLog used outside its with block")
        if self.written >= MAX_LINES:
            self.dropped += 1
            return
        self._file.write(orjson.dumps({**view, "simulated": self.simulated}) + b"\n")
        self.written += 1
