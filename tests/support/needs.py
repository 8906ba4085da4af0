"""What a test needs beyond this checkout and its venv, as a pytest marker: ``engine`` (a real llama.cpp or
vLLM, or the model files their installs bring: ``make llama``, ``make vllm``), ``redis`` (a real
redis-server: ``make redis``) or ``compiled`` (the compiled build: ``make compiled``).

``make unit`` runs the tests with none of these markers, and none marked ``slow`` (a scale study over a
whole real trace, or a fresh install from a wheelhouse: minutes of CPU each, run by ``make test``). The
markers are applied at collection (``mark``): by the fixtures a test uses (``BY_FIXTURE``), or written on
the test where it reaches one directly. Whatever provides one of these calls ``require``, which fails the
running test when it lacks the marker, so a test that needs one cannot slip into ``make unit`` unmarked and
pass only where the thing happens to be installed."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest

NEEDS = ("engine", "redis", "compiled")  # registered, with what each stands for, in pyproject.toml
SLOW = "slow"  # written on the module: what ``make unit`` leaves out for time, not for a need
UNIT = " and ".join(f"not {marker}" for marker in (*NEEDS, SLOW))  # the ``-m`` expression of ``make unit``

# the fixtures that provide one of NEEDS (each calls ``require``), by name
BY_FIXTURE = {
    "model_dirs": "engine",
    "llama_venv": "engine",
    "llama_fleet": "engine",
    "vllm_fleet": "engine",
    "pd_fleet": "engine",
    "vllm_gguf": "engine",
    "redis_server": "redis",
    "compiled_lib": "compiled",
}

_running: list[pytest.Item] = []  # the test being set up, run or torn down (at most one per process)


def mark(item: pytest.Item) -> None:
    """Mark ``item`` with what its fixtures need (``BY_FIXTURE``), each marker once."""
    fixtures = getattr(item, "fixturenames", ())
    for need in sorted({BY_FIXTURE[name] for name in fixtures if name in BY_FIXTURE}):
        if item.get_closest_marker(need) is None:
            item.add_marker(need)


@contextmanager
def running(item: pytest.Item) -> Iterator[None]:
    """``item`` is the running test while the block runs (its setup, call and teardown)."""
    _running.append(item)
    try:
        yield
    finally:
        _running.remove(item)


def require(need: str) -> None:
    """Fail the running test unless it is marked ``need`` (one of ``NEEDS``); outside a test (a script
    run on its own) there is nothing to check."""
    assert need in NEEDS, need
    if _running and _running[-1].get_closest_marker(need) is None:
        pytest.fail(
            f"{_running[-1].nodeid} needs {need} (pyproject.toml's markers) but is not marked so: mark it "
            f"(@pytest.mark.{need}) or name its fixture in support.needs.BY_FIXTURE",
            pytrace=False,
        )
