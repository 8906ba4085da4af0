"""``RequestConfig``: the values every request reads, copied from the configuration, and replaced with it
on a reload (``NodeState.reconfigure``)."""

from __future__ import annotations

import inspect
from typing import Any

import aiohttp

from prefix_router.node.config import Config
from prefix_router.node.settings import TenantsSettings
from prefix_router.node.state import RequestConfig
from prefix_router.protocol import WORKER_HEADER
from support.http1 import CHAT
from support.routers import RouterHandle

JSON = {"content-type": "application/json"}
# each copied value: its setting's dotted key and a value other than its default
SETTINGS: dict[str, tuple[str, Any]] = {
    "max_in_flight": ("limits.max_in_flight", 77),
    "max_in_flight_per_worker": ("limits.max_in_flight_per_worker", 7),
    "max_body_bytes": ("limits.max_body_bytes", 12345),
    "parse_in_thread_bytes": ("limits.parse_in_thread_bytes", 999),
    "template_parse_in_thread_bytes": ("limits.template_parse_in_thread_bytes", 888),
    "max_response_buffer_bytes": ("limits.max_response_buffer_bytes", 54321),
    "max_generated_chars": ("limits.max_generated_chars", 4321),
    "max_sse_line_bytes": ("limits.max_sse_line_bytes", 6543),
    "client_body_s": ("timeouts.client_body_s", 3.5),
    "total_s": ("timeouts.total_s", 33.0),
    "first_byte_s": ("timeouts.first_byte_s", 22.0),
    "stream_idle_s": ("timeouts.stream_idle_s", 11.0),
    "max_attempts": ("retries.max_attempts", 4),
    "policy": ("routing.policy", "round_robin"),
    "isolate_tenants": ("tenants.isolate", True),
    "render": ("routing.events.render", False),
    "session_header": ("routing.sessions.header", "x-my-session"),
    "cache_salt": ("tenants.cache_salt", True),
    "decision_headers": ("tenants.decision_headers", False),
    "forward_client_auth": ("tenants.forward_client_auth", True),
    "access_log": ("access_log", False),
}


def config_with(values: dict[str, Any]) -> Config:
    data: dict[str, Any] = {"workers": [{"url": "http://127.0.0.1:9", "name": "w0"}]}
    for dotted, value in values.items():
        *parents, leaf = dotted.split(".")
        node = data
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return Config.model_validate(data)


def test_every_value_is_its_settings() -> None:
    attributes = {
        name
        for name, value in vars(RequestConfig).items()
        if inspect.ismemberdescriptor(value) or inspect.isgetsetdescriptor(value)  # pure, compiled
    }
    assert set(SETTINGS) == attributes
    config = config_with(dict(SETTINGS.values()))
    copied = RequestConfig(config)
    for name, (_, value) in SETTINGS.items():
        assert getattr(copied, name) == value, name
    defaults = RequestConfig(config_with({}))
    assert all(getattr(defaults, name) != value for name, (_, value) in SETTINGS.items())


async def test_requests_read_the_values_of_the_new_configuration(fake_engine: Any, start_router: Any) -> None:
    router: RouterHandle = await start_router(await fake_engine("a"))
    async with aiohttp.ClientSession() as http:
        async with http.post(router.url + "/v1/chat/completions", data=CHAT, headers=JSON) as before:
            assert before.status == 200 and before.headers[WORKER_HEADER] == "a"
        state = router.state
        config = state.config.model_copy(update={"tenants": TenantsSettings(decision_headers=False)})
        state.reconfigure(config)
        assert state.config is config and not state.request_config.decision_headers
        async with http.post(router.url + "/v1/chat/completions", data=CHAT, headers=JSON) as after:
            assert after.status == 200 and WORKER_HEADER not in after.headers
