"""Shared fixtures: real routers in front of workers, a scriptable fake OpenAI-compatible engine
(``support.engines``) served over real HTTP on 127.0.0.1,
any aiohttp app served and stopped, free ports and recorded engine pages."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from _pytest.nodeid import NodeId
from aiohttp import web
from hypothesis import settings

from prefix_router.node.life.server import Running, start
from support import needs, net
from support.engines import Behaviour, FakeEngine
from support.routers import RouterFactory, Routers
from support.serving import ServeFactory, ServeProcesses

EngineFactory = Callable[..., Awaitable[FakeEngine]]

# No per-example deadline in any property test: a deadline is a timed assertion, and the suite runs on
# loaded 2-core machines (an unmarked test failed it once there); performance is the benchmarks' to show.
settings.register_profile("suite", deadline=None)
settings.load_profile("suite")
TESTS = Path(__file__).parent
VLLM_PACKAGE = TESTS / "e2e" / "vllm"


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Under ``pytest -n N --dist loadgroup`` (``make pytest``) each module runs on one worker, so its
    module-scoped fixtures start once, and the real-vLLM package runs on one worker, so its one fleet
    serves all three modules. Without ``-n`` the groups do nothing. Each test is marked with what its
    fixtures need (``support.needs``: ``make unit`` leaves those out) before ``-m`` selects."""
    for item in items:
        in_vllm = item.path.is_relative_to(VLLM_PACKAGE)
        group = VLLM_PACKAGE if in_vllm else item.path
        name = str(group.relative_to(TESTS))
        item.add_marker(pytest.mark.xdist_group(name))
        grouped(item, name)
        needs.mark(item)


def grouped(item: pytest.Item, name: str) -> None:
    """In a ``--dist loadgroup`` worker, ``item``'s id suffixed ``@name``, as the controller's scheduler
    reads groups: pytest-xdist 3.8 sets the suffix on ``item._nodeid``, which pytest 9 no longer reads (its
    id is ``item._id``), so without this every test was scheduled alone and module fixtures started twice."""
    if not (hasattr(item.config, "workerinput") and getattr(item.config.option, "loadgroup", False)):
        return
    if not item.nodeid.endswith(f"@{name}"):
        item._id = NodeId.parse(f"{item.nodeid}@{name}")  # type: ignore[attr-defined]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Iterator[None]:
    """The test being run, for ``support.needs.require`` to check its markers."""
    with needs.running(item):
        yield


ServeApp = Callable[[web.Application], Awaitable[Running]]


@pytest.fixture
async def serve_process(tmp_path: Path) -> AsyncIterator[ServeFactory]:
    """``await serve_process("--worker", url, ..., env={...}, ready=True)``: a real ``prefix-router serve``
    process (``support.serving``); killed afterwards if still running."""
    processes = ServeProcesses(tmp_path)
    try:
        yield processes.spawn
    finally:
        await processes.close()


@pytest.fixture
async def start_router() -> AsyncIterator[RouterFactory]:
    """``await start_router(engine_a, engine_b, settings={"retries.max_attempts": 2}, upstream=...)``: a real
    router app on 127.0.0.1 (``support.routers``) in front of the given workers; all stopped afterwards."""
    routers = Routers()
    try:
        yield routers.start
    finally:
        await routers.close()


@pytest.fixture
async def serve_app() -> AsyncIterator[ServeApp]:
    """``await serve_app(app)`` serves an aiohttp app on a free loopback port; all are stopped afterwards."""
    runnings: list[Running] = []

    async def serve(app: web.Application) -> Running:
        runnings.append(await start(app, shutdown_timeout=0.2))
        return runnings[-1]

    try:
        yield serve
    finally:
        for running in reversed(runnings):
            await running.stop()


@pytest.fixture
def fake_engine(serve_app: ServeApp) -> EngineFactory:
    """``await fake_engine(name="a", **behaviour)`` starts a fake engine; all are stopped afterwards."""

    async def make(name: str = "engine", **behaviour: Any) -> FakeEngine:
        engine = FakeEngine(name, Behaviour(**behaviour))
        engine.running = await serve_app(engine.app())
        return engine

    return make


@pytest.fixture
def free_port() -> Callable[[], int]:
    """A port nobody listens on (bound then released), for connect-failure tests."""
    return net.free_port


# ---------------------------------------------------------------- recorded engine fixtures

ENGINE_FIXTURES = Path(__file__).parent / "pool" / "engines" / "fixtures"  # see its README


def read_fixture(name: str) -> str:
    return (ENGINE_FIXTURES / name).read_text()


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


# ---------------------------------------------------------------- model directories from the SmolLM2 GGUF


@pytest.fixture(scope="session")
def model_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """``name -> ModelDir``: SmolLM2's own chat template and the bundled layouts, derived once per session
    from the GGUF that ``make llama`` installs (missing: a failure, never a skip)."""
    from prefix_router.lab.bench.fidelity.models import all_model_dirs, smollm2_gguf

    needs.require("engine")
    gguf = smollm2_gguf()
    if gguf is None:
        pytest.fail("the SmolLM2 GGUF is not installed: run scripts/install-llama-cpp.sh (make llama)")
    return {m.name: m for m in all_model_dirs(gguf, tmp_path_factory.mktemp("models"))}
