"""Shared helpers for the engine-adapter tests: recorded fixtures live in ``fixtures/`` (see its README)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

FIXTURES = Path(__file__).parent / "fixtures"


def read_fixture(name: str) -> str:
    return (FIXTURES / name).read_text()


def json_fixture(name: str) -> dict[str, Any]:
    body = json.loads(read_fixture(name))
    assert isinstance(body, dict)
    return body


@pytest.fixture
def fixture_text() -> Any:
    return read_fixture


@pytest.fixture
def fixture_json() -> Any:
    return json_fixture
