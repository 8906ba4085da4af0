"""`prefix-router engines llama-cpp` starts real instances, prints their URLs and stops them on SIGTERM."""

from __future__ import annotations

import signal
import subprocess
import sys
import urllib.request

import psutil
import pytest


def read_urls(process: subprocess.Popen[str], count: int) -> list[str]:
    assert process.stdout is not None
    urls: list[str] = []
    while len(urls) < count:
        line = process.stdout.readline()
        assert line, "the launcher exited before printing its URLs"
        if line.startswith("http://"):
            urls.append(line.strip())
    return urls


@pytest.mark.timeout(120)
def test_cli_starts_answers_and_stops_cleanly_on_sigterm(llama_venv: None) -> None:
    launch = "from prefix_router.cli import main; main()"
    cmd = [sys.executable, "-c", launch, "engines", "llama-cpp", "--instances", "2", "--port-base", "0"]
    process = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        urls = read_urls(process, 2)
        children = psutil.Process(process.pid).children(recursive=True)
        assert len(children) >= 2
        for url in urls:
            with urllib.request.urlopen(f"{url}/health", timeout=10) as response:
                assert response.status == 200
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 0
        assert not [c for c in children if c.is_running() and c.status() != psutil.STATUS_ZOMBIE]
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
