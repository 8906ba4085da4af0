"""benchmarks/nodelay_shim.c, the peer run's LD_PRELOAD shim: built as peers.sh builds it, it sets
TCP_NODELAY on the TCP connections a process accepts, and leaves a process without it untouched."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

SOURCE = Path(__file__).resolve().parents[3] / "benchmarks" / "nodelay_shim.c"

# A server that accepts one loopback connection and prints TCP_NODELAY of the accepted socket (it never
# sets the option itself, like sglang-router 0.3.2).
SERVER = """
import socket
listener = socket.socket()
listener.bind(("127.0.0.1", 0))
listener.listen(1)
client = socket.create_connection(listener.getsockname())
conn, _ = listener.accept()
print(conn.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
"""


@pytest.fixture(scope="module")
def shim(tmp_path_factory: pytest.TempPathFactory) -> Path:
    gcc = shutil.which("gcc")
    assert gcc is not None, "gcc is needed to build benchmarks/nodelay_shim.c (peers.sh builds it too)"
    out = tmp_path_factory.mktemp("shim") / "nodelay_shim.so"
    cmd = [gcc, "-O2", "-Wall", "-Wextra", "-Werror", "-shared", "-fPIC", "-o", str(out), str(SOURCE), "-ldl"]
    subprocess.run(cmd, check=True, timeout=60)
    return out


def _accepted_nodelay(env: dict[str, str]) -> tuple[int, str]:
    done = subprocess.run(
        [sys.executable, "-c", SERVER], capture_output=True, text=True, env=env, timeout=30, check=True
    )
    return int(done.stdout.strip()), done.stderr


def test_without_the_shim_an_accepted_socket_keeps_nagle() -> None:
    value, _ = _accepted_nodelay({"PATH": "/usr/bin:/bin"})
    assert value == 0


def test_the_shim_sets_tcp_nodelay_on_accepted_sockets_and_says_so(shim: Path) -> None:
    value, stderr = _accepted_nodelay({"LD_PRELOAD": str(shim), "NODELAY_SHIM_LOG": "1"})
    assert value != 0
    assert "TCP_NODELAY was 0, set" in stderr
