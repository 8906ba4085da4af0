"""The Redis password: a replica authenticates with ``replication.password`` (a Secret's value), and
the password never shows: ``serve --print-config`` masks it, in its own setting or in the URL."""

from __future__ import annotations

from typing import Any

import yaml

from prefix_router.node.config import load_config
from prefix_router.node.life.flags import effective_yaml, mask_url_password
from prefix_router.replication import attach


def test_print_config_masks_the_redis_password() -> None:
    config = load_config(env={}, overrides={"replication": {"url": "redis://:s3cret@redis:6379/0"}})
    text = effective_yaml(config)
    assert "s3cret" not in text
    assert yaml.safe_load(text)["replication"]["url"] == "redis://:**********@redis:6379/0"


def test_a_url_keeps_its_user_and_host_and_a_url_without_password_is_unchanged() -> None:
    assert mask_url_password("rediss://default:p%40ss@h:6380/1") == "rediss://default:**********@h:6380/1"
    assert mask_url_password("redis://redis:6379/0") == "redis://redis:6379/0"
    assert mask_url_password("unix:///run/redis.sock") == "unix:///run/redis.sock"


async def test_a_replica_authenticates_with_the_password_and_none_gets_in_without(
    redis_server: Any, kit: Any
) -> None:
    redis_server.kill()
    redis_server.extra = ["--requirepass", "s3cret-pw"]
    redis_server.start()
    cfg = kit.fast_config(password="s3cret-pw\n")  # as read from a secret file
    with_password = await attach(kit.make_router(), redis_server.url, "a", cfg)
    without = await attach(kit.make_router(), redis_server.url, "b", kit.fast_config(warmup_timeout_s=0.5))
    try:
        assert with_password.warmed and with_password.connected
        assert not without.warmed and not without.connected and without.counters.read_failures == 1
    finally:
        await with_password.stop()
        await without.stop()
    assert "s3cret" not in effective_yaml(
        load_config(env={"PREFIX_ROUTER_REPLICATION__PASSWORD": "s3cret-pw"})
    )
