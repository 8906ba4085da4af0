"""``make test`` brings up everything its tests need: redis-server included (``make redis``), and a
missing redis-server fails the Redis tests instead of skipping them."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from support import needs

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_make_test_ensures_redis_before_pytest() -> None:
    dry = subprocess.run(
        ["make", "-n", "test"], cwd=ROOT, capture_output=True, text=True, timeout=60, check=True
    )
    lines = dry.stdout.splitlines()
    ensure = next(i for i, line in enumerate(lines) if line.strip() == "scripts/redis-server.sh ensure")
    pytest_run = next(i for i, line in enumerate(lines) if "-m pytest" in line)
    assert ensure < pytest_run


def test_a_missing_redis_server_fails_the_redis_tests(tmp_path: Path) -> None:
    """The Redis tests in a pytest whose PATH has no redis-server: failed, not skipped."""
    test = "tests/replication/test_wiring.py::test_replicas_share_affinity_over_http"
    env = {k: v for k, v in os.environ.items() if k != "CI"} | {"PATH": str(tmp_path)}
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rfEs", test]
    proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 1, proc.stdout[-2000:]
    assert "redis-server is not installed" in proc.stdout and "skipped" not in proc.stdout


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_make_test_ensures_the_browser_before_pytest() -> None:
    """The dashboard's browser tests need Debian's chromium and chromium-driver: ``make browser`` (a
    prerequisite of both pytest runs) installs them when missing."""
    dry = subprocess.run(
        ["make", "-n", "test"], cwd=ROOT, capture_output=True, text=True, timeout=60, check=True
    )
    lines = dry.stdout.splitlines()
    ensure = next(i for i, line in enumerate(lines) if line.strip() == "scripts/chromium.sh ensure")
    pytest_run = next(i for i, line in enumerate(lines) if "-m pytest" in line)
    assert ensure < pytest_run


def test_the_browser_script_says_what_is_missing_without_root(tmp_path: Path) -> None:
    """Run as a user without chromium: one line naming the Debian packages, exit 1 (nothing installed)."""
    script = (ROOT / "scripts" / "chromium.sh").read_text().replace("/usr/bin/", str(tmp_path) + "/")
    script = script.replace('"$(id -u)" != 0', '"1" != 0')  # as a user
    (tmp_path / "chromium.sh").write_text(script)
    proc = subprocess.run(["sh", str(tmp_path / "chromium.sh"), "ensure"], capture_output=True, text=True)
    assert proc.returncode == 1 and "chromium-driver" in proc.stderr


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_make_test_installs_vllm_before_pytest() -> None:
    dry = subprocess.run(
        ["make", "-n", "test"], cwd=ROOT, capture_output=True, text=True, timeout=60, check=True
    )
    lines = dry.stdout.splitlines()
    install = next(i for i, line in enumerate(lines) if line.strip() == "scripts/install-vllm.sh")
    pytest_run = next(i for i, line in enumerate(lines) if "-m pytest" in line)
    assert install < pytest_run


def test_install_vllm_is_a_no_op_when_stamped(tmp_path: Path) -> None:
    """A venv whose stamp names this recipe is left alone (no python, pip or network is touched)."""
    script = ROOT / "scripts" / "install-vllm.sh"
    recipe = 'eval "$(grep -E "^(VLLM_VERSION|SMOL_VERSION|RECIPE|WANT)=" "$0")"; echo "$WANT"'
    stamp = subprocess.run(["bash", "-c", recipe, str(script)], capture_output=True, text=True, check=True)
    venv = tmp_path / "venv"
    venv.mkdir()
    (venv / ".prefix-router-installed").write_text(stamp.stdout)
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "PY": str(tmp_path / "no-python"),
           "PREFIX_ROUTER_VLLM_VENV": str(venv)}  # fmt: skip
    proc = subprocess.run([str(script)], env=env, capture_output=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    assert sorted(p.name for p in venv.iterdir()) == [".prefix-router-installed"]


def test_a_module_is_one_pytest_xdist_group(request: pytest.FixtureRequest) -> None:
    """``make pytest`` runs two workers with ``--dist loadgroup``: each module whole on one of them."""
    groups = [mark.args for mark in request.node.iter_markers("xdist_group")]
    assert groups == [("test_make.py",)]
    if hasattr(request.config, "workerinput") and request.config.option.loadgroup:  # under make pytest
        assert request.node.nodeid.endswith("@test_make.py")  # the scheduler reads the group there


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_make_pytest_runs_two_workers_by_module() -> None:
    dry = subprocess.run(
        ["make", "-n", "pytest"], cwd=ROOT, capture_output=True, text=True, timeout=60, check=True
    )
    run = next(line for line in dry.stdout.splitlines() if "-m pytest" in line)
    assert "-n 2 --dist loadgroup" in run


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_make_unit_leaves_out_every_need() -> None:
    """``make unit`` selects the tests with none of ``support.needs.NEEDS``' markers, and installs no
    engine, Redis or compiled build first."""
    dry = subprocess.run(
        ["make", "-n", "unit"], cwd=ROOT, capture_output=True, text=True, timeout=60, check=True
    )
    run = next(line for line in dry.stdout.splitlines() if "-m pytest" in line)
    assert f'-m "{needs.UNIT}"' in run and "-n 2" in run
    assert not any(
        script in dry.stdout for script in ("install-llama", "install-vllm", "redis-server", "build-compiled")
    )


def test_the_venv_gets_the_otel_protos_back_after_its_install(tmp_path: Path) -> None:
    """The venv's install (the otel extra among its extras) is followed by ``scripts/otel-protos.sh``,
    which reinstalls the extra's own opentelemetry-proto pin over xds-protos' stale copy (a stand-in pip
    records what it is asked)."""
    makefile = (ROOT / "Makefile").read_text().splitlines()
    install = next(i for i, line in enumerate(makefile) if "pip install" in line and "-e '.[" in line)
    assert "otel" in makefile[install].split("[", 1)[1]
    assert makefile[install + 1].strip() == "scripts/otel-protos.sh $(BIN)/pip"
    pip = tmp_path / "pip"
    pip.write_text(f'#!/bin/sh\necho "$@" > {tmp_path / "asked"}\n')
    pip.chmod(0o755)
    subprocess.run([str(ROOT / "scripts" / "otel-protos.sh"), str(pip)], check=True, timeout=30)
    asked = (tmp_path / "asked").read_text().split()
    pin = next(r for r in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]["otel"] if r.startswith("opentelemetry-proto=="))  # fmt: skip
    assert asked[0] == "install" and {"--no-deps", "--force-reinstall"} <= set(asked) and asked[-1] == pin
