"""The Envoy bootstrap: deploy/envoy/envoy.yaml is the generator's default, and a real Envoy accepts every
variant the tests use (``envoy --mode validate``)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from prefix_router.lab.launch.envoy import EnvoyOptions, EnvoyPorts, bootstrap, envoy_binary, render

SHIPPED = Path(__file__).resolve().parents[3] / "deploy" / "envoy" / "envoy.yaml"


def test_the_shipped_bootstrap_is_the_generators_default() -> None:
    assert yaml.safe_load(SHIPPED.read_text()) == bootstrap()


@pytest.mark.parametrize(
    "options",
    [
        EnvoyOptions(),
        EnvoyOptions(fail_open=True, fallback_endpoint="127.0.0.1:8001"),
        EnvoyOptions(subset=["127.0.0.1:8001", "127.0.0.1:8002"]),
        EnvoyOptions(request_body_mode="BUFFERED"),
    ],
    ids=["fail-closed", "fail-open", "subset", "buffered"],
)
def test_envoy_accepts_the_bootstrap(options: EnvoyOptions, tmp_path: Path) -> None:
    config = tmp_path / "envoy.yaml"
    config.write_text(render(EnvoyPorts(), options))
    done = subprocess.run(
        [envoy_binary(), "--mode", "validate", "-c", str(config)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr[-2000:] + done.stdout[-2000:]


def test_envoy_refuses_a_broken_bootstrap(tmp_path: Path) -> None:
    broken = bootstrap()
    broken["static_resources"]["clusters"][0]["lb_policy"] = "NOT_A_POLICY"
    config = tmp_path / "envoy.yaml"
    config.write_text(yaml.safe_dump(broken))
    done = subprocess.run(
        [envoy_binary(), "--mode", "validate", "-c", str(config)], capture_output=True, timeout=60
    )
    assert done.returncode != 0
