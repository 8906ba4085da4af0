"""Token units through the real HTTP proxy: the router learns what a model's key characters are worth from
the engine's ``usage.prompt_tokens`` (``routing/units.py``), so that in character blocks a repeat is
predicted within one block of what the engine holds, and never above it; /admin and /metrics show it."""

from __future__ import annotations

from typing import Any

import aiohttp
import orjson
from prometheus_client.parser import text_string_to_metric_families

from prefix_router.protocol import MATCH_HEADER
from support.bodies import ask
from support.client import routed

TOKEN = "admin-token-for-units-tests"
WORDS = "the quick brown fox jumps over a lazy dog while careful librarians answer every question "


def chat(n: int, question: str = "what is in the catalogue?") -> dict[str, Any]:
    system = f"system prompt {n:04d}. " + WORDS * 50  # ~4,300 characters: ~1,080 nominal tokens
    return ask(question, system)


async def predicted(http: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> int:
    return (await routed(url, body, http))[1]


async def repeat_after_warmup(engine: Any, url: str) -> tuple[int, int]:
    """Eight prompts (the warm-up), then one twice: (the repeat's prediction, the engine's prompt tokens)."""
    async with aiohttp.ClientSession() as http:
        for n in range(8):
            await predicted(http, url, chat(n))
        await predicted(http, url, chat(100))
        return await predicted(http, url, chat(100)), engine.rendered_tokens(chat(100))


async def test_a_repeat_is_predicted_within_a_block_of_the_engines_count_and_never_above(
    fake_engine: Any, start_router: Any
) -> None:
    engine = await fake_engine("a", chars_per_token=5.0)  # ~5 characters per token, as SmolLM2 on prose
    router = await start_router(engine, settings={"auth.admin_token": TOKEN})
    got, truth = await repeat_after_warmup(engine, router.url)
    assert truth - 16 <= got <= truth, (got, truth)  # the whole prompt is shared: the engine holds it all

    async with aiohttp.ClientSession() as http:
        headers = {"Authorization": f"Bearer {TOKEN}"}
        async with http.get(router.url + "/admin/routing", headers=headers) as resp:
            summary = orjson.loads(await resp.read())["summary"]
        async with http.get(router.url + "/metrics") as resp:
            text = await resp.text()
    units = summary["units"]["m"]
    assert units["samples"] == 10 and 4.8 < units["chars_per_token"] < 5.2
    assert units["chars_per_token"] <= units["chars_per_token_used"] < 5.3
    assert 12.0 < summary["workers"]["a"]["block_tokens"] < 13.4  # 64 characters at ~5 per token
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
    learned = samples[("prefix_router_chars_per_token", (("kind", "learned"), ("model", "m")))]
    assert learned == units["chars_per_token"]
    assert samples[("prefix_router_chars_per_token", (("kind", "used"), ("model", "m")))] >= learned
    assert samples[("prefix_router_units_samples_total", (("model", "m"),))] == 10


async def test_at_the_configured_chars_per_token_the_same_repeat_is_over_predicted(
    fake_engine: Any, start_router: Any
) -> None:
    """The contrast: with the learning off, 4 characters per token over-counts this engine's tokens."""
    engine = await fake_engine("a", chars_per_token=5.0)
    router = await start_router(engine, settings={"routing.units.learn": False})
    got, truth = await repeat_after_warmup(engine, router.url)
    assert got > truth * 1.15, (got, truth)


async def test_an_engine_denser_than_the_estimate_is_learned_too(fake_engine: Any, start_router: Any) -> None:
    """3 characters per token (code, other scripts): the fixed estimate under-counts; learned, the repeat is
    predicted within a block, never above."""
    engine = await fake_engine("a", chars_per_token=3.0)
    router = await start_router(engine)
    got, truth = await repeat_after_warmup(engine, router.url)
    assert truth - 22 <= got <= truth, (got, truth)  # a block of 64 characters is ~21 tokens


async def test_token_id_prompts_are_counted_exactly_and_teach_nothing(
    fake_engine: Any, start_router: Any
) -> None:
    engine = await fake_engine("a", chars_per_token=5.0)
    router = await start_router(engine)
    ids = list(range(1, 2049))
    async with aiohttp.ClientSession() as http:
        for _ in range(10):
            async with http.post(router.url + "/v1/completions", json={"model": "m", "prompt": ids}) as resp:
                assert resp.status == 200
                got = int(resp.headers[MATCH_HEADER])
    assert got == 2048  # blocks of 16 ids are worth 16 tokens, whatever the engine says of text
    assert router.state.router.units.summary() == {}
