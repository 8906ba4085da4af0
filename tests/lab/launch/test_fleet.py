"""The launchers' shared skeleton (``lab.launch.fleet``): ports, a failed start stops every process group
(children included), and logs are named per instance. The llama.cpp and vLLM launchers' own tests cover
their command lines."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from prefix_router.lab.launch.fleet import Fleet, Instance, LaunchError, ports

# a server that never answers and leaves a child behind it (its pid in the log)
STUBBORN = ["sh", "-c", 'sleep 60 & echo "child $!"; wait']


class Stubborn(Fleet[Instance]):
    kind = "stubborn"
    max_instances = 3

    def unavailable_reason(self) -> str | None:
        return None

    def _launch(self) -> Iterator[Instance]:
        for index, port in enumerate(ports(self.host, self.count)):
            process, log_path, log = self._spawn(port, STUBBORN, None)
            wait_for_child(log_path)
            yield Instance(index, port, self.url(port), process, log_path, log)


def wait_for_child(log: Path) -> None:
    deadline = time.monotonic() + 30
    while "child" not in log.read_text() and time.monotonic() < deadline:
        time.sleep(0.01)


def test_ports_follow_the_base_or_are_free_and_distinct() -> None:
    assert ports("127.0.0.1", 3, 9100) == [9100, 9101, 9102]
    assert len(set(ports("127.0.0.1", 3))) == 3


@pytest.mark.parametrize("count", [0, Stubborn.max_instances + 1])
def test_instance_count_is_bounded(count: int) -> None:
    with pytest.raises(ValueError, match="instances"):
        Stubborn(count, "127.0.0.1", 1.0, None)


def test_a_start_that_times_out_stops_each_process_group(tmp_path: Path) -> None:
    fleet = Stubborn(2, "127.0.0.1", 0.3, tmp_path)
    with pytest.raises(LaunchError, match="not ready"):
        fleet.start()
    assert fleet.instances == []
    logs = sorted(tmp_path.glob("stubborn-*.log"))
    assert len(logs) == 2
    for log in logs:
        with contextlib.suppress(psutil.NoSuchProcess):  # gone, or dying: a signal takes a moment
            psutil.Process(int(log.read_text().split()[1])).wait(timeout=10)  # alive: TimeoutExpired
