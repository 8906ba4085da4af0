"""The Envoy bootstrap: deploy/envoy/envoy.yaml is the generator's default, and a real Envoy accepts every
variant the tests use (``envoy --mode validate``)."""

from __future__ import annotations

import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from prefix_router.lab.launch import envoy
from prefix_router.lab.launch.envoy import (
    EnvoyOptions,
    EnvoyPorts,
    PortTaken,
    bootstrap,
    envoy_binary,
    processing_mode,
    render,
    start_envoy_on_free_ports,
    upstream_cluster,
)
from prefix_router.lab.launch.net import free_port

DEPLOY = Path(__file__).resolve().parents[3] / "deploy" / "envoy"
# deploy/envoy/envoy-fallbacks.yaml: the override_host cluster for the picker's ordered list
FALLBACKS = EnvoyOptions(endpoints=["127.0.0.1:8001", "127.0.0.1:8002"])


def test_the_shipped_bootstraps_are_the_generators() -> None:
    assert yaml.safe_load((DEPLOY / "envoy.yaml").read_text()) == bootstrap()
    assert yaml.safe_load((DEPLOY / "envoy-fallbacks.yaml").read_text()) == bootstrap(options=FALLBACKS)


def test_the_override_host_cluster_lists_the_endpoints_and_the_route_retries() -> None:
    cluster = upstream_cluster(["10.0.0.11:8000", "[fd00::5]:8000"])
    hosts = cluster["load_assignment"]["endpoints"][0]["lb_endpoints"]
    assert [h["endpoint"]["address"]["socket_address"] for h in hosts] == [
        {"address": "10.0.0.11", "port_value": 8000},
        {"address": "fd00::5", "port_value": 8000},
    ]
    route = bootstrap(options=EnvoyOptions(endpoints=["10.0.0.11:8000"], retries=3))["static_resources"]
    action = route["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]["route_config"]
    retry = action["virtual_hosts"][0]["routes"][0]["route"]["retry_policy"]
    assert retry == {"retry_on": "5xx", "num_retries": 3}
    assert "retry_policy" not in str(bootstrap())  # ORIGINAL_DST has one address: nothing to retry on


@pytest.mark.parametrize(
    "options",
    [
        EnvoyOptions(),
        EnvoyOptions(fail_open=True, fallback_endpoint="127.0.0.1:8001"),
        EnvoyOptions(subset=["127.0.0.1:8001", "127.0.0.1:8002"]),
        EnvoyOptions(request_body_mode="BUFFERED"),
        FALLBACKS,
        EnvoyOptions(endpoints=["[::1]:8001"], fail_open=True, request_body_mode="BUFFERED"),
        # the reference gateways' filter, and more listeners with others beside it
        EnvoyOptions(
            response_body_mode="FULL_DUPLEX_STREAMED",
            trailer_mode="SKIP",
            allow_mode_override=False,
            metadata_options=False,
            listeners=(EnvoyOptions(request_body_mode="BUFFERED", response_body_mode="NONE"), EnvoyOptions()),
        ),
    ],
    ids=[
        "fail-closed",
        "fail-open",
        "subset",
        "buffered",
        "fallbacks",
        "fallbacks-v6-fail-open",
        "reference",
    ],
)
def test_envoy_accepts_the_bootstrap(options: EnvoyOptions, tmp_path: Path) -> None:
    config = tmp_path / "envoy.yaml"
    config.write_text(render(EnvoyPorts(), options))
    done = subprocess.run(
        [envoy_binary(), "--mode", "validate", "-c", str(config)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr[-2000:] + done.stdout[-2000:]


def test_trailers_are_sent_on_a_full_duplex_side_whatever_is_asked() -> None:
    """Envoy refuses a FULL_DUPLEX_STREAMED body whose trailers are skipped."""
    duplex = processing_mode(EnvoyOptions(response_body_mode="FULL_DUPLEX_STREAMED", trailer_mode="SKIP"))
    assert duplex["request_trailer_mode"] == duplex["response_trailer_mode"] == "SEND"
    buffered = processing_mode(EnvoyOptions(request_body_mode="BUFFERED", trailer_mode="SKIP"))
    assert buffered["request_trailer_mode"] == buffered["response_trailer_mode"] == "SKIP"


def test_envoy_refuses_a_broken_bootstrap(tmp_path: Path) -> None:
    broken = bootstrap()
    broken["static_resources"]["clusters"][0]["lb_policy"] = "NOT_A_POLICY"
    config = tmp_path / "envoy.yaml"
    config.write_text(yaml.safe_dump(broken))
    done = subprocess.run(
        [envoy_binary(), "--mode", "validate", "-c", str(config)], capture_output=True, timeout=60
    )
    assert done.returncode != 0


@pytest.fixture
def taken_port() -> Iterator[int]:
    """A port another process could have bound between its draw and Envoy's bind: held, listening."""
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        yield held.getsockname()[1]


async def test_a_port_taken_before_envoy_binds_it_is_drawn_again(
    taken_port: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    draws = iter([free_port(), taken_port])  # the first attempt's listen and admin ports; then free ones
    monkeypatch.setattr(envoy, "free_port", lambda: next(draws, None) or free_port())
    started = await start_envoy_on_free_ports(tmp_path, free_port())
    try:
        assert started.ports.admin != taken_port and started.process.returncode is None
        assert len(list(tmp_path.glob("envoy-*.log"))) == 2  # one failed start, one live
    finally:
        await started.stop()


async def test_a_port_taken_at_every_attempt_is_the_error(
    taken_port: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(envoy, "free_port", lambda: taken_port)
    with pytest.raises(PortTaken, match="Address already in use"):
        await start_envoy_on_free_ports(tmp_path, free_port(), attempts=2)
