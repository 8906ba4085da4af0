"""``prefix-router serve``."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

from prefix_router.node import (
    Config,
    EarlyHangup,
    add_config_flags,
    build_config,
    configure_logs,
    flush_logs,
    graceful_shutdown,
    log_summary,
    merged_config,
    print_config,
    reload_config,
)
from prefix_router.settings import ConfigError


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    serve = sub.add_parser(
        "serve",
        help="run the OpenAI-compatible routing proxy",
        description="Run the router. Sources, later winning: --config FILE, PREFIX_ROUTER_* variables, flags",
    )
    add_config_flags(serve)
    serve.add_argument(
        "--processes",
        type=int,
        help="serving processes sharing the port and the prefix view (0: one per core)",
    )
    serve.set_defaults(func=run_serve)


def run_serve(args: argparse.Namespace) -> int:
    """``--print-config``: the merged configuration, checked, printed; nothing started or contacted (no
    workers needed, no cluster credentials). Otherwise serve; a bad configuration or an address that
    cannot be bound is one line on stderr and a non-zero exit (2 and 1), never a traceback."""
    try:
        if args.print_config:
            return print_config(merged_config(args))
        early = EarlyHangup()  # before the file is read: a SIGHUP from now on reloads it
        config = build_config(args)
        from prefix_router.proxy.run.processes import process_count

        count = process_count(config.processes)
        if count > 1:
            return serve_processes(config, args, count)
        return serve(config, args, early)
    except ConfigError as exc:
        print(f"prefix-router serve: {exc}", file=sys.stderr)
        return 2


Group = tuple[Path, int, int]  # ``serve --processes``: the channel's directory, this process, how many


def serve(
    config: Config,
    args: argparse.Namespace,
    early: EarlyHangup,
    group: Group | None = None,
    adjust: Callable[[Config], Config] | None = None,
) -> int:
    """Serve ``config`` (``adjust``: applied to it and to every reloaded one, e.g. a serving process's
    fanned-out KV event endpoints)."""
    from prefix_router.node import STATE, Hooks, ListenError, run_app
    from prefix_router.proxy.run.app import create_app

    adjusted = adjust or (lambda c: c)
    config = adjusted(config)
    configure_logs(config.log_level, config.log_format, config.access_log)
    app = create_app(config)
    if group is not None:
        from prefix_router.proxy.run.processes import install_local_replication

        install_local_replication(app, *group)
    source = args.config or "environment and flags"

    async def reloaded() -> None:
        await reload_config(app[STATE], lambda: adjusted(build_config(args)), source)

    hooks = Hooks(
        serving=lambda addresses: log_summary(app, addresses),
        shutdown=lambda: graceful_shutdown(app),
        reload=reloaded,
        early=early,
    )
    try:
        run_app(
            app,
            config.host,
            config.port,
            config.event_loop,
            config.timeouts.client_header_s,
            hooks,
            reuse_port=group is not None,
        )
    except ListenError as exc:
        print(f"prefix-router serve: {exc}", file=sys.stderr)
        return 1
    finally:
        flush_logs()  # a forked serving process ends with os._exit: no logging.shutdown to write what waits
    return 0


def serve_processes(config: Config, args: argparse.Namespace, count: int) -> int:
    """``count`` serving processes under a supervisor (``proxy.run.processes``). The configuration and the
    address are checked here first: a bad one is one line and an exit, not ``count`` failing children."""
    from prefix_router.node import ListenError, bind
    from prefix_router.proxy.run.app import create_app
    from prefix_router.proxy.run.event_fanout import FanoutPlan, fanned_out
    from prefix_router.proxy.run.processes import supervise

    create_app(config)  # every check a single process makes at start (then thrown away: each builds its own)
    try:
        for sock in bind(config.host, config.port, reuse_port=True):
            sock.close()
    except ListenError as exc:
        print(f"prefix-router serve: {exc}", file=sys.stderr)
        return 1
    configure_logs(config.log_level, config.log_format, config.access_log)

    def serve_one(index: int, directory: Path, plan: FanoutPlan) -> None:
        early = EarlyHangup()
        sys.exit(serve(config, args, early, (directory, index, count), lambda c: fanned_out(c, plan)))

    return supervise(config, count, serve_one)
