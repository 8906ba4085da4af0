"""The literals clients and tools rely on (README, docs/benchmarks.md): renaming one breaks them."""

from __future__ import annotations

import logging
from typing import get_args

import orjson

from prefix_router import protocol
from prefix_router.node.upstream.seam import FailureKind
from prefix_router.replication.codec import KINDS
from prefix_router.routing.router import ChangeKind
from prefix_router.routing.types import Branch


def test_header_names_and_trace_block_are_the_documented_ones() -> None:
    assert protocol.WORKER_HEADER == "x-prefix-router-worker"
    assert protocol.MATCH_HEADER == "x-prefix-router-prefix-match"
    assert protocol.POLICY_HEADER == "x-prefix-router-policy"
    assert protocol.SESSION_HEADER == "x-session-id"
    assert protocol.MOONCAKE_BLOCK_TOKENS == 512
    assert set(get_args(protocol.Endpoint)) == {"chat", "completions"}


def test_kinds_render_as_their_values_in_labels_logs_and_json() -> None:
    for kind in [*Branch, *ChangeKind, *FailureKind]:
        logged = logging.LogRecord("t", logging.INFO, __file__, 1, "%s", (kind,), None).getMessage()
        assert str(kind) == f"{kind}" == logged == kind.value
        assert orjson.loads(orjson.dumps({"k": kind})) == {"k": kind.value}


def test_change_kinds_keep_their_wire_codes() -> None:
    assert [k.value for k in KINDS] == ["insert", "trim", "forget_older", "capacity"]  # codes 0-3 on the wire
    assert set(KINDS) == set(ChangeKind)
