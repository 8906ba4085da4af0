from __future__ import annotations

import argparse
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from prefix_router.lab.launch import cli


def parser() -> argparse.ArgumentParser:
    root = argparse.ArgumentParser(prog="prefix-router")
    cli.register(root.add_subparsers(dest="command", required=True))
    return root


def test_llama_cpp_flags_map_to_settings() -> None:
    flags = ["--instances", "3", "--threads", "2", "--port-base", "9000", "--cache-mb", "64"]
    args = parser().parse_args(["engines", "llama-cpp", *flags])
    settings = cli.settings_from(args)
    assert (settings.instances, settings.threads, settings.port_base) == (3, 2, 9000)
    assert settings.cache_bytes == 64 << 20
    assert args.func is cli.run_llama


def test_bad_instance_count_exits_with_a_message(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    args = parser().parse_args(["engines", "llama-cpp", "--instances", "0", "--venv", str(tmp_path)])
    assert args.func(args) == 1
    assert "instances" in capsys.readouterr().out


@pytest.fixture
def vllm_like_server(fixture_text: Any) -> Iterator[str]:
    pages = {
        "/metrics": fixture_text("vllm_v0.7_metrics.txt"),
        "/v1/models": fixture_text("vllm_v0.7_models.json"),
    }

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = pages.get(self.path)
            self.send_response(200 if body else 404)
            self.end_headers()
            self.wfile.write((body or "").encode())

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_detect_names_the_engine_behind_a_url(
    vllm_like_server: str, capsys: pytest.CaptureFixture[str]
) -> None:
    args = parser().parse_args(["engines", "detect", vllm_like_server, "http://127.0.0.1:9"])
    assert args.func(args) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines == [f"{vllm_like_server} vllm", "http://127.0.0.1:9 generic"]
