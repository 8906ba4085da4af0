"""A URL's user information (a password in a worker or Redis URL) never reaches a refusal's message: not
``serve``'s one line on stderr, nor the audit line of a refused reload; the URL is still quoted, masked."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from prefix_router.node import reload_config
from prefix_router.node.control.reload import mask_userinfo
from prefix_router.settings import ConfigError

PASSWORD = "s3cret-pw-7f2a"


@pytest.mark.parametrize(
    "url", [f"http://user:{PASSWORD}@10.0.0.5:8000", f"ftp://user:{PASSWORD}@h:1", f"http://{PASSWORD}@h:1"]
)
async def test_a_refused_worker_url_is_quoted_without_its_user_information(kit: Any, url: str) -> None:
    code, err = await kit.refused_config("--worker", url)
    assert code == 2 and "workers.0.url" in err, err
    assert PASSWORD not in err and "***@" in err


async def test_a_refused_reload_audits_the_url_masked(
    fake_engine: Any, start_router: Any, caplog: pytest.LogCaptureFixture
) -> None:
    router = await start_router(await fake_engine("w"))

    def load() -> Any:
        raise ConfigError(f"invalid config: replication.url: bad URL: 'redis://:{PASSWORD}@redis:6379/0'")

    caplog.set_level(logging.INFO)
    assert await reload_config(router.state, load, "test") is None
    [line] = [r.getMessage() for r in caplog.records if "config_reload_refused" in r.getMessage()]
    assert PASSWORD not in line and "redis://***@redis:6379/0" in line


@pytest.mark.parametrize(
    ("text", "masked"),
    [
        ("'http://a:b@h/x' and 'https://c@d:1'", "'http://***@h/x' and 'https://***@d:1'"),
        ("no URL here: a@b", "no URL here: a@b"),
        ("http://h:1/path@x", "http://h:1/path@x"),  # an @ after the authority is not user information
    ],
)
def test_mask_userinfo_hides_the_user_information_only(text: str, masked: str) -> None:
    assert mask_userinfo(text) == masked
