"""The Redis password never shows: ``serve --print-config`` masks it as it masks the other secrets."""

from __future__ import annotations

import yaml

from prefix_router.node.config import load_config
from prefix_router.node.life.flags import effective_yaml, mask_url_password


def test_print_config_masks_the_redis_password() -> None:
    config = load_config(env={}, overrides={"replication": {"url": "redis://:s3cret@redis:6379/0"}})
    text = effective_yaml(config)
    assert "s3cret" not in text
    assert yaml.safe_load(text)["replication"]["url"] == "redis://:**********@redis:6379/0"


def test_a_url_keeps_its_user_and_host_and_a_url_without_password_is_unchanged() -> None:
    assert mask_url_password("rediss://default:p%40ss@h:6380/1") == "rediss://default:**********@h:6380/1"
    assert mask_url_password("redis://redis:6379/0") == "redis://redis:6379/0"
    assert mask_url_password("unix:///run/redis.sock") == "unix:///run/redis.sock"
