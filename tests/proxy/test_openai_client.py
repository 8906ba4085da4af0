"""The official openai client works unchanged through the router: chat and completions, streamed or not."""

from __future__ import annotations

from typing import Any

import aiohttp
import orjson

from prefix_router.protocol import MATCH_HEADER, WORKER_HEADER

MESSAGES: list[Any] = [{"role": "system", "content": "be brief " * 40}, {"role": "user", "content": "hi"}]


async def test_chat_non_streaming(fake_engine: Any, start_router: Any) -> None:
    engine = await fake_engine("a", reply="the answer", cached_tokens=7)
    router = await start_router(engine)
    raw = await router.openai().chat.completions.with_raw_response.create(model="m", messages=MESSAGES)
    completion = raw.parse()
    assert completion.choices[0].message.content == "the answer"
    assert completion.usage is not None and completion.usage.prompt_tokens_details is not None
    assert completion.usage.prompt_tokens_details.cached_tokens == 7
    assert raw.headers[WORKER_HEADER] == "a"
    assert raw.headers["x-engine"] == "a"
    assert int(raw.headers[MATCH_HEADER]) >= 0


async def test_chat_streaming(fake_engine: Any, start_router: Any) -> None:
    engine = await fake_engine("a", reply="one two three four", chunks=4)
    router = await start_router(engine)
    stream = await router.openai().chat.completions.create(
        model="m", messages=MESSAGES, stream=True, stream_options={"include_usage": True}
    )
    pieces = [c.choices[0].delta.content async for c in stream if c.choices]
    assert "".join(p or "" for p in pieces) == "one two three four"
    assert len(pieces) == 4


async def test_completions_both_ways(fake_engine: Any, start_router: Any) -> None:
    engine = await fake_engine("a", reply="abcdef", chunks=3)
    client = (await start_router(engine)).openai()
    whole = await client.completions.create(model="m", prompt="once upon a time " * 20)
    assert whole.choices[0].text == "abcdef"
    stream = await client.completions.create(model="m", prompt="once upon a time " * 20, stream=True)
    assert "".join([c.choices[0].text async for c in stream]) == "abcdef"


async def test_body_forwarded_byte_for_byte(fake_engine: Any, start_router: Any) -> None:
    engine = await fake_engine("a")
    router = await start_router(engine)
    raw = b'{"model":"m",   "messages":[{"role":"user","content":"h\\u00e9llo"}], "x_extra": [1, 2.50, null]}'
    async with aiohttp.ClientSession() as http:
        resp = await http.post(router.url + "/v1/chat/completions", data=raw, headers={"X-Custom": "kept"})
        assert resp.status == 200
        await resp.read()
    assert engine.generations[-1].body == raw
    assert engine.generations[-1].headers["X-Custom"] == "kept"


async def test_models_is_the_union(fake_engine: Any, start_router: Any) -> None:
    a = await fake_engine("a", models=["m1", "shared"])
    b = await fake_engine("b", models=["m2", "shared"])
    models = await (await start_router(a, b)).openai().models.list()
    assert sorted(m.id for m in models.data) == ["m1", "m2", "shared"]


async def test_routes_by_model(fake_engine: Any, start_router: Any) -> None:
    a = await fake_engine("a", models=["m1"])
    b = await fake_engine("b", models=["m2"])
    client = (await start_router(a, b)).openai()
    for _ in range(5):
        raw = await client.completions.with_raw_response.create(model="m2", prompt="x")
        assert raw.headers[WORKER_HEADER] == "b"
    assert not a.generations


async def test_passthrough_other_v1_paths(fake_engine: Any, start_router: Any) -> None:
    engine = await fake_engine("a")
    router = await start_router(engine)
    async with aiohttp.ClientSession() as http:
        resp = await http.post(router.url + "/v1/embeddings?x=1", data=b'{"model":"m","input":"hi"}')
        body = orjson.loads(await resp.read())
    assert resp.status == 200
    assert body["path"] == "/v1/embeddings?x=1" and body["body"] == '{"model":"m","input":"hi"}'
    assert resp.headers[WORKER_HEADER] == "a"


async def test_engine_tokenize_endpoint_outside_v1_is_passed_through(
    fake_engine: Any, start_router: Any
) -> None:
    engines = [await fake_engine("a", models=["m"]), await fake_engine("b", models=["n"])]
    router = await start_router(*engines)
    async with aiohttp.ClientSession() as http:
        resp = await http.post(router.url + "/tokenize", json={"model": "n", "prompt": "hi"})
        body = orjson.loads(await resp.read())
    assert resp.status == 200
    assert body["path"] == "/tokenize" and orjson.loads(body["body"]) == {"model": "n", "prompt": "hi"}
    assert resp.headers[WORKER_HEADER] == "b"  # the worker serving the body's model


async def test_session_header_gives_sticky_routing(fake_engine: Any, start_router: Any) -> None:
    engines = [await fake_engine(n) for n in ("a", "b", "c", "d")]
    router = await start_router(*engines, settings={"routing.sessions.header": "x-conv"})
    client = router.openai()
    for session in ("s1", "s2"):
        seen = set()
        for i in range(8):
            raw = await client.completions.with_raw_response.create(
                model="m", prompt=f"unrelated prompt {i} " * 20, extra_headers={"x-conv": session}
            )
            seen.add(raw.headers[WORKER_HEADER])
        assert len(seen) == 1
    spread = set()
    for i in range(12):  # without the header, unrelated prompts spread (ties break at random)
        raw = await client.completions.with_raw_response.create(model="m", prompt=f"p {i}")
        spread.add(raw.headers[WORKER_HEADER])
    assert len(spread) > 1
