"""The shared test helpers' own contracts (``tests/support``), where a broken one would show up in other
tests, as flakes."""

from __future__ import annotations

from typing import Any

from support.routers import Routers


async def test_a_routers_openai_clients_are_closed_with_it(fake_engine: Any) -> None:
    """A client left open is closed by the garbage collector on a later test's loop, where the close fails
    and logs that test a traceback (a test that checks its log for one then fails, by chance)."""
    routers = Routers()
    router = await routers.start(await fake_engine("a"))
    client = router.openai()
    answer = await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    assert answer.choices
    await routers.close()
    assert client.is_closed()
