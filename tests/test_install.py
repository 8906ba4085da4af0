"""The lean serving install: ``pip install <repo>`` with no extras in a fresh venv carries the product
alone (none of the lab's libraries), serves a chat request in front of an engine, and a lab command in it
says how to install the lab in one line (exit 2).

pip installs from a wheelhouse beside pip's own cache (``$XDG_CACHE_HOME`` or ``~/.cache``,
``prefix-router/lean-install-wheels``: the build backend and the product's dependencies as wheels), so a
run needs no index; the first run, or one after a dependency changed (the install then fails without the
index), fills it from the index once and installs again.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from openai import AsyncOpenAI

from prefix_router.cli import LAB_INSTALL_HINT
from support.net import free_port
from support.serving import ServeProcess, wait_serving

ROOT = Path(__file__).resolve().parents[1]
LAB_LIBRARIES = ("numpy", "matplotlib", "rich", "openai", "psutil")  # the lab extra's, never served
PIP_TIMEOUT_S = 240
# a first run fills the wheelhouse from the index (minutes on a busy machine), within the module fixture
pytestmark = [pytest.mark.timeout(900), pytest.mark.slow]  # make test runs it, make unit not
WHEELHOUSE = (
    Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "prefix-router" / "lean-install-wheels"
)


def pip(*args: str) -> None:
    """The test interpreter's pip (``--python`` points it at another environment)."""
    command = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q", *args]
    subprocess.run(command, check=True, capture_output=True, timeout=PIP_TIMEOUT_S)


def copy_project(target: Path) -> Path:
    """What the image copies (pyproject.toml, README.md, setup.py, src/): pip builds in the tree, not in
    the checkout (pure: no COMPILE_ROUTING_CORE here)."""
    target.mkdir()
    for name in ("pyproject.toml", "README.md", "setup.py"):
        shutil.copy2(ROOT / name, target / name)
    shutil.copytree(ROOT / "src", target / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    return target


def fill_wheelhouse(house: Path, project: Path) -> None:
    """With the index: the build backend and the project's dependencies (no extras), as wheels."""
    backend = tomllib.loads((project / "pyproject.toml").read_text())["build-system"]["requires"]
    pip("download", "--dest", str(house), *backend)
    pip("wheel", "--wheel-dir", str(house), str(project))


def install(venv: Path, house: Path, project: Path) -> None:
    python = str(venv / "bin" / "python")
    pip("--python", python, "install", "--no-compile", "--no-index", "--find-links", str(house), str(project))


def clean_env() -> dict[str, str]:
    """The environment of a process of the fresh venv: no PYTHONPATH (the checkout's sources) and no
    configuration variables of the test run."""
    return {k: v for k, v in os.environ.items() if k != "PYTHONPATH" and not k.startswith("PREFIX_ROUTER_")}


@pytest.fixture(scope="module")
def lean_venv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A fresh venv with ``pip install <repo>`` (no extras) done."""
    base = tmp_path_factory.mktemp("lean")
    project = copy_project(base / "project")
    venv = base / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=60)
    house = WHEELHOUSE
    house.mkdir(parents=True, exist_ok=True)
    try:
        install(venv, house, project)
    except subprocess.CalledProcessError:  # first run, or the dependencies changed: fill it, once
        fill_wheelhouse(house, project)
        install(venv, house, project)
    yield venv


def run_in(venv: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(venv / "bin" / argv[0]), *argv[1:]], capture_output=True, text=True, timeout=60, env=clean_env()
    )


def test_the_product_alone_is_installed(lean_venv: Path) -> None:
    probe = "import importlib.util as u, prefix_router; print(prefix_router.__file__); "
    probe += f"print([m for m in {LAB_LIBRARIES!r} if u.find_spec(m)])"
    done = run_in(lean_venv, "python", "-c", probe)
    assert done.returncode == 0, done.stderr
    where, present = done.stdout.splitlines()
    assert Path(where).is_relative_to(lean_venv), where  # the installed copy, not the checkout
    assert present == "[]"


async def test_the_lean_install_serves_a_chat_request(
    lean_venv: Path, fake_engine: Any, tmp_path: Path
) -> None:
    engine = await fake_engine("a", reply="served by the lean install")
    port = free_port()
    log = tmp_path / "serve.log"
    argv = ["serve", "--worker", engine.url, "--port", str(port), "--processes", "1"]
    with log.open("wb") as sink:
        process = await asyncio.create_subprocess_exec(
            str(lean_venv / "bin" / "prefix-router"), *argv, stderr=sink, env=clean_env()
        )
    served = ServeProcess(process, f"http://127.0.0.1:{port}", log)
    try:
        await wait_serving(served, "/ready")
        async with AsyncOpenAI(base_url=served.url + "/v1", api_key="unused", max_retries=0) as client:
            answer = await client.chat.completions.create(
                model="m", messages=[{"role": "user", "content": "hello"}]
            )
        assert answer.choices[0].message.content == "served by the lean install"
        assert len(engine.generations) == 1
    finally:
        await served.stop()  # SIGTERM
    assert process.returncode == 0, served.logs()


@pytest.mark.parametrize("argv", [["demo"], ["bench", "--help"], ["simulate", "--workload", "chatbots"]])
def test_a_lab_command_says_how_to_install_the_lab(lean_venv: Path, argv: list[str]) -> None:
    done = run_in(lean_venv, "prefix-router", *argv)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, done.stderr
    assert lines[0].startswith(f"prefix-router {argv[0]}: ") and LAB_INSTALL_HINT in lines[0]


def test_the_lean_install_ships_the_dashboard_and_top_says_what_it_needs(lean_venv: Path) -> None:
    """The dashboard's page, script and style sheet are package data of the wheel (nothing fetched at run
    time); ``top`` without rich says how to install it, in one line."""
    probe = "from prefix_router.node import dashboard as d; print([len(d.asset(n)) > 0 for n in "
    probe += "('index.html', 'login.html', *d.STATIC)])"
    done = run_in(lean_venv, "python", "-c", probe)
    assert done.returncode == 0 and done.stdout.strip() == "[True, True, True, True]", done.stderr
    done = run_in(lean_venv, "prefix-router", "top", "--once")
    assert done.returncode == 2 and "prefix-router[top]" in done.stderr
