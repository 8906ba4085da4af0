"""Request bodies sent with ``Content-Encoding`` (gzip, deflate, br, zstd): the router decodes them, so they
go upstream decoded, without the header and with the decoded length (before: the decoded bytes went with
``Content-Encoding: gzip`` and the engine failed on them; br and zstd were refused, their decoders missing).
The body limit holds for the decoded size: a gzip bomb is refused with 413 and the connection closed, it
never reaches an engine, and neither the router's memory nor its CPU follows the bomb's decoded size (its
server used to decode the rest of the body after the 413). A body that is not what its header says is a
400 ``invalid_encoding`` (it was a 500 and two tracebacks)."""

from __future__ import annotations

import asyncio
import gzip
import zlib
from typing import Any

import aiohttp
import brotli
import orjson
import psutil
import pytest
from backports.zstd import compress as zstd_compress

from prefix_router.lab.bench.bombs import gzip_bomb

BODY = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "compressed hello " * 200}]})
ENCODE = {"gzip": gzip.compress, "deflate": zlib.compress, "br": brotli.compress, "zstd": zstd_compress}


@pytest.mark.parametrize("encoding", list(ENCODE))
async def test_a_compressed_body_is_forwarded_decoded(
    echo_engine: Any, start_router: Any, kit: Any, encoding: str
) -> None:
    engine = await echo_engine("w")
    router = await start_router(engine, settings={})
    packed = ENCODE[encoding](BODY)
    status, _, body = await kit.post(router.url, packed, {"Content-Encoding": encoding})
    assert status == 200, body
    _, _, headers, received = engine.seen[-1]
    assert received == BODY and "Content-Encoding" not in headers
    assert headers["Content-Length"] == str(len(BODY))
    assert len(router.state.router.index) > 0  # parsed and routed by its prompt


async def test_an_unknown_encoding_is_forwarded_as_is(echo_engine: Any, start_router: Any, kit: Any) -> None:
    """An encoding the server does not decode reaches the engine with its header, bytes unchanged (a
    body the router cannot read is refused: 400 invalid JSON, so nothing is forwarded on a routed path)."""
    engine = await echo_engine("w")
    router = await start_router(engine)
    status, _, _ = await kit.post(router.url, b"opaque", {"Content-Encoding": "x-custom"}, path="/v1/files")
    assert status == 200
    _, _, headers, received = engine.seen[-1]
    assert received == b"opaque" and headers["Content-Encoding"] == "x-custom"


async def test_a_gzip_bomb_is_refused_after_decoding(echo_engine: Any, start_router: Any, kit: Any) -> None:
    limit = 1024 * 1024
    engine = await echo_engine("w")
    router = await start_router(engine, settings={"limits.max_body_bytes": limit})
    bomb = gzip.compress(b'{"model": "m", "prompt": "' + b"A" * (256 * 1024 * 1024) + b'"}', 9)
    assert len(bomb) < limit  # small on the wire: only the decoded size is over the limit
    process = psutil.Process()
    before = process.memory_info().rss
    for _ in range(3):
        status, headers, body = await kit.post(router.url, bomb, {"Content-Encoding": "gzip"})
        assert status == 413 and kit.openai_error(body)["code"] == "request_too_large"
        assert headers["Connection"] == "close"
    assert process.memory_info().rss - before < 64 * 1024 * 1024  # not 256 MiB per request
    assert not engine.seen


@pytest.mark.parametrize(
    "wire",
    [BODY, gzip.compress(BODY)[:-30], gzip.compress(BODY) + b"trailing junk"],
    ids=["not-gzip", "cut-short", "junk-after"],
)
async def test_a_body_that_is_not_its_encoding_is_a_400(
    echo_engine: Any, start_router: Any, kit: Any, caplog: Any, wire: bytes
) -> None:
    engine = await echo_engine("w")
    router = await start_router(engine)
    status, _, body = await kit.post(router.url, wire, {"Content-Encoding": "gzip"})
    assert status == 400, body
    error = kit.openai_error(body)
    assert error["code"] == "invalid_encoding" and error["param"] == "Content-Encoding", error
    assert not engine.seen
    assert "Traceback" not in caplog.text, caplog.text


async def test_bombs_arriving_at_once_cost_the_limit_not_their_size(
    fake_engine: Any, serve_process: Any, kit: Any
) -> None:
    """Four 2 GiB gzip bombs (2 MB each on the wire) at once, into a real ``serve`` process with a 1 MiB
    body limit: each is a 413 with the connection closed, ``/health`` answers meanwhile, and the process
    spends neither the CPU nor the memory of decoding them (before: its server decoded all 8 GiB after
    the 413s, about 4 s of CPU here; ``benchmarks/gzip_bombs.py`` measures the latency)."""
    engine = await fake_engine("w")
    served = await serve_process("--worker", engine.url, "--set", "limits.max_body_bytes=1048576")
    bomb = gzip_bomb(2048)
    port = int(served.url.rsplit(":", 1)[1])
    process = psutil.Process(served.process.pid)
    cpu_before, rss_before = sum(process.cpu_times()[:2]), process.memory_info().rss
    head = (
        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Content-Encoding: gzip\r\nContent-Length: {len(bomb)}\r\n\r\n"
    ).encode()
    answers = await asyncio.gather(*(kit.raw(port, head + bomb, timeout_s=30) for _ in range(4)))
    async with aiohttp.ClientSession() as http, http.get(served.url + "/health") as resp:
        health = resp.status
    cpu = sum(process.cpu_times()[:2]) - cpu_before
    rss_growth = process.memory_info().rss - rss_before
    for answer in answers:
        assert kit.status_of(answer) == 413 and b"Connection: close" in answer, answer[:200]
    assert health == 200
    assert cpu < 1.5, f"{cpu:.2f} s of CPU: the bombs were decoded"
    assert rss_growth < 64 * 1024 * 1024, f"RSS grew {rss_growth / 2**20:.0f} MiB"
    assert not engine.generations
