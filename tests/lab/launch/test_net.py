"""The launchers' blocking network helpers, against a real local HTTP server."""

from __future__ import annotations

import random
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from prefix_router.lab.launch import net


@pytest.fixture
def server() -> Iterator[str]:
    """``/ok`` answers 200 with a body, ``/later`` answers 503 for its first three calls, the rest 404."""
    calls = {"later": 0}

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            status, body = 404, b"no"
            if self.path == "/ok":
                status, body = 200, b"hello " * 100
            elif self.path == "/later":
                calls["later"] += 1
                status, body = (503, b"wait") if calls["later"] <= 3 else (200, b"up")
            self.send_response(status)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_free_ports_are_free_and_distinct() -> None:
    ports = {net.free_port() for _ in range(5)}
    assert len(ports) == 5
    assert not net.answers(f"http://127.0.0.1:{ports.pop()}/", timeout_s=1.0)


def test_get_text_reads_200_bodies_up_to_a_bound(server: str) -> None:
    assert net.get_text(server + "/ok") == "hello " * 100
    assert net.get_text(server + "/ok", max_bytes=5) == "hello"
    assert net.get_text(server + "/missing") is None
    assert net.get_text(f"http://127.0.0.1:{net.free_port()}/ok", timeout_s=1.0) is None


def test_wait_until_ok_polls_until_200(server: str) -> None:
    assert net.wait_until_ok(server + "/later", time.monotonic() + 10, interval_s=0.01)
    assert net.answers(server + "/later")


def test_wait_until_ok_gives_up_at_the_deadline(server: str) -> None:
    began = time.monotonic()
    assert not net.wait_until_ok(server + "/missing", began + 0.3, interval_s=0.05)
    assert 0.3 <= time.monotonic() - began < 5


def test_wait_until_ok_stops_when_the_check_raises(server: str) -> None:
    def exited() -> None:
        raise RuntimeError("the server exited")

    with pytest.raises(RuntimeError, match="exited"):
        net.wait_until_ok(server + "/missing", time.monotonic() + 10, check=exited)


def free_run(length: int) -> int:
    """The first port of ``length`` consecutive ports below the ephemeral range that nobody listens on."""
    for first in range(20_000, 32_000, length):
        if all(net._bindable("127.0.0.1", p) for p in range(first, first + length)):
            return first
    raise AssertionError("no free run of ports below the ephemeral range")


def test_restartable_ports_are_distinct_free_and_below_the_ephemeral_range() -> None:
    low = net._ephemeral_low(net.EPHEMERAL_RANGE)
    got = net.restartable_ports("127.0.0.1", 12)
    assert len(set(got)) == 12
    assert all(max(1024, low - net.RESTARTABLE_SPAN) <= p < low for p in got)
    assert all(net._bindable("127.0.0.1", p) for p in got)


def test_restartable_ports_pass_over_ports_in_use(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    first = free_run(8)
    ranges = tmp_path / "ip_local_port_range"
    ranges.write_text(f"{first + 8}\t60999\n")
    monkeypatch.setattr(net, "RESTARTABLE_SPAN", 8)
    listeners = []
    for port in range(first, first + 6):
        sock = socket.socket()
        sock.bind(("127.0.0.1", port))
        sock.listen()
        listeners.append(sock)
    try:
        got = net.restartable_ports("127.0.0.1", 2, random.Random(0), ranges)
        assert sorted(got) == [first + 6, first + 7]
    finally:
        for sock in listeners:
            sock.close()


def test_restartable_ports_fall_back_to_free_ports_without_room(tmp_path: Path) -> None:
    ranges = tmp_path / "ip_local_port_range"
    ranges.write_text("1030\t60999\n")  # 6 ports below: not enough room for 3 drawn at random
    got = net.restartable_ports("127.0.0.1", 3, ranges=ranges)
    assert len(set(got)) == 3 and all(p >= 1030 for p in got)
