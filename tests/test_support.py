"""The shared test helpers' own contracts (``tests/support``), where a broken one would show up in other
tests, as flakes."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from support import needs
from support.bodies import ask, turns
from support.routers import Routers

TESTS = Path(__file__).parent


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


def test_a_test_that_reaches_what_it_is_not_marked_for_fails() -> None:
    """``require`` fails the running test (this one, unmarked) rather than let it run in ``make unit``."""
    for need in needs.NEEDS:
        with pytest.raises(pytest.fail.Exception, match=f"needs {need} .* but is not marked so"):
            needs.require(need)


def test_the_fixtures_that_provide_a_need_mark_their_tests(request: pytest.FixtureRequest) -> None:
    """Collection marks a test by its fixtures (this one uses none of them: no marker)."""
    assert not any(request.node.get_closest_marker(need) for need in needs.NEEDS)
    assert set(needs.BY_FIXTURE.values()) == set(needs.NEEDS)


def test_each_providing_fixture_is_defined() -> None:
    """A fixture renamed away from ``BY_FIXTURE`` would leave its tests unmarked (then failed by
    ``require``): every name there is a fixture some conftest or test module defines."""
    defined = {
        name
        for path in TESTS.rglob("*.py")
        for name in re.findall(r"@pytest\.fixture[^\n]*\n(?:async )?def (\w+)", path.read_text())
    }
    assert set(needs.BY_FIXTURE) <= defined, set(needs.BY_FIXTURE) - defined


def test_bodies_are_built_as_the_api_reads_them() -> None:
    assert ask("q", "s", stream=True) == {
        "model": "m",
        "messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "q"}],
        "stream": True,
    }
    assert list(ask("q", max_tokens=1)) == ["model", "messages", "max_tokens"]
    assert turns([{"type": "text", "text": "t"}]) == [
        {"role": "user", "content": [{"type": "text", "text": "t"}]}
    ]
