from __future__ import annotations

import json
import urllib.request

import pytest

from prefix_router.lab.launch import engine_sim as launcher
from prefix_router.lab.launch.engine_sim import EngineSettings, start_engines


def test_start_engines_runs_processes_and_stops_them(monkeypatch: pytest.MonkeyPatch) -> None:
    started = []
    real_popen = launcher.subprocess.Popen

    def recording_popen(*args: object, **kwargs: object) -> object:
        process = real_popen(*args, **kwargs)  # type: ignore[call-overload]
        started.append(process)
        return process

    monkeypatch.setattr(launcher.subprocess, "Popen", recording_popen)
    with start_engines(2, profile="cpu-demo", model="tiny", time_scale=0.01) as urls:
        assert len(set(urls)) == 2
        for url in urls:
            assert url.startswith("http://127.0.0.1:")
            with urllib.request.urlopen(f"{url}/v1/models") as resp:
                assert json.load(resp)["data"][0]["id"] == "tiny"
    assert len(started) == 2
    assert all(p.poll() is not None for p in started)


def test_engine_count_is_bounded() -> None:
    with pytest.raises(ValueError), start_engines(0):
        pass


def test_options_become_command_line_flags() -> None:
    argv = EngineSettings(profile="cpu-demo", kv_capacity_tokens=4096).argv()
    assert argv[:2] == ["--port", "0"]
    assert "--kv-capacity-tokens" in argv and "4096" in argv
    assert "--model" not in argv
