"""``prefix-router engines vllm``: start N real vLLM servers, print them, optionally write a ``serve``
config naming them (``--write-config``), keep them up until SIGINT/SIGTERM, then stop them all.

``--prefill N --decode M`` starts a disaggregated fleet instead (``--instances`` is then N + M): N
producers and M consumers of vLLM's shared-storage connector on one temporary folder, removed on stop;
each worker of the written config names its ``role`` (prefill, decode), and the config's
``disaggregation.flow`` is ``shared_storage`` (the connector's flow: a prefill with ``max_tokens: 1``,
then the request on a decode worker).

The config lists each instance as a worker (``engine: vllm``, its model) and, with ``--kv-events``, the
ZMQ endpoint its KV cache events go to under ``kv_events`` (``endpoint``, ``bind: true``: vLLM's publisher
connects to a non-wildcard endpoint, so the router binds it, ``topic``). The file is checked against the
router's config model before it is written; a field the router's worker model does not know yet
(``kv_events``) is left out of the check, not out of the file.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import yaml

from prefix_router.lab.launch.fleet import LaunchError
from prefix_router.lab.launch.stopping import interrupted_by_sigterm, wait_for_stop
from prefix_router.lab.launch.vllm import (
    EVENTS_TOPIC,
    MAX_INSTANCES,
    VllmFleet,
    VllmInstance,
    VllmSettings,
    default_venv,
)
from prefix_router.node import validate
from prefix_router.pool import WorkerSettings
from prefix_router.routing import Flow
from prefix_router.settings import ConfigError

PD_FLOW: Flow = "shared_storage"  # ExampleConnector: prefill with max_tokens 1, then the request


def register_vllm(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("vllm", help="start N real vLLM (CPU build) instances serving SmolLM2-135M")
    p.add_argument("--instances", type=int, default=2, help=f"how many (1..{MAX_INSTANCES}; default 2)")
    p.add_argument("--prefill", type=int, default=0, metavar="N", help="N prefill instances (with --decode)")
    p.add_argument("--decode", type=int, default=0, metavar="M", help="M decode instances (with --prefill)")
    p.add_argument("--port-base", type=int, default=8501, help="first port; instance i gets base+i (0: free)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument(
        "--kv-cache-tokens",
        type=int,
        default=None,
        help="KV cache per instance in tokens, whole 128-token blocks (default: 1 GiB, ~46k)",
    )
    p.add_argument("--kv-events", action="store_true", help="publish KV cache events over ZMQ")
    p.add_argument(
        "--events-port-base",
        type=int,
        default=0,
        help="instance i publishes events to base+i, replays on base+16+i (default base: port-base + 1000)",
    )
    p.add_argument(
        "--cores",
        default=None,
        help="comma-separated core per instance, or auto (default: instance i on core i mod N)",
    )
    p.add_argument(
        "--random-weights",
        action="store_true",
        help="--load-format dummy instead of the GGUF's dequantized weights",
    )
    p.add_argument(
        "--dtype",
        choices=("auto", "bfloat16", "float32"),
        default="auto",
        help="compute type (default auto: bfloat16 where the CPU has avx512_bf16 or amx_bf16, else float32)",
    )
    p.add_argument("--max-model-len", type=int, default=4096)
    p.add_argument("--venv", type=Path, default=None, help=f"vLLM venv (default {default_venv()})")
    p.add_argument("--log-dir", type=Path, default=None, help="instance logs (default: a temporary folder)")
    p.add_argument("--write-config", type=Path, metavar="FILE", help="write a serve config naming them")
    p.set_defaults(func=run_vllm)


def parse_cores(text: str | None) -> tuple[int, ...] | str | None:
    if text is None or text == "auto":
        return text
    return tuple(int(part) for part in text.split(",") if part.strip())


def settings_from(args: argparse.Namespace) -> VllmSettings:
    events_base = args.events_port_base
    if args.kv_events and not events_base and args.port_base:
        events_base = args.port_base + 1000
    knobs: dict[str, Any] = dict(
        port_base=args.port_base,
        host=args.host,
        kv_cache_tokens=args.kv_cache_tokens,
        kv_events=args.kv_events,
        events_port_base=events_base,
        cores=parse_cores(args.cores),
        weights="dummy" if args.random_weights else "real",
        dtype=args.dtype,
        max_model_len=args.max_model_len,
        venv=args.venv or default_venv(),
        log_dir=args.log_dir,
    )
    if args.prefill or args.decode:
        return VllmSettings.disaggregated(args.prefill, args.decode, **knobs)
    return VllmSettings(instances=args.instances, **knobs)


def serve_config(fleet: VllmFleet) -> dict[str, Any]:
    """The ``serve`` config naming the fleet's instances (and their event endpoints when published, with
    key mode ``events``)."""
    workers: list[dict[str, Any]] = []
    for instance in fleet.instances:
        worker: dict[str, Any] = {
            "url": instance.url,
            "name": f"vllm-{instance.index}",
            "engine": "vllm",
            "models": [fleet.settings.model_alias],
        }
        if fleet.settings.roles:
            worker["role"] = instance.role
        if instance.events_endpoint is not None:
            worker["kv_events"] = events_config(instance)
        workers.append(worker)
    config: dict[str, Any] = {"workers": workers}
    if fleet.settings.roles:
        config["disaggregation"] = {"flow": PD_FLOW}
    if any("kv_events" in w for w in workers):  # the key reads the engines' events
        config["routing"] = {"keys": {"mode": "events"}}
    return config


def events_config(instance: VllmInstance) -> dict[str, Any]:
    """``workers[].kv_events`` of an instance that publishes: the router binds, asks its replay socket."""
    config: dict[str, Any] = {"endpoint": instance.events_endpoint, "bind": True, "topic": EVENTS_TOPIC}
    if instance.replay_endpoint is not None:
        config["replay_endpoint"] = instance.replay_endpoint
    return config


NEWER_WORKER_FIELDS = ("kv_events",)  # checked only where the router's worker model has them


def checked_config(config: dict[str, Any]) -> dict[str, Any]:
    """``config`` validated by the router's config model; a field of ``NEWER_WORKER_FIELDS`` is checked
    only where the model knows it."""
    unknown = {f for f in NEWER_WORKER_FIELDS if f not in WorkerSettings.model_fields}
    validate(config | {"workers": [_without(w, unknown) for w in config["workers"]]})
    return config


def _without(worker: dict[str, Any], fields: set[str]) -> dict[str, Any]:
    return {k: v for k, v in worker.items() if k not in fields}


def write_config(fleet: VllmFleet, path: Path) -> None:
    weights = "random weights" if fleet.settings.weights == "dummy" else "weights from the GGUF"
    shape = _shape(fleet)
    head = f"# prefix-router engines vllm: {shape}, SmolLM2-135M ({weights})\n"
    path.write_text(head + yaml.safe_dump(checked_config(serve_config(fleet)), sort_keys=False), "utf-8")


def _shape(fleet: VllmFleet) -> str:
    roles = [i.role for i in fleet.instances]
    if not fleet.settings.roles:
        return f"{len(roles)} instances"
    return f"{roles.count('prefill')} prefill + {roles.count('decode')} decode instances (shared-storage KV)"


def print_fleet(fleet: VllmFleet, config: Path | None) -> None:
    for instance in fleet.instances:
        events = f" events {instance.events_endpoint}" if instance.events_endpoint else ""
        role = f" {instance.role}" if fleet.settings.roles else ""
        print(f"{instance.url}{role}{events}")
    if fleet.kv_storage is not None:
        print(f"# KV storage: {fleet.kv_storage} (removed on stop)")
    weights = "random weights" if fleet.settings.weights == "dummy" else "real weights"
    if config is not None:
        print(f"# model: {fleet.settings.model_alias} ({weights}); route to them with: "
              f"prefix-router serve --config {config}")  # fmt: skip
    else:
        workers = " ".join(f"--worker {url}" for url in fleet.urls)
        print(f"# model: {fleet.settings.model_alias} ({weights}); route to them with: "
              f"prefix-router serve {workers}")  # fmt: skip
    print("# Ctrl-C or SIGTERM stops them", flush=True)


def run_vllm(args: argparse.Namespace) -> int:
    try:
        fleet = VllmFleet(settings_from(args))
        with interrupted_by_sigterm(), fleet:
            if args.write_config is not None:
                write_config(fleet, args.write_config)
            print_fleet(fleet, args.write_config)
            wait_for_stop()
    except (LaunchError, ValueError, ConfigError) as exc:
        print(f"prefix-router engines vllm: {exc}")
        return 1
    except KeyboardInterrupt:
        pass
    print("stopped")
    return 0
