"""deploy/kubernetes's Redis is closed: a password from a Secret the manifests do not ship, the same
Secret given to the router as ``replication.password``, and a NetworkPolicy that admits only the router's
(and the endpoint picker's) pods on Redis's port."""

from __future__ import annotations

from typing import Any

from prefix_router.node.config import load_config

SECRET = {"name": "prefix-router-redis", "key": "password"}


def find(documents: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    return next(d for d in documents if d["kind"] == kind and d["metadata"]["name"] == name)


def container(documents: list[dict[str, Any]], name: str) -> dict[str, Any]:
    spec: dict[str, Any] = find(documents, "Deployment", name)["spec"]["template"]["spec"]
    return spec["containers"][0]  # type: ignore[no-any-return]


def secret_env(box: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {e["name"]: e["valueFrom"]["secretKeyRef"] for e in box.get("env", []) if "valueFrom" in e}


def test_redis_requires_the_password_of_the_secret(documents: list[dict[str, Any]]) -> None:
    redis = container(documents, "prefix-router-redis")
    env = secret_env(redis)
    args = redis["args"]
    assert args[args.index("--requirepass") + 1] == "$(REDIS_PASSWORD)"
    assert env["REDIS_PASSWORD"] == SECRET and env["REDISCLI_AUTH"] == SECRET  # the probe's redis-cli
    assert redis["readinessProbe"]["exec"]["command"] == ["redis-cli", "ping"]
    assert not [d for d in documents if d["kind"] == "Secret"]  # no password is shipped


def test_the_router_authenticates_with_the_same_secret(documents: list[dict[str, Any]]) -> None:
    env = secret_env(container(documents, "prefix-router"))
    names = [name for name, ref in env.items() if ref == SECRET]
    assert names == ["PREFIX_ROUTER_REPLICATION__PASSWORD"]
    config = load_config(env={names[0]: "from-the-secret"})
    assert config.replication.password is not None
    assert config.replication.password.get_secret_value() == "from-the-secret"


def test_only_the_routers_pods_reach_redis(documents: list[dict[str, Any]]) -> None:
    policy = find(documents, "NetworkPolicy", "prefix-router-redis")["spec"]
    redis = find(documents, "Deployment", "prefix-router-redis")
    assert policy["podSelector"]["matchLabels"] == redis["spec"]["template"]["metadata"]["labels"]
    assert policy["policyTypes"] == ["Ingress"] and len(policy["ingress"]) == 1
    rule = policy["ingress"][0]
    assert rule["ports"] == [{"port": "redis", "protocol": "TCP"}]
    port_names = [p["name"] for p in redis["spec"]["template"]["spec"]["containers"][0]["ports"]]
    assert "redis" in port_names
    (source,) = rule["from"]
    allowed = {e["key"]: set(e["values"]) for e in source["podSelector"]["matchExpressions"]}
    router = find(documents, "Deployment", "prefix-router")["spec"]["template"]["metadata"]["labels"]
    assert all(router[key] in values for key, values in allowed.items())
    assert allowed["app.kubernetes.io/component"] == {"router", "epp"}
