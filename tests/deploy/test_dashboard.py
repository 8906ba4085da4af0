"""deploy/grafana/prefix-router.json: what scripts/grafana_dashboard.py builds, and every metric (and every
label it groups by) is one a live router's /metrics really exports."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from prefix_router.protocol import POLICY_HEADER

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "deploy" / "grafana" / "prefix-router.json"
METRIC = re.compile(r"\b((?:prefix_router|process)_[a-z_]+)\b")
GROUPED = re.compile(r"by \(([^)]*)\)\s*\((?:rate\()?((?:prefix_router|process)_[a-z_]+)")
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hello " * 50}]}


def expressions() -> list[str]:
    dashboard = json.loads(DASHBOARD.read_text())
    return [target["expr"] for panel in dashboard["panels"] for target in panel["targets"]]


def test_the_file_is_what_the_script_builds() -> None:
    script = ROOT / "scripts" / "grafana_dashboard.py"
    proc = subprocess.run(
        [sys.executable, str(script), "--check"], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr


def test_the_grouping_parser_sees_the_labels() -> None:  # the check below depends on it
    found = GROUPED.findall("sum by (worker, status) (rate(prefix_router_upstream_attempts_total[5m]))")
    assert found == [("worker, status", "prefix_router_upstream_attempts_total")]


async def exported(url: str) -> dict[str, set[str]]:
    """Sample name -> label names, from a live router's /metrics."""
    async with aiohttp.ClientSession() as http, http.get(url + "/metrics") as resp:
        text = await resp.text()
    out: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, set()).update(sample.labels)
    return out


async def test_every_metric_and_label_is_exported(fake_engine: Any, start_router: Any) -> None:
    good, bad = await fake_engine("good", cached_tokens=16), await fake_engine("bad", status=500)
    router = await start_router(good, bad)
    async with aiohttp.ClientSession() as http:
        for body in (CHAT, CHAT, {**CHAT, "model": "unknown"}):
            headers = {POLICY_HEADER: "round_robin"}
            async with http.post(router.url + "/v1/chat/completions", json=body, headers=headers) as resp:
                await resp.read()
    names = await exported(router.url)
    used = {name for expr in expressions() for name in METRIC.findall(expr)}
    assert used and used <= set(names), sorted(used - set(names))
    for expr in expressions():
        for labels, metric in GROUPED.findall(expr):
            wanted = {label.strip() for label in labels.split(",")} - {
                "le",
                "instance",
            }  # Prometheus adds instance
            assert wanted <= names[metric], (expr, names[metric])
