"""Request bodies sent with ``Content-Encoding`` (gzip, deflate): the router's server decodes them, so they
go upstream decoded, without the header and with the decoded length (before: the decoded bytes went with
``Content-Encoding: gzip`` and the engine failed on them). The body limit holds for the decoded size:
a small gzip bomb is refused with 413 and never reaches an engine, and the router's memory stays bounded."""

from __future__ import annotations

import gzip
import zlib
from typing import Any

import orjson
import psutil
import pytest

BODY = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "compressed hello " * 200}]})
ENCODE = {"gzip": gzip.compress, "deflate": zlib.compress}


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
        status, _, body = await kit.post(router.url, bomb, {"Content-Encoding": "gzip"})
        assert status == 413 and kit.openai_error(body)["code"] == "request_too_large"
    assert process.memory_info().rss - before < 64 * 1024 * 1024  # not 256 MiB per request
    assert not engine.seen
