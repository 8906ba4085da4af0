"""What a SIGHUP reload applies, what waits for a restart, and what its audit line may show."""

from __future__ import annotations

from typing import Any

from prefix_router.node.config import load_config
from prefix_router.node.control.reload import Plan


def config(**overrides: Any) -> Any:
    workers = [{"url": "http://a:1", "name": "a"}, {"url": "http://b:1", "name": "b", "api_key": "old-key"}]
    return load_config(env={}, overrides={"workers": workers, "auth.api_keys": "k-old", **overrides})


def test_plan_sorts_changes_and_keeps_restart_only_values() -> None:
    old = config()
    workers = [{"url": "http://b:1", "name": "b", "api_key": "new-key"}, {"url": "http://c:1", "name": "c"}]
    new = config(
        workers=workers,
        **{"auth.api_keys": "k-new", "retries.max_attempts": 5, "port": 9999, "routing.keys.block_tokens": 2},
    )
    plan = Plan(old, new)
    assert (
        plan.removed == ["a"]
        and [w.name for w in plan.added] == ["c"]
        and [w.name for w in plan.replaced] == ["b"]
    )
    assert set(plan.applied) == {"auth.api_keys", "retries.max_attempts"}
    assert set(plan.restart_needed) == {"port", "routing.keys.block_tokens"}
    merged = plan.config
    assert merged.retries.max_attempts == 5 and merged.auth.api_keys[0].get_secret_value() == "k-new"
    assert merged.port == old.port and merged.routing.keys.block_chars == old.routing.keys.block_chars
    assert [w.name for w in merged.workers] == ["b", "c"]
    shown = plan.changes()
    assert "retries.max_attempts=3->5" in shown and "auth.api_keys=(changed)" in shown
    assert "k-new" not in shown and "k-old" not in shown and "key" not in shown.replace("api_keys", "")


def test_nothing_changed_is_said_so() -> None:
    plan = Plan(config(), config())
    assert plan.changes() == "none" and not (
        plan.added or plan.removed or plan.replaced or plan.restart_needed
    )


def test_a_config_without_client_keys_reloads() -> None:
    """No ``auth.api_keys`` (the default): the merged config leaves them out instead of an empty list, which
    validation refuses; removing every key on reload turns authentication off as the new file says."""
    plain = {"workers": [{"url": "http://a:1", "name": "a"}]}
    old = load_config(env={}, overrides=plain)
    grown = load_config(
        env={}, overrides={"workers": [*plain["workers"], {"url": "http://b:1", "name": "b"}]}
    )
    plan = Plan(old, grown)
    assert [w.name for w in plan.config.workers] == ["a", "b"] and not plan.config.auth.api_keys
    keyless = Plan(config(), load_config(env={}, overrides=plain))
    assert "auth.api_keys" in keyless.applied and not keyless.config.auth.api_keys
