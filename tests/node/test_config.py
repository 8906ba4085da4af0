"""Configuration: YAML < environment < flags, and one-line errors naming the bad key."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pydantic
import pytest
import yaml

from prefix_router.node.config import Config, load_config
from prefix_router.node.life.flags import effective_yaml
from prefix_router.settings import ConfigError, set_dotted

YAML = """
port: 7000
host: 0.0.0.0
workers:
  - url: http://a:8000/v1/
    name: a
    weight: 2
    models: [m1]
    engine: vllm
    api_key: upstream-key
routing:
  policy: least_load
  keys: {block_tokens: 32}
timeouts: {connect_s: 1.5}
auth: {admin_token: abcdefgh12}
"""


@pytest.fixture
def config_file(tmp_path: Path) -> Path:
    path = tmp_path / "router.yaml"
    path.write_text(YAML)
    return path


def test_yaml_is_read(config_file: Path) -> None:
    cfg = load_config(config_file, env={})
    assert cfg.port == 7000 and cfg.host == "0.0.0.0"
    worker = cfg.workers[0]
    assert worker.url == "http://a:8000" and worker.name == "a" and worker.weight == 2
    assert worker.models == ["m1"] and worker.engine == "vllm"
    assert worker.api_key is not None and worker.api_key.get_secret_value() == "upstream-key"
    assert "upstream-key" not in repr(cfg)
    assert cfg.routing.policy == "least_load" and cfg.routing.keys.block_chars == 128
    assert cfg.routing.keys.block_tokens == 32  # a block of 32 tokens is 128 chars (chars_per_token 4)
    assert cfg.routing.keys.max_prefix_chars == 1_048_576  # untouched knobs keep their defaults
    assert cfg.timeouts.connect_s == 1.5


def test_env_overrides_file_and_flags_override_env(config_file: Path) -> None:
    env = {
        "PREFIX_ROUTER_PORT": "7100",
        "PREFIX_ROUTER_ROUTING__POLICY": "random",
        "PREFIX_ROUTER_ROUTING__POLICIES__PREFIX__LOAD_FACTOR": "1.5",
        "PREFIX_ROUTER_AUTH__API_KEYS": "k1,k2",
        "OTHER_VARIABLE": "ignored",
    }
    cfg = load_config(config_file, env=env)
    assert (
        cfg.port == 7100 and cfg.routing.policy == "random" and cfg.routing.policies.prefix.load_factor == 1.5
    )
    assert cfg.routing.keys.block_chars == 128  # the file still counts where nothing overrides it
    assert [k.get_secret_value() for k in cfg.auth.api_keys] == ["k1", "k2"]
    cfg = load_config(config_file, env=env, overrides={"port": 7200, "routing.policy": "prefix"})
    assert (
        cfg.port == 7200 and cfg.routing.policy == "prefix" and cfg.routing.policies.prefix.load_factor == 1.5
    )


def test_workers_from_env_and_flags_replace_the_file_list(config_file: Path) -> None:
    cfg = load_config(config_file, env={"PREFIX_ROUTER_WORKERS": "http://x:1, http://y:2"})
    assert [w.url for w in cfg.workers] == ["http://x:1", "http://y:2"]
    cfg = load_config(config_file, env={}, overrides={"workers": [{"url": "http://z:3", "name": "z"}]})
    assert [w.resolved_name() for w in cfg.workers] == ["z"]


@pytest.mark.parametrize(
    ("overrides", "key"),
    [
        ({"port": "eighty"}, "port"),
        ({"port": 70000}, "port"),
        ({"routing.keys.block_tokens": 0}, "routing.keys.block_tokens"),
        ({"routing.keys.max_prefix_chars": 0}, "routing.keys.max_prefix_chars"),
        ({"routing.policy": "nope"}, "routing.policy"),
        ({"routing.bogus_knob": 1}, "routing.bogus_knob"),
        ({"routing.index.bogus_knob": 1}, "routing.index.bogus_knob"),
        ({"routing.policies.prefix.load_factor": -1}, "routing.policies.prefix.load_factor"),
        ({"routing.policies.consistent_hash.replicas": 0}, "routing.policies.consistent_hash.replicas"),
        ({"routing.policies.random.load_factor": 1}, "routing.policies.random.load_factor"),
        ({"routing.policies.nope.load_factor": 1}, "routing.policies.nope"),
        ({"routing.sessions.load_slack": -1}, "routing.sessions.load_slack"),
        ({"routing.load_factor": 1.5}, "routing.load_factor"),  # unknown here: the knob is per policy
        ({"replication.url": "http://redis:6379"}, "replication.url"),
        ({"replication.stream_maxlen": 0}, "replication.stream_maxlen"),
        ({"state.url": "redis://r:6379/0"}, "state"),  # an unknown section
        ({"timeouts.connect_s": 0}, "timeouts.connect_s"),
        ({"limits.max_in_flight": 0}, "limits.max_in_flight"),
        ({"workers": [{"url": "ftp://nope"}]}, "workers.0.url"),
        ({"workers": [{"url": "http://a:1", "weight": 0}]}, "workers.0.weight"),
        ({"workers": [{"url": "http://a:1", "engine": "nonsense"}]}, "workers.0.engine"),
        ({"workers": [{"url": "http://a:1"}, {"url": "http://a:1/"}]}, "workers"),
        ({"auth.admin_token": "short"}, "auth.admin_token"),
        ({"health.path": "health"}, "health.path"),
        ({"unknown_key": 1}, "unknown_key"),
    ],
)
def test_bad_values_are_refused_with_a_one_line_message(overrides: dict[str, object], key: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(env={}, overrides=overrides)
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(f"invalid config: {key}:")


def test_env_typos_are_refused() -> None:
    with pytest.raises(ConfigError, match="prot"):
        load_config(env={"PREFIX_ROUTER_PROT": "9000"})


def test_bad_files_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="No such file"):
        load_config(tmp_path / "missing.yaml", env={})
    bad = tmp_path / "bad.yaml"
    bad.write_text("port: [unclosed")
    with pytest.raises(ConfigError, match="invalid YAML"):
        load_config(bad, env={})
    bad.write_text("- a list\n- not a mapping\n")
    with pytest.raises(ConfigError, match="mapping"):
        load_config(bad, env={})


def test_routing_core_refusals_become_config_errors() -> None:
    from prefix_router.proxy.run.app import create_app

    cfg = load_config(env={})
    # past validation (which refuses the name, above): the router refuses it too, as a ConfigError
    cfg = cfg.model_copy(update={"routing": cfg.routing.model_copy(update={"policy": "nope"})})
    with pytest.raises(ConfigError, match="invalid config: routing: unknown policy"):
        create_app(cfg)


def test_a_seed_makes_the_routers_tie_breaks_repeat() -> None:
    from prefix_router.node.state import STATE
    from prefix_router.proxy.run.app import create_app

    def draws(seed: int | None) -> list[float]:
        cfg = load_config(env={}, overrides={} if seed is None else {"seed": seed})
        rng = create_app(cfg)[STATE].router.rng
        return [rng.random() for _ in range(4)]

    assert draws(7) == draws(7)
    assert draws(7) != draws(8)
    assert draws(None) != draws(None)  # unseeded: the OS's entropy


def test_each_policy_reads_its_own_knob_group() -> None:
    cfg = load_config(
        env={"PREFIX_ROUTER_ROUTING__POLICIES__CONSISTENT_HASH__LOAD_SLACK": "3"},
        overrides={"routing.policies.prefix.load_factor": 2, "routing.sessions.load_factor": 3},
    )
    routing = cfg.routing
    assert routing.policies.consistent_hash.load_slack == 3 and routing.policies.prefix.load_slack == 2
    assert routing.policies.prefix.load_factor == 2 and routing.policies.consistent_hash.load_factor == 1.25
    assert routing.sessions.load_factor == 3 and routing.knobs("prefix") is routing.policies.prefix
    with pytest.raises(pydantic.ValidationError):
        routing.policies.prefix.load_factor = 4  # type: ignore[misc]  # frozen


def test_replication_section_holds_every_replication_knob() -> None:
    cfg = load_config(
        env={"PREFIX_ROUTER_REPLICATION__URL": "redis://r:6379/0"}, overrides={"replication.batch_max": 8}
    )
    assert cfg.replication.url == "redis://r:6379/0" and cfg.replication.batch_max == 8
    assert cfg.replication.stream_key == "prefix-router:changes"
    with pytest.raises(ConfigError, match="replication: backoff_initial_s"):
        load_config(env={}, overrides={"replication.backoff_initial_s": 10})


@pytest.mark.parametrize("twin", ["http://a:1/v1/..", "http://a:1/b/%2E%2E/v1/", "http://A:1/./v1"])
def test_a_base_path_that_leads_back_is_the_same_engine(twin: str) -> None:
    workers = [{"url": "http://a:1", "name": "one"}, {"url": twin, "name": "two"}]
    with pytest.raises(ConfigError, match="the same URL under two names"):
        load_config(env={}, overrides={"workers": workers})


@pytest.mark.parametrize(
    ("workers", "message"),
    [
        ("http://a:1,http://A:1/", "the same URL under two names"),
        ("http://a:80,http://a", "the same URL under two names"),
        # aliases of one address (were two engines)
        ("http://127.0.0.1:1,http://127.1:1", "the same URL under two names"),
        ("http://[::1]:1,http://[0:0:0:0:0:0:0:1]:1", "the same URL under two names"),
        ("http://127.0.0.1:1,http://[::ffff:127.0.0.1]:1", "the same URL under two names"),
        ("http://a:99999", "Port out of range"),
        ("http://a:x1", "Port could not be cast"),
        ("http://:1", "no host"),
        ("http://[fe80::1:1", "Invalid IPv6 URL"),
    ],
)
def test_worker_urls_are_checked(workers: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(env={"PREFIX_ROUTER_WORKERS": workers})


def test_one_engine_twice_under_different_base_paths_is_two_workers() -> None:
    workers = [{"url": "http://a:1/x", "name": "x"}, {"url": "http://a:1/y", "name": "y"}, "http://[::1]:1"]
    cfg = load_config(env={}, overrides={"workers": workers})
    assert [w.url for w in cfg.workers] == ["http://a:1/x", "http://a:1/y", "http://[::1]:1"]


@pytest.mark.parametrize(
    ("settings", "isolated"),
    [
        ({}, False),
        ({"auth.api_keys": ["k1"]}, False),
        ({"auth.api_keys": ["k1", "k2"]}, True),
        ({"tenants.forward_client_auth": True}, True),
        ({"auth.api_keys": ["k1", "k2"], "tenants.isolate": False}, False),
        ({"tenants.isolate": True}, True),
    ],
)
def test_tenant_isolation_defaults_to_on_with_several_tenants(
    settings: dict[str, object], isolated: bool
) -> None:
    loaded = load_config(env={}, overrides=settings)
    assert loaded.tenants.isolate is loaded.routing.keys.isolate_tenants is isolated
    data: dict[str, Any] = {}
    for key, value in settings.items():
        set_dotted(data, key, value)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # pydantic warns when a validator's result would be dropped
        built = Config(**data)  # built directly (tests, embedders), not through model_validate
    assert built.tenants.isolate is built.routing.keys.isolate_tenants is isolated


# ---------------------------------------------------------------------------------------- service links

LINKS = {  # what Kubernetes gives a pod for the Services prefix-router (:80) and prefix-router-redis (:6379)
    "PREFIX_ROUTER_PORT": "tcp://10.96.0.12:80",
    "PREFIX_ROUTER_SERVICE_HOST": "10.96.0.12",
    "PREFIX_ROUTER_SERVICE_PORT": "80",
    "PREFIX_ROUTER_SERVICE_PORT_HTTP": "80",
    "PREFIX_ROUTER_PORT_80_TCP": "tcp://10.96.0.12:80",
    "PREFIX_ROUTER_PORT_80_TCP_PROTO": "tcp",
    "PREFIX_ROUTER_PORT_80_TCP_PORT": "80",
    "PREFIX_ROUTER_PORT_80_TCP_ADDR": "10.96.0.12",
    "PREFIX_ROUTER_REDIS_PORT": "tcp://10.96.0.13:6379",
    "PREFIX_ROUTER_REDIS_SERVICE_HOST": "10.96.0.13",
    "PREFIX_ROUTER_REDIS_SERVICE_PORT_REDIS": "6379",
    "PREFIX_ROUTER_REDIS_PORT_6379_TCP_ADDR": "10.96.0.13",
    "PREFIX_ROUTER_X_PORT_53_UDP": "udp://10.96.0.14:53",
}


def test_kubernetes_service_links_are_not_config(config_file: Path) -> None:
    cfg = load_config(config_file, env=LINKS)
    assert cfg.port == 7000  # the file's, not "tcp://10.96.0.12:80"
    assert load_config(env=LINKS).port == 8000


def test_real_keys_next_to_service_links_still_apply() -> None:
    cfg = load_config(env={**LINKS, "PREFIX_ROUTER_PORT": "9000", "PREFIX_ROUTER_ROUTING__POLICY": "random"})
    assert cfg.port == 9000 and cfg.routing.policy == "random"


def test_the_lab_trace_folder_is_not_config() -> None:
    assert load_config(env={**LINKS, "PREFIX_ROUTER_TRACES": "/data/traces"}) == load_config(env={})
    with pytest.raises(ConfigError, match="traces"):  # nested, it is an unknown key again
        load_config(env={"PREFIX_ROUTER_ROUTING__TRACES": "/data/traces"})


@pytest.mark.parametrize(
    "name,value",
    [
        ("PREFIX_ROUTER_BOGUS", "1"),
        ("PREFIX_ROUTER_REDIS_PORT", "6379"),  # not a link's value: an unknown key
        ("PREFIX_ROUTER_SERVICE_HOSTS", "x"),
        ("PREFIX_ROUTER_ROUTING__SERVICE_HOST", "x"),  # nested with "__": configuration, unknown
    ],
)
def test_other_unknown_keys_still_fail_on_one_line(name: str, value: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(env={**LINKS, name: value})
    message = str(err.value)
    assert "\n" not in message and name.removeprefix("PREFIX_ROUTER_").lower().replace("__", ".") in message


# ---------------------------------------------------------------------------------------- fewer knobs


def leaf_count(value: Any) -> int:
    """The leaves of a printed configuration (``serve --print-config``): an empty mapping has none."""
    if isinstance(value, dict):
        return sum(leaf_count(item) for item in value.values())
    return 1


def test_the_knobs_stay_few() -> None:
    """A knob stays only where an operator has a real choice: adding one must be a decision (this count)."""
    printed = yaml.safe_load(effective_yaml(load_config(env={})))
    assert leaf_count(printed["routing"]) <= 45
    # + ttft (3), dynamo_kv (2), replication password and max_entry_bytes, disaggregation flow and
    # skip_prefill_tokens, a worker's role and bootstrap_port (counted once, under discovery.worker)
    assert leaf_count(printed) == 137


@pytest.mark.parametrize(
    ("old", "value", "new"),
    [
        ("routing.keys.exact_models", {"m": "/models/m"}, "routing.keys.templates"),
        ("routing.keys.tokenizer_path", "/models/m/tokenizer.json", "routing.keys.tokenizer"),
        ("routing.keys.isolate_tenants", True, "tenants.isolate"),
        ("auth.forward_client_auth", True, "tenants.forward_client_auth"),
        ("session_header", "x-conv", "routing.sessions.header"),
        ("routing.precise.block_tokens", 128, "routing.events.block_tokens"),
        ("routing.precise.silence_s", 5, "PreciseTuning"),
        ("routing.precise.home_load_slack", 1, "routing.sessions.load_slack"),
        ("routing.keys.block_chars", 128, "routing.keys.block_tokens"),
        ("routing.feedback.tolerance", 0.4, "FeedbackTuning"),
        ("routing.units.warmup", 2, "UnitTuning"),
        ("limits.exact_parse_in_thread_bytes", 1, "limits.template_parse_in_thread_bytes"),
    ],
)
def test_a_retired_key_is_refused_with_its_new_name(old: str, value: Any, new: str, tmp_path: Path) -> None:
    path = tmp_path / "old.yaml"
    nested: dict[str, Any] = {}
    set_dotted(nested, old, value)
    path.write_text(yaml.safe_dump(nested))
    env = {"PREFIX_ROUTER_" + old.upper().replace(".", "__"): yaml.safe_dump(value, default_flow_style=True)}
    for source in ({"path": path, "env": {}}, {"env": env}, {"env": {}, "overrides": {old: value}}):
        with pytest.raises(ConfigError) as err:
            load_config(**source)  # type: ignore[arg-type]
        message = str(err.value)
        assert "\n" not in message and old.split(".")[-1] in message and new in message, (source, message)


def test_a_kept_key_under_a_retired_section_is_accepted() -> None:
    assert load_config(env={"PREFIX_ROUTER_ROUTING__UNITS__LEARN": "false"}).routing.units.learn is False


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"routing.keys.mode": "tokenizer"}, "mode tokenizer needs routing.keys.tokenizer"),
        ({"routing.keys.tokenizer": "/t.json"}, "tokenizer: only with mode tokenizer"),
        ({"routing.keys.mode": "template"}, "mode template needs routing.keys.templates"),
        ({"routing.keys.mode": "word"}, "routing.keys.mode"),
        (
            {"workers": [{"url": "http://a:1", "kv_events": {"endpoint": "tcp://a:5557"}}]},
            "workers.0.kv_events: needs routing.keys.mode: events",
        ),
    ],
)
def test_a_key_mode_and_its_inputs_must_agree(settings: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message) as err:
        load_config(env={}, overrides=settings)
    assert "\n" not in str(err.value)


def test_workers_with_kv_events_in_mode_events() -> None:
    workers = [{"url": "http://a:1", "kv_events": {"endpoint": "tcp://a:5557"}}]
    cfg = load_config(env={}, overrides={"workers": workers, "routing.keys.mode": "events"})
    assert cfg.routing.keys.mode == "events" and cfg.workers[0].kv_events is not None
