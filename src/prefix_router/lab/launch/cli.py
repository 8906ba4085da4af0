"""``prefix-router engines``: run local engines (``llama-cpp``, ``vllm``) and identify running ones
(``detect``)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from prefix_router.lab.launch.fleet import LaunchError
from prefix_router.lab.launch.llama_cpp import MAX_INSTANCES, LlamaCppFleet, LlamaCppSettings, default_venv
from prefix_router.lab.launch.net import get_text
from prefix_router.lab.launch.stopping import interrupted_by_sigterm, wait_for_stop
from prefix_router.lab.launch.vllm_cli import register_vllm
from prefix_router.pool import detect


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser("engines", help="run local engine instances, or identify running engines")
    engines = parser.add_subparsers(dest="engines_command", required=True)
    _register_llama(engines)
    register_vllm(engines)
    _register_detect(engines)


def _register_llama(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("llama-cpp", help="start N llama-cpp-python instances (SmolLM2-135M) and keep them up")
    p.add_argument("--instances", type=int, default=2, help=f"how many (1..{MAX_INSTANCES}; default 2)")
    p.add_argument("--threads", type=int, default=1, help="CPU threads per instance (default 1)")
    p.add_argument("--port-base", type=int, default=8401, help="first port; instance i gets base+i (0: free)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--n-ctx", type=int, default=2048, help="context window per instance, tokens")
    p.add_argument("--cache-mb", type=int, default=1024, help="RAM prompt cache per instance, MiB")
    p.add_argument("--venv", type=Path, default=None, help=f"llama venv (default {default_venv()})")
    p.add_argument("--model", type=Path, default=None, help="a .gguf file (default: SmolLM2 from the venv)")
    p.set_defaults(func=run_llama)


def _register_detect(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("detect", help="name the engine behind each URL from its /metrics and /v1/models")
    p.add_argument("urls", nargs="+", metavar="URL")
    p.set_defaults(func=run_detect)


def settings_from(args: argparse.Namespace) -> LlamaCppSettings:
    return LlamaCppSettings(
        instances=args.instances,
        threads=args.threads,
        port_base=args.port_base,
        host=args.host,
        n_ctx=args.n_ctx,
        cache_bytes=args.cache_mb << 20,
        venv=args.venv or default_venv(),
        model=args.model,
    )


def run_llama(args: argparse.Namespace) -> int:
    try:
        fleet = LlamaCppFleet(settings_from(args))
        with interrupted_by_sigterm(), fleet:
            print_fleet(fleet)
            wait_for_stop()
    except (LaunchError, ValueError) as exc:
        print(f"prefix-router engines llama-cpp: {exc}")
        return 1
    except KeyboardInterrupt:
        pass
    print("stopped")
    return 0


def print_fleet(fleet: LlamaCppFleet) -> None:
    for url in fleet.urls:
        print(url)
    workers = " ".join(f"--worker {url}" for url in fleet.urls)
    print(f"# model: {fleet.settings.model_alias}; route to them with: prefix-router serve {workers}")
    print("# Ctrl-C or SIGTERM stops them", flush=True)


def models_body(text: str | None) -> dict[str, Any] | None:
    try:
        body = json.loads(text) if text else None
    except ValueError:
        return None
    return body if isinstance(body, dict) else None


def run_detect(args: argparse.Namespace) -> int:
    for url in args.urls:
        base = url.rstrip("/")
        engine = detect(get_text(f"{base}/metrics"), models_body(get_text(f"{base}/v1/models")))
        print(f"{base} {engine}")
    return 0
