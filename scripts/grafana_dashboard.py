#!/usr/bin/env python3
"""Build deploy/grafana/prefix-router.json, the Grafana dashboard of the router's /metrics, from the metric
names the router exports: every name a panel uses must be one that ``ProxyMetrics`` (with the process
collector) exposes, or the build fails. tests/deploy/test_dashboard.py also checks the file against a live
router's /metrics and that this script reproduces it.

    python scripts/grafana_dashboard.py          # write the file
    python scripts/grafana_dashboard.py --check  # exit 1 when the file is not what this script builds
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

from prefix_router.node.telemetry.metrics import ProxyMetrics
from prefix_router.pool.pool import WorkerPool
from prefix_router.routing.router import Router
from prefix_router.routing.settings import RoutingSettings

OUT = Path(__file__).resolve().parents[1] / "deploy" / "grafana" / "prefix-router.json"
RATE = "[$__rate_interval]"
METRIC = re.compile(r"\b((?:prefix_router|process)_[a-z_]+)\b")


def rate(metric: str, by: str = "", where: str = "") -> str:
    group = f" by ({by})" if by else ""
    return f"sum{group} (rate({metric}{where}{RATE}))"


def quantiles(histogram: str) -> list[tuple[str, str]]:
    return [
        (f"histogram_quantile({q}, sum by (le) (rate({histogram}_bucket{RATE})))", f"p{int(q * 100)}")
        for q in (0.5, 0.95, 0.99)
    ]


FIVE_XX = rate("prefix_router_requests_total", where='{status=~"5.."}')
ALL = rate("prefix_router_requests_total")

# (title, unit, [(PromQL, legend)]); two panels a row
PANELS: list[tuple[str, str, list[tuple[str, str]]]] = [
    ("Requests by status", "reqps", [(rate("prefix_router_requests_total", "status"), "{{status}}")]),
    ("Requests by worker", "reqps", [(rate("prefix_router_requests_total", "worker"), "{{worker}}")]),
    ("Requests by model", "reqps", [(rate("prefix_router_requests_total", "model"), "{{model}}")]),
    ("Error ratio (5xx answered to clients)", "percentunit", [(f"{FIVE_XX} / {ALL}", "5xx")]),
    ("Request latency", "s", quantiles("prefix_router_request_seconds")),
    ("Time to first byte", "s", quantiles("prefix_router_ttft_seconds")),
    ("In flight by worker", "short", [("sum by (worker) (prefix_router_in_flight)", "{{worker}}")]),
    (
        "Workers healthy and draining",
        "short",
        [
            ("sum(prefix_router_worker_healthy)", "healthy"),
            ("sum(prefix_router_worker_draining)", "draining"),
        ],
    ),
    (
        "Routing branches",
        "reqps",
        [(rate("prefix_router_route_branch_total", "policy, branch"), "{{policy}} {{branch}}")],
    ),
    (
        "Cached prompt tokens: predicted vs engine-reported",
        "short",
        [(rate("prefix_router_cached_tokens_total", "kind"), "{{kind}}")],
    ),
    (
        "Predicted cached tokens per request",
        "short",
        [
            (
                f"sum(rate(prefix_router_predicted_prefix_tokens_sum{RATE}))"
                f" / sum(rate(prefix_router_predicted_prefix_tokens_count{RATE}))",
                "mean",
            )
        ],
    ),
    (
        "Engine cache reports by verdict",
        "ops",
        [(rate("prefix_router_cache_reports_total", "verdict"), "{{verdict}}")],
    ),
    (
        "Worker KV capacity: known vs learned",
        "short",
        [("sum by (worker, kind) (prefix_router_worker_capacity_tokens)", "{{worker}} {{kind}}")],
    ),
    (
        "Retries and upstream errors",
        "ops",
        [
            (rate("prefix_router_retries_total"), "retries"),
            (rate("prefix_router_upstream_errors_total", "kind"), "error: {{kind}}"),
        ],
    ),
    (
        "Upstream attempts by worker and status",
        "ops",
        [(rate("prefix_router_upstream_attempts_total", "worker, status"), "{{worker}} {{status}}")],
    ),
    ("Refused by the router", "reqps", [(rate("prefix_router_rejected_total", "status"), "{{status}}")]),
    (
        "Router CPU (cores)",
        "short",
        [("sum by (instance) (rate(process_cpu_seconds_total" + RATE + "))", "{{instance}}")],
    ),
    (
        "Router memory and descriptors",
        "short",
        [
            ("sum by (instance) (process_resident_memory_bytes)", "RSS {{instance}}"),
            ("sum by (instance) (process_open_fds)", "fds {{instance}}"),
        ],
    ),
]


def exported_names() -> set[str]:
    """The sample names of the router's exposition (an empty pool: every family still has its TYPE line)."""
    router = Router(RoutingSettings())
    metrics = ProxyMetrics(WorkerPool(router, 1), router)
    names: set[str] = set()
    for line in metrics.render().decode().splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ", 3)
            suffixes = {"histogram": ("_bucket", "_sum", "_count")}.get(kind, ("",))  # counters: name_total
            names |= {name + suffix for suffix in suffixes}
    return names


def used_names(dashboard: dict[str, Any]) -> set[str]:
    return {
        name for panel in dashboard["panels"] for t in panel["targets"] for name in METRIC.findall(t["expr"])
    }


def panel(index: int, title: str, unit: str, queries: list[tuple[str, str]]) -> dict[str, Any]:
    return {
        "id": index + 1,
        "type": "timeseries",
        "title": title,
        "datasource": {"type": "prometheus", "uid": "${datasource}"},
        "gridPos": {"h": 8, "w": 12, "x": 12 * (index % 2), "y": 8 * (index // 2)},
        "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
        "options": {"legend": {"displayMode": "list", "placement": "bottom"}},
        "targets": [
            {"refId": chr(ord("A") + n), "expr": expr, "legendFormat": legend}
            for n, (expr, legend) in enumerate(queries)
        ],
    }


def build() -> dict[str, Any]:
    dashboard = {
        "title": "prefix-router",
        "uid": "prefix-router",
        "description": "Requests, routing and workers of prefix-router (its /metrics); one series per "
        "router replica summed. Built by scripts/grafana_dashboard.py.",
        "tags": ["prefix-router", "llm"],
        "schemaVersion": 39,
        "version": 1,
        "editable": True,
        "refresh": "30s",
        "time": {"from": "now-1h", "to": "now"},
        "templating": {
            "list": [
                {"name": "datasource", "label": "Prometheus", "type": "datasource", "query": "prometheus"}
            ]
        },
        "panels": [panel(i, *row) for i, row in enumerate(PANELS)],
    }
    unknown = used_names(dashboard) - exported_names()
    if unknown:
        raise SystemExit(f"the dashboard uses metrics the router does not export: {sorted(unknown)}")
    return dashboard


def render() -> str:
    return json.dumps(build(), indent=2) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare with the file instead of writing it")
    args = parser.parse_args()
    text = render()
    if args.check:
        if not OUT.exists() or OUT.read_text() != text:
            print(f"{OUT} is out of date: run python scripts/grafana_dashboard.py", file=sys.stderr)
            return 1
        return 0
    OUT.write_text(text)
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
