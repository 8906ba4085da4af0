"""``prefix-router serve`` (and ``prefix-router bench-overhead``)."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from prefix_router.config import Config, ConfigError, load_config
from prefix_router.routing.policies import POLICY_NAMES


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    serve = sub.add_parser(
        "serve",
        help="run the OpenAI-compatible routing proxy",
        description="Run the router. Sources, later winning: --config FILE, PREFIX_ROUTER_* variables, flags",
    )
    serve.add_argument(
        "--worker", action="append", metavar="URL", help="engine base URL (repeat); NAME=URL names it"
    )
    serve.add_argument("--config", metavar="FILE", help="YAML configuration file")
    serve.add_argument("--policy", help=f"routing policy: {', '.join(POLICY_NAMES)} (default: prefix)")
    serve.add_argument("--host", help="listen address (default 127.0.0.1)")
    serve.add_argument("--port", type=int, help="listen port (default 8000)")
    serve.add_argument("--record", metavar="FILE", help="append one Mooncake-format trace line per request")
    serve.add_argument(
        "--state",
        metavar="URL",
        help="share the prefix view with other replicas through Redis: redis://HOST:PORT/DB",
    )
    serve.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="any config key, e.g. routing.load_factor=1.5",
    )
    serve.add_argument("--print-config", action="store_true", help="print the merged config (YAML) and exit")
    serve.set_defaults(func=run_serve)
    from prefix_router.proxy.bench import register as register_bench

    register_bench(sub)


def overrides(args: argparse.Namespace) -> dict[str, Any]:
    """Flags as dotted config keys (only those given)."""
    from prefix_router.config import parse_scalar

    out: dict[str, Any] = {}
    for item in args.set:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"invalid config: --set {item!r}: expected KEY=VALUE")
        out[key.strip()] = parse_scalar(value)
    if args.worker:
        out["workers"] = [worker_flag(w) for w in args.worker]
    flags = {
        "routing.policy": args.policy,
        "host": args.host,
        "port": args.port,
        "record.file": args.record,
        "state.url": args.state,
    }
    out.update({k: v for k, v in flags.items() if v is not None})
    return out


def worker_flag(value: str) -> dict[str, str]:
    """``URL`` or ``NAME=URL``."""
    name, sep, url = value.partition("=")
    if sep and "://" not in name:
        return {"name": name, "url": url}
    return {"url": value}


def build_config(args: argparse.Namespace) -> Config:
    config = load_config(args.config, os.environ, overrides(args))
    if not config.workers:
        raise ConfigError(
            "invalid config: workers: none given (use --worker URL or 'workers:' in the config file)"
        )
    return config


def effective_yaml(config: Config) -> str:
    """The merged configuration as YAML; secrets are masked."""
    import yaml

    return yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False)


def run_serve(args: argparse.Namespace) -> int:
    from prefix_router.proxy.app import create_app
    from prefix_router.proxy.server import run

    try:
        config = build_config(args)
        app = create_app(config)
    except ConfigError as exc:
        print(f"prefix-router serve: {exc}", file=sys.stderr)
        return 2
    if args.print_config:
        print(effective_yaml(config), end="")
        return 0
    timeouts = config.timeouts
    run(
        app,
        config.host,
        config.port,
        config.event_loop,
        config.log_level,
        timeouts.shutdown_s,
        timeouts.client_header_s,
    )
    return 0
