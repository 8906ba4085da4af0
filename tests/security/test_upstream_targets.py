"""No request line, path or header can make the router call a host that is not a configured worker, or
reach a path outside ``/v1/`` on a worker. Checked over raw sockets (so that nothing normalizes the
request before the router sees it), with a listener that must never be contacted."""

from __future__ import annotations

from typing import Any

import orjson

from prefix_router.node.request import forward
from prefix_router.protocol import POLICY_HEADER, WORKER_HEADER

BODY = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]})


def request(method: str, target: str, headers: dict[str, str], body: bytes = BODY) -> bytes:
    lines = [f"{method} {target} HTTP/1.1", "Host: router", *(f"{k}: {v}" for k, v in headers.items())]
    lines += [f"Content-Length: {len(body)}", "Content-Type: application/json", "Connection: close"]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def targets(evil: str) -> list[str]:
    return [
        f"http://{evil}/v1/chat/completions",
        f"https://{evil}/v1/completions",
        f"http://{evil}/v1/embeddings",
        f"http://user@{evil}/v1/models",
        f"//{evil}/v1/chat/completions",
        f"/v1//{evil}/x",
        f"/v1/@{evil}/x",
        f"/v1/http://{evil}/x",
        "/v1/../health",
        "/v1/%2e%2e/%2e%2e/health",
        "/v1/..%2f..%2fhealth",
        "/v1/.%2e/metrics",
        "/v1/x/%2E%2E/%2E%2E/admin",
        "/v1/x%5c..%5c..%5cadmin",
        "/v1/x%0d%0aHost:%20evil",
        "/v1/chat/completions?next=http://evil/",
    ]


def header_sets(evil: str) -> list[dict[str, str]]:
    return [
        {},
        {"X-Forwarded-Host": evil, "X-Forwarded-Proto": "http", "Forwarded": f"host={evil};proto=http"},
        {"X-Original-URL": f"http://{evil}/", "X-Rewrite-URL": f"http://{evil}/", "X-Host": evil},
        {WORKER_HEADER: evil, POLICY_HEADER: "random", "Proxy": f"http://{evil}"},
    ]


async def test_no_request_reaches_anything_but_the_workers_v1(
    echo_engine: Any, start_router: Any, tripwire: Any, kit: Any
) -> None:
    engine = await echo_engine("w")
    router = await start_router(
        engine,
    )
    evil = f"127.0.0.1:{tripwire.port}"
    statuses = set()
    for target in targets(evil):
        for headers in header_sets(evil):
            for method in ("POST", "GET"):
                response = await kit.raw(router.port, request(method, target, headers))
                statuses.add(kit.status_of(response))
                assert b"TRIPPED" not in response
    assert tripwire.connections == 0
    assert statuses and all(200 <= s < 500 for s in statuses), statuses  # refusals, never a router error
    assert engine.seen, "some requests must have been forwarded for this test to mean anything"
    for _, path, headers, _ in engine.seen:
        assert path.startswith("/v1/") and ".." not in path and "%2e" not in path.lower()
        assert headers["Host"] == engine.url.removeprefix("http://")  # the worker's, not the client's


async def test_dot_segments_and_control_characters_are_refused_with_an_openai_error(
    echo_engine: Any, start_router: Any, kit: Any
) -> None:
    engine = await echo_engine("w")
    router = await start_router(engine)
    for target in ("/v1/../health", "/v1/%2e%2e/health", "/v1/x/..%2f..%2fadmin", "/v1/x%00y", "/v1/a%5cb"):
        response = await kit.raw(router.port, request("POST", target, {}))
        assert kit.status_of(response) == 400, target
        error = kit.openai_error(response.split(b"\r\n\r\n", 1)[1])
        assert error["code"] == "invalid_path"
    assert not engine.seen


async def test_an_absolute_form_target_goes_to_the_worker_not_to_its_host(
    echo_engine: Any, start_router: Any, tripwire: Any, kit: Any
) -> None:
    engine = await echo_engine("w")
    router = await start_router(engine)
    target = f"http://127.0.0.1:{tripwire.port}/v1/chat/completions"
    response = await kit.raw(router.port, request("POST", target, {}))
    assert kit.status_of(response) == 200 and f"{WORKER_HEADER}: w".encode() in response.lower()
    assert [path for _, path, _, _ in engine.seen] == ["/v1/chat/completions"]
    assert tripwire.connections == 0


async def test_a_worker_base_path_is_kept(echo_engine: Any, start_router: Any, kit: Any) -> None:
    engine = await echo_engine("w")
    router = await start_router({"url": engine.url + "/base", "name": "w", "models": ["m"]})
    status, _, _ = await kit.post(router.url)
    assert status == 200 and engine.seen[-1][1] == "/base/v1/chat/completions"


def test_the_paths_let_through_as_they_are_pass_the_rules_too() -> None:
    """``safe_path`` looks ``SAFE_AS_IS`` up before its rules: none of them may be one the rules refuse."""
    assert {"/v1/chat/completions", "/v1/completions"} <= forward.SAFE_AS_IS
    for path in forward.SAFE_AS_IS:
        assert forward.safe_by_rules(path), path
    for refused in ("/v1/../admin", "/v1/%2e%2e/x", "/v1\\x", "/tokenize/../x", "/admin"):
        assert not forward.safe_path(refused) and not forward.safe_by_rules(refused)
