"""Sorting py-spy samples into the stages of a request's trip through the router."""

from __future__ import annotations

from collections import Counter

import pytest

from prefix_router.lab.bench.profile import breakdown, per_request, stage_of

ROOT = "run_app (aiohttp/web.py:502);_handle_request (aiohttp/web_protocol.py:577)"
HANDLER = ROOT + ";routed (prefix_router/proxy/edge/handlers.py:81)"
EXCHANGE = HANDLER + ";Exchange.run (prefix_router/proxy/edge/exchange.py:82)"


@pytest.mark.parametrize(
    ("stack", "stage"),
    [
        (
            HANDLER
            + ";parse (prefix_router/node/request/parse.py:107);build (prefix_router/routing/keys.py:247)",
            "key",
        ),
        (HANDLER + ";parse_json (prefix_router/node/request/parse.py:62)", "parse"),
        (EXCHANGE + ";Exchange.choose (x);match (prefix_router/routing/index.py:95)", "route"),
        (EXCHANGE + ";Exchange.attempt (x);send (prefix_router/node/upstream/http_client.py:1)", "forward"),
        (EXCHANGE + ";write_eof (aiohttp/web_response.py:820)", "relay"),
        (
            HANDLER
            + ";settle (prefix_router/node/steps/accounting.py:78)"
            + ";inc (prefix_router/node/telemetry/metrics.py:40)",
            "metrics",
        ),
        (HANDLER + ";settle (prefix_router/node/steps/accounting.py:78)", "accounting"),
        (HANDLER + ";warning (logging/__init__.py:1500)", "logging"),
        (ROOT + ";data_received (aiohttp/web_protocol.py:446)", "server"),
        (ROOT + ";_on_readable (prefix_router/replication/local.py:240)", "share"),
        (
            ROOT + ";_apply (prefix_router/replication/local.py:1);insert (prefix_router/routing/index.py:9)",
            "share",
        ),
        ("run_app (aiohttp/web.py:502)", "loop"),
        (
            EXCHANGE
            + ";Exchange.attempt (x);Connection.start (prefix_router/node/upstream/http_client.py:186)",
            "send",
        ),
        (EXCHANGE + ";write_eof (x);StreamWriter._writelines (aiohttp/http_writer.py:116)", "send"),
        (EXCHANGE + ";write (x);StreamWriter._write (aiohttp/http_writer.py:105)", "send"),
    ],
)
def test_each_sample_lands_in_its_stage(stack: str, stage: str) -> None:
    assert stage_of(stack.split(";")) == stage


def test_breakdown_and_per_request_shares() -> None:
    lines = [
        HANDLER + ";parse_json (prefix_router/node/request/parse.py:62) 30\n",
        "run_app (aiohttp/web.py:502) 10\n",
        EXCHANGE + ";Connection.start (prefix_router/node/upstream/http_client.py:186) 50\n",
        "junk\n",
    ]
    samples = breakdown(lines)
    assert samples == Counter({"parse": 30, "loop": 10, "send": 50})
    stages = per_request(samples, 400e-6, 50e-6)  # user CPU split by the shares, sends left out
    assert stages["parse"] == pytest.approx(300) and stages["loop"] == pytest.approx(100)
    assert stages["kernel"] == pytest.approx(50) and stages["key"] == 0
    assert per_request(Counter(), 1.0, 0.0) == {}
