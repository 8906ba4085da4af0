"""Prefill/decode disaggregation on real vLLM engines (the CPU build): one prefill and one decode instance
of vLLM's shared-storage connector (``ExampleConnector``, its storage in a temporary folder), the router
in front with their roles, the ``openai`` client plain and streamed. The decode engine reports the
prompt's blocks as cached for a prompt it never saw: the prefill engine's KV cache reached it. Its own
pair of engines (module-scoped), started after the package's fleet is idle; prompts of a few hundred
tokens, since only whole 128-token blocks go through the storage."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from prefix_router.lab.launch.vllm import VllmFleet
from support.routers import RouterFactory
from support.vllm import BLOCK, MODEL, chat, log_dir, prose, start_pd_fleet

pytestmark = pytest.mark.timeout(900)


@pytest.fixture(scope="module")
def pd_fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[VllmFleet]:
    fleet = start_pd_fleet(log_dir(tmp_path_factory))  # its KV folder removed on stop
    try:
        yield fleet
    finally:
        fleet.stop()


async def test_the_decode_engine_serves_a_prompt_it_never_saw_from_the_prefill_cache(
    pd_fleet: VllmFleet, start_router: RouterFactory
) -> None:
    prefill, decode = pd_fleet.instances
    workers = [
        {"url": prefill.url, "name": "prefill", "engine": "vllm", "role": "prefill"},
        {"url": decode.url, "name": "decode", "engine": "vllm", "role": "decode"},
    ]
    router = await start_router(*workers, settings={"disaggregation.flow": "shared_storage"})
    client = router.openai()
    plain = await client.chat.completions.with_raw_response.create(**chat(prose(4201, 2 * BLOCK), "Go on."))
    answer = plain.parse()
    assert plain.headers["x-prefix-router-worker"] == "decode"
    assert answer.usage is not None and answer.usage.prompt_tokens > 2 * BLOCK
    assert answer.usage.prompt_tokens_details is not None
    assert (answer.usage.prompt_tokens_details.cached_tokens or 0) >= BLOCK  # loaded from the storage

    body = chat(prose(4202, 2 * BLOCK), "Go on.")
    stream = await client.chat.completions.create(**body, stream=True, stream_options={"include_usage": True})
    chunks = [chunk async for chunk in stream]
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    usage = chunks[-1].usage
    assert usage is not None and usage.prompt_tokens_details is not None
    assert (usage.prompt_tokens_details.cached_tokens or 0) >= BLOCK
    assert router.state.metrics.pd_requests.get(("split",)) == 2
    assert answer.model == MODEL
