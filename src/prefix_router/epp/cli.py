"""``prefix-router epp``: the endpoint picker (Gateway API Inference Extension) behind an Envoy-based
gateway, with ``serve``'s configuration (workers, discovery, routing, replication, admin auth, metrics on
the HTTP ``--host``/``--port``) and its own gRPC listener."""

from __future__ import annotations

import argparse
import asyncio
import sys

from prefix_router.node import add_config_flags, build_config, merged_config, print_config
from prefix_router.settings import ConfigError


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    epp = sub.add_parser(
        "epp",
        help="run the endpoint picker (ext_proc gRPC) for an Envoy-based gateway",
        description="Run the endpoint picker. Sources, later winning: --config FILE, PREFIX_ROUTER_*"
        " variables, flags. --host/--port: the HTTP listener (metrics, admin API, probes)",
    )
    add_config_flags(epp)
    epp.add_argument("--grpc-host", default="127.0.0.1", help="ext_proc listen address (default 127.0.0.1)")
    epp.add_argument("--grpc-port", type=int, default=9002, help="ext_proc listen port (default 9002)")
    epp.add_argument(
        "--fallbacks",
        type=int,
        default=0,
        help="other endpoints listed after the choice, least loaded first, for a gateway whose override_host"
        " policy retries down the list (default 0: ORIGINAL_DST reads one address)",
    )
    epp.add_argument("--max-streams", type=int, default=4096, help="ext_proc streams served at once")
    epp.add_argument(
        "--max-buffered-bytes",
        type=int,
        default=None,
        help="body bytes held across all streams (default: 4 x limits.max_body_bytes); a request body"
        " over it gets 503",
    )
    epp.set_defaults(func=run_epp)


def run_epp(args: argparse.Namespace) -> int:
    from pydantic import ValidationError

    from prefix_router.epp.settings import EppSettings

    try:
        if args.print_config:
            return print_config(merged_config(args))
        config = build_config(args)
        try:
            settings = EppSettings(
                grpc_host=args.grpc_host,
                grpc_port=args.grpc_port,
                fallbacks=args.fallbacks,
                max_streams=args.max_streams,
                max_buffered_bytes=args.max_buffered_bytes,
                grace_s=config.timeouts.shutdown_s,
            )
        except ValidationError as exc:
            first = exc.errors()[0]
            raise ConfigError(
                f"invalid config: --{first['loc'][0]}: {first['msg']}".replace("_", "-")
            ) from None
    except ConfigError as exc:
        print(f"prefix-router epp: {exc}", file=sys.stderr)
        return 2
    from prefix_router.epp.server import serve_epp
    from prefix_router.node import configure_logs, flush_logs, loop_factory, tune_gc

    configure_logs(config.log_level, config.log_format, config.access_log)
    try:
        source = args.config or "environment and flags"
        tune_gc()
        with asyncio.Runner(loop_factory=loop_factory(config.event_loop)) as runner:
            runner.run(serve_epp(config, settings, lambda: build_config(args), source))
    except OSError as exc:
        print(f"prefix-router epp: {exc}", file=sys.stderr)
        return 1
    finally:
        flush_logs()
    return 0
