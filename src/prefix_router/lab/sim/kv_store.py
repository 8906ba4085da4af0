"""The store simulated engines started together share for prefill/decode disaggregation (simulated).

A folder, so engines in one process and engines in separate processes share it alike:

- ``blocks/``: one empty file per prompt block a prefill engine saved, named by the block's hash (the
  shared-storage flow: vLLM's ``ExampleConnector`` writes a request's KV to files under its
  ``shared_storage_path``; a decode engine loads the longest stored prefix of its prompt);
- ``rooms/``: one file per SGLang bootstrap room whose prefill is done, holding the number of prompt
  blocks it computed (the decode engine of the same room waits for it).

Bounded: beyond ``capacity`` files in either folder, the oldest go first.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Sequence
from pathlib import Path

DEFAULT_CAPACITY = 65_536  # files per folder


class KvStore:
    def __init__(self, path: Path, capacity: int = DEFAULT_CAPACITY) -> None:
        if capacity < 1:
            raise ValueError("capacity must be positive")
        self.path = path
        self.capacity = capacity
        self._blocks = path / "blocks"
        self._rooms = path / "rooms"
        for folder in (self._blocks, self._rooms):
            folder.mkdir(parents=True, exist_ok=True)

    def save(self, blocks: Sequence[int]) -> None:
        """A prefill engine's prompt blocks, now readable by every decode engine."""
        for block in blocks:
            (self._blocks / _name(block)).touch()
        self._trim(self._blocks)

    def match(self, blocks: Sequence[int]) -> int:
        """How many leading ``blocks`` the store holds."""
        count = 0
        for block in blocks:
            if not (self._blocks / _name(block)).exists():
                break
            count += 1
        return count

    def publish(self, room: int, blocks: int) -> None:
        """The prefill of bootstrap room ``room`` is done: ``blocks`` prompt blocks are ready to send."""
        target = self._rooms / str(room)
        partial = target.with_suffix(".tmp")
        partial.write_text(str(blocks))
        partial.replace(target)  # readers see the whole number or nothing
        self._trim(self._rooms)

    def room(self, room: int) -> int | None:
        """The blocks the prefill of ``room`` published (None: not done yet)."""
        try:
            return int((self._rooms / str(room)).read_text())
        except (FileNotFoundError, ValueError):
            return None

    def files(self) -> int:
        return sum(1 for _ in self._blocks.iterdir()) + sum(1 for _ in self._rooms.iterdir())

    def _trim(self, folder: Path) -> None:
        with os.scandir(folder) as entries:
            files = [(e.stat().st_mtime_ns, e.path) for e in entries]
        if len(files) <= self.capacity:
            return
        files.sort()
        for _, path in files[: len(files) - self.capacity]:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)


def _name(block: int) -> str:
    return f"{block & 0xFFFF_FFFF_FFFF_FFFF:016x}"
