"""The configuration from the command line, as every command that runs a node reads it (``serve``,
``epp``): the flags they share, merged over the file (``--config``) and the ``PREFIX_ROUTER_*``
variables, and ``--print-config``'s YAML (secrets masked)."""

from __future__ import annotations

import argparse
import os
import random
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from prefix_router.node.config import Config, load_config
from prefix_router.node.control.reload import mask_userinfo
from prefix_router.node.life.build import build_router
from prefix_router.routing import DEFAULT_POLICY, POLICY_NAMES
from prefix_router.settings import ConfigError


def add_config_flags(parser: argparse.ArgumentParser) -> None:
    """The flags ``serve`` and ``epp`` share: workers, discovery, routing, replication, the config file,
    the HTTP listener (``epp``: its metrics and admin API)."""
    parser.add_argument(
        "--worker", action="append", metavar="URL", help="engine base URL (repeat); NAME=URL names it"
    )
    parser.add_argument("--config", metavar="FILE", help="YAML configuration file")
    parser.add_argument(
        "--policy", help=f"routing policy: {', '.join(POLICY_NAMES)} (default: {DEFAULT_POLICY})"
    )
    parser.add_argument("--host", help="listen address (default 127.0.0.1)")
    parser.add_argument("--port", type=int, help="listen port (default 8000)")
    parser.add_argument("--record", metavar="FILE", help="append one Mooncake-format trace line per request")
    parser.add_argument(
        "--replication",
        metavar="URL",
        help="share the prefix view with other router replicas through Redis: redis://HOST:PORT/DB",
    )
    parser.add_argument(
        "--discover-dns", metavar="NAME:PORT", help="workers: every address NAME resolves to (re-resolved)"
    )
    parser.add_argument(
        "--discover-k8s-service",
        metavar="[NAMESPACE/]NAME",
        help="workers: the ready endpoints of this Kubernetes Service (watched)",
    )
    parser.add_argument(
        "--discover-inference-pool",
        metavar="[NAMESPACE/]NAME",
        help="workers: the ready pods this InferencePool (inference.networking.k8s.io/v1) selects (watched)",
    )
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="any config key, e.g. routing.policies.prefix.load_factor=1.5",
    )
    parser.add_argument("--print-config", action="store_true", help="print the merged config (YAML) and exit")


def overrides(args: argparse.Namespace) -> dict[str, Any]:
    """Flags as dotted config keys (only those given)."""
    from prefix_router.settings import parse_scalar

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
        "replication.url": args.replication,
        "processes": getattr(args, "processes", None),
    }
    out.update({k: v for k, v in flags.items() if v is not None})
    out.update(discovery_flags(args))
    return out


def discovery_flags(args: argparse.Namespace) -> dict[str, Any]:
    """``--discover-dns NAME:PORT`` / ``--discover-k8s-service [NAMESPACE/]NAME`` as ``discovery.*`` keys."""
    given = [args.discover_dns, args.discover_k8s_service, args.discover_inference_pool]
    if sum(1 for g in given if g) > 1:
        raise ConfigError(
            "invalid config: --discover-dns, --discover-k8s-service and --discover-inference-pool: choose one"
        )
    if args.discover_inference_pool:
        namespace, _, pool = args.discover_inference_pool.rpartition("/")
        found = {"discovery.kind": "inferencepool", "discovery.service": pool}
        return found | ({"discovery.namespace": namespace} if namespace else {})
    if args.discover_dns:
        name, sep, port = args.discover_dns.rpartition(":")
        if not sep or not name or not port.isdigit():
            raise ConfigError(f"invalid config: --discover-dns {args.discover_dns!r}: expected NAME:PORT")
        return {"discovery.kind": "dns", "discovery.service": name, "discovery.port": int(port)}
    if args.discover_k8s_service:
        namespace, _, service = args.discover_k8s_service.rpartition("/")
        out = {"discovery.kind": "kubernetes", "discovery.service": service}
        return out | ({"discovery.namespace": namespace} if namespace else {})
    return {}


def worker_flag(value: str) -> dict[str, str]:
    """``URL`` or ``NAME=URL``."""
    name, sep, url = value.partition("=")
    if sep and "://" not in name:
        return {"name": name, "url": url}
    return {"url": value}


def merged_config(args: argparse.Namespace) -> Config:
    """The file, then ``PREFIX_ROUTER_*`` variables, then the flags; a refusal's message has the user
    information of the URLs it quotes masked (``mask_userinfo``)."""
    try:
        return load_config(args.config, os.environ, overrides(args))
    except ConfigError as exc:
        raise ConfigError(mask_userinfo(str(exc))) from None


def build_config(args: argparse.Namespace) -> Config:
    """``merged_config``, refused without any worker (static or discovered)."""
    config = merged_config(args)
    if not config.workers and config.discovery.kind is None:
        raise ConfigError(
            "invalid config: workers: none given (use --worker URL, 'workers:' in the config file, or"
            " 'discovery:' / --discover-dns / --discover-k8s-service)"
        )
    return config


def effective_yaml(config: Config) -> str:
    """The merged configuration as YAML; secrets are masked (``SecretStr`` values, and the password of
    any URL, such as the Redis one of ``replication.url``)."""
    import yaml

    return yaml.safe_dump(_mask_urls(config.model_dump(mode="json")), sort_keys=False)


MASK = "**********"  # what pydantic prints for a SecretStr


def _mask_urls(value: Any) -> Any:
    """``value`` with the password of every URL string in it replaced by ``MASK``."""
    if isinstance(value, dict):
        return {key: _mask_urls(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_mask_urls(item) for item in value]
    if isinstance(value, str) and "://" in value and "@" in value:
        return mask_url_password(value)
    return value


def mask_url_password(url: str) -> str:
    """``url`` with its password (``scheme://user:PASSWORD@host``) replaced by ``MASK``; unchanged
    without one."""
    try:
        parts = urlsplit(url)
        password = parts.password
    except ValueError:
        return url
    if not password:
        return url
    user, _, host = parts.netloc.rpartition("@")
    name = user.partition(":")[0]
    return urlunsplit(parts._replace(netloc=f"{name}:{MASK}@{host}"))


def print_config(config: Config) -> int:
    build_router(config, random.Random(0))  # the policy knobs checked too (pure: no I/O)
    print(effective_yaml(config), end="")
    return 0
