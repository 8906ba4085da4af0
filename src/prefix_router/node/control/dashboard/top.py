"""``prefix-router top``: the dashboard's essentials in a terminal (rich), for an operator on a shell.

It polls a running router's ``/dashboard/data`` (``serve``'s port, or ``epp``'s control port) with the
admin token, read from ``PREFIX_ROUTER_ADMIN_TOKEN`` or ``--token-file`` (never from the command line,
where ``ps`` shows it to everyone), and draws the workers (health, in flight, queue, KV usage, predicted
and reported hit rates, events view and lag), the fleet's latest hit rates and first-token time, the last
decisions with their candidates, and the most requested prefixes with their homes and moves. Needs
``rich`` (``pip install 'prefix-router[top]'``).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import orjson

TOKEN_ENV = "PREFIX_ROUTER_ADMIN_TOKEN"
ROWS = 12  # decisions and prefixes shown
HEALTH_STYLE = {"healthy": "green", "pending": "grey50", "ejected": "bold red"}


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("top", help="the dashboard in a terminal: polls a running router's admin data")
    p.add_argument(
        "--url", default="http://127.0.0.1:8000", help="the router (serve's or epp's control port)"
    )
    p.add_argument("--token-file", type=Path, help=f"the admin token's file (default: ${TOKEN_ENV})")
    p.add_argument("--interval", type=float, default=1.0, help="seconds between polls")
    p.add_argument("--once", action="store_true", help="print one screen and exit")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        from rich.console import Console
        from rich.live import Live
    except ModuleNotFoundError:
        print("prefix-router top needs rich: pip install 'prefix-router[top]'", file=sys.stderr)
        return 2
    token = args.token_file.read_text().strip() if args.token_file else os.environ.get(TOKEN_ENV, "")
    if not token:
        print(f"prefix-router top: set {TOKEN_ENV} or --token-file", file=sys.stderr)
        return 2
    console = Console()
    if args.once:
        doc, error = fetch(args.url, token)
        console.print(screen(doc, error))
        return 0 if error is None else 1
    with Live(console=console, auto_refresh=False, screen=False) as live:
        while True:
            doc, error = fetch(args.url, token)
            live.update(screen(doc, error), refresh=True)
            time.sleep(args.interval)


def fetch(url: str, token: str) -> tuple[dict[str, Any] | None, str | None]:
    request = urllib.request.Request(url.rstrip("/") + "/dashboard/data")
    request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=5) as resp:
            return orjson.loads(resp.read()), None
    except urllib.error.HTTPError as err:
        return None, f"HTTP {err.code}"
    except (OSError, ValueError) as err:
        return None, type(err).__name__


def screen(doc: dict[str, Any] | None, error: str | None) -> Any:
    from rich.console import Group
    from rich.text import Text

    if doc is None:
        return Text(f"prefix-router top: no data ({error})", style="bold red")
    parts: list[Any] = [headline(doc), workers(doc), decisions(doc), prefixes(doc)]
    if doc.get("moves"):
        moves = [f"{m['prefix']} {m['from']} → {m['to']} (t={m['t']:.1f}s)" for m in doc["moves"][-5:]]
        parts.append(Text("moves: " + "; ".join(moves)))
    return Group(*parts)


def headline(doc: dict[str, Any]) -> Any:
    from rich.text import Text

    last = doc["series"][-1] if doc["series"] else {}
    fleet = (
        f"hit predicted {pct(last.get('hit_predicted'))}, reported {pct(last.get('hit_reported'))}, "
        f"TTFT {ms(last.get('ttft_ms'))} (predicted {ms(last.get('predicted_ttft_ms'))})"
    )
    simulated = " SIMULATED (replay)" if doc.get("simulated") else ""
    return Text(
        f"prefix-router{simulated} · policy {doc['policy']} · {doc['decisions_total']} decisions · "
        f"t={doc['t']:.1f}s · last {fleet}",
        style="bold",
    )


def workers(doc: dict[str, Any]) -> Any:
    from rich.table import Table

    table = Table(title="workers", title_justify="left", expand=True)
    for column in ("worker", "health", "in flight", "queue", "KV", "hit pred.", "hit rep.", "view", "lag"):
        table.add_column(column)
    for w in doc["workers"]:
        health = w["health"] + (", draining" if w["draining"] else "")
        precise = w.get("precise") or {}
        table.add_row(
            w["name"], f"[{HEALTH_STYLE.get(w['health'], '')}]{health}[/]", str(w["in_flight"]),
            str(w["queue"]), pct(w["kv_usage"]), pct(w["hit_predicted"]), pct(w["hit_reported"]),
            str(precise.get("state", "–")), ms(precise.get("lag_ms")),
        )  # fmt: skip
    return table


def decisions(doc: dict[str, Any]) -> Any:
    from rich.table import Table

    table = Table(title="last decisions", title_justify="left", expand=True)
    for column in (
        "#",
        "worker",
        "branch",
        "tenant",
        "predicted/prompt",
        "TTFT pred.",
        "TTFT obs.",
        "candidates",
    ):
        table.add_column(column)
    for d in reversed(doc["decisions"][-ROWS:]):
        candidates = ", ".join(f"{c['worker']} {ms(c['ttft_ms'])}" for c in d["candidates"][:4])
        table.add_row(
            str(d["seq"]), d["worker"], d["branch"], d["tenant"] or "–",
            f"{d['predicted_tokens']}/{d['prompt_tokens'] or '–'}", ms(d["predicted_ttft_ms"]),
            ms(d["observed_ttft_ms"]), candidates or "–",
        )  # fmt: skip
    return table


def prefixes(doc: dict[str, Any]) -> Any:
    from rich.table import Table

    table = Table(title="prefix map (most requested)", title_justify="left", expand=True)
    for column in ("prefix", "tenant", "requests", "home", "held on (tokens)"):
        table.add_column(column)
    for p in doc["prefixes"][:ROWS]:
        held = ", ".join(f"{h['worker']} {h['tokens']}" for h in p["holders"][:4])
        home = p["holders"][0]["worker"] if p["holders"] else "nowhere"
        table.add_row(p["prefix"], p["tenant"] or "–", str(p["requests"]), home, held or "–")
    return table


def pct(x: float | None) -> str:
    return "–" if x is None else f"{100 * x:.1f} %"


def ms(x: float | None) -> str:
    return "–" if x is None else f"{x:.1f} ms"
