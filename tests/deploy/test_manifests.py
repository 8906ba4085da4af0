"""deploy/kubernetes: schema (the official client's OpenAPI models, unknown fields refused) and
consistency (selectors, ports, probes, config, Redis URL, RBAC).

kubeconform is not used: it is a Go binary that fetches its JSON schemas from GitHub at run time."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml
from kubernetes.client import models

from prefix_router.node.config import validate
from support.manifests import MODELS, unknown_fields

DEPLOY = Path(__file__).resolve().parents[2] / "deploy" / "kubernetes"


def test_every_document_is_a_valid_object_of_a_known_kind(documents: list[dict[str, Any]]) -> None:
    assert len(documents) >= 9
    for doc in documents:
        model = MODELS[(doc["apiVersion"], doc["kind"])]
        assert doc["metadata"]["name"]
        model.from_dict(doc)  # type: ignore[attr-defined]  # types and required fields
        assert unknown_fields(doc, model, doc["kind"]) == []


def test_the_schema_check_catches_mistakes() -> None:
    bad = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "x"}, "spec": {"prots": []}}
    assert unknown_fields(bad, models.V1Service, "Service") == ["Service.spec.prots"]
    deployment = {"spec": {"template": {"spec": {"containers": [{"name": "a", "readinesProbe": {}}]}}}}
    assert unknown_fields(deployment, models.V1Deployment, "D") == [
        "D.spec.template.spec.containers.readinesProbe"
    ]


def test_kustomization_lists_every_manifest() -> None:
    kustomization = yaml.safe_load((DEPLOY / "kustomization.yaml").read_text())
    on_disk = {p.name for p in DEPLOY.glob("*.yaml")} - {"kustomization.yaml"}
    assert set(kustomization["resources"]) == on_disk


# ------------------------------------------------------------------ consistency


def find(documents: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    return next(d for d in documents if d["kind"] == kind and d["metadata"]["name"] == name)


def pod(deployment: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = deployment["spec"]["template"]["spec"]
    return spec


def container_ports(deployment: dict[str, Any]) -> dict[str, int]:
    return {p["name"]: p["containerPort"] for c in pod(deployment)["containers"] for p in c.get("ports", [])}


def test_deployments_select_their_own_pods(documents: list[dict[str, Any]]) -> None:
    for doc in (d for d in documents if d["kind"] == "Deployment"):
        selector = doc["spec"]["selector"]["matchLabels"]
        labels = doc["spec"]["template"]["metadata"]["labels"]
        assert selector.items() <= labels.items()


def test_services_reach_a_named_container_port(documents: list[dict[str, Any]]) -> None:
    deployments = [d for d in documents if d["kind"] == "Deployment"]
    for service in (d for d in documents if d["kind"] == "Service"):
        selector = service["spec"]["selector"]
        targets = [
            d for d in deployments if selector.items() <= d["spec"]["template"]["metadata"]["labels"].items()
        ]
        assert len(targets) == 1, service["metadata"]["name"]
        for port in service["spec"]["ports"]:
            assert port["targetPort"] in container_ports(targets[0])


def test_router_replicas_probes_and_scrape_annotations(documents: list[dict[str, Any]]) -> None:
    router = find(documents, "Deployment", "prefix-router")
    assert router["spec"]["replicas"] >= 2
    container = pod(router)["containers"][0]
    ports = container_ports(router)
    assert container["readinessProbe"]["httpGet"]["path"] == "/ready"
    assert container["livenessProbe"]["httpGet"]["path"] == "/health"
    for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
        assert container[probe]["httpGet"]["port"] in ports
    notes = router["spec"]["template"]["metadata"]["annotations"]
    assert notes["prometheus.io/scrape"] == "true" and notes["prometheus.io/path"] == "/metrics"
    assert int(notes["prometheus.io/port"]) in ports.values()


def config_of(documents: list[dict[str, Any]]) -> Any:
    return validate(
        yaml.safe_load(find(documents, "ConfigMap", "prefix-router-config")["data"]["config.yaml"])
    )


def test_the_config_file_is_valid_and_matches_the_pod(documents: list[dict[str, Any]]) -> None:
    config = config_of(documents)
    router = find(documents, "Deployment", "prefix-router")
    assert config.host == "0.0.0.0" and config.port == container_ports(router)["http"]
    assert config.workers or config.discovery.kind is not None
    args = pod(router)["containers"][0]["args"]
    config_path = args[args.index("--config") + 1]
    mount = next(m for m in pod(router)["containers"][0]["volumeMounts"] if m["name"] == "config")
    assert config_path == f"{mount['mountPath']}/config.yaml"
    volume = next(v for v in pod(router)["volumes"] if v["name"] == "config")
    assert volume["configMap"]["name"] == "prefix-router-config"


def test_kubernetes_discovery_runs_under_the_service_account(documents: list[dict[str, Any]]) -> None:
    discovery = config_of(documents).discovery
    assert discovery.kind == "kubernetes" and discovery.service and discovery.namespace is None
    spec = pod(find(documents, "Deployment", "prefix-router"))
    assert spec["serviceAccountName"] and spec.get("automountServiceAccountToken", True)
    # the namespace comes from the service account; the Role lives in that same namespace
    assert "namespace" not in find(documents, "Role", "prefix-router-discovery")["metadata"]


def test_the_replication_url_points_at_the_redis_service(documents: list[dict[str, Any]]) -> None:
    args = pod(find(documents, "Deployment", "prefix-router"))["containers"][0]["args"]
    url = args[args.index("--replication") + 1]
    redis = find(documents, "Service", "prefix-router-redis")
    assert url == f"redis://{redis['metadata']['name']}:{redis['spec']['ports'][0]['port']}/0"


def test_the_router_args_parse_with_the_real_cli(documents: list[dict[str, Any]]) -> None:
    from prefix_router.proxy.run import cli

    parser = argparse.ArgumentParser()
    cli.register(parser.add_subparsers(dest="command"))
    args = pod(find(documents, "Deployment", "prefix-router"))["containers"][0]["args"]
    known, unknown = parser.parse_known_args(args)
    assert unknown == [] and known.command == "serve"
    assert known.replication is not None and known.replication.startswith("redis://")


def test_the_service_account_may_watch_endpointslices(documents: list[dict[str, Any]]) -> None:
    router = find(documents, "Deployment", "prefix-router")
    account = pod(router)["serviceAccountName"]
    find(documents, "ServiceAccount", account)
    binding = find(documents, "RoleBinding", "prefix-router-discovery")
    assert {"kind": "ServiceAccount", "name": account} in binding["subjects"]
    role = find(documents, "Role", binding["roleRef"]["name"])
    rule = next(r for r in role["rules"] if "endpointslices" in r["resources"])
    assert rule["apiGroups"] == ["discovery.k8s.io"] and {"list", "watch"} <= set(rule["verbs"])


# ------------------------------------------------------------------ shutdown and service links


def test_service_links_are_off(documents: list[dict[str, Any]]) -> None:
    for deployment in (d for d in documents if d["kind"] == "Deployment"):
        assert pod(deployment)["enableServiceLinks"] is False, deployment["metadata"]["name"]


def test_the_grace_period_covers_pre_stop_and_drain(documents: list[dict[str, Any]]) -> None:
    from prefix_router.node.control.lifecycle import AFTER_DEADLINE_S
    from prefix_router.node.life.server import AFTER_SHUTDOWN_S

    spec = pod(find(documents, "Deployment", "prefix-router"))
    pre_stop = spec["containers"][0]["lifecycle"]["preStop"]["exec"]["command"]
    assert pre_stop[0] == "sleep"
    drain_s = config_of(documents).timeouts.shutdown_s + AFTER_DEADLINE_S + AFTER_SHUTDOWN_S
    assert spec["terminationGracePeriodSeconds"] >= float(pre_stop[1]) + drain_s + 5  # and a margin


def service_link_env(documents: list[dict[str, Any]]) -> dict[str, str]:
    """The variables Kubernetes gives a pod for every Service of its namespace when service links are on
    (the docker-links format of kubelet's envvars: ``<SVC>_SERVICE_HOST``, ``<SVC>_PORT=tcp://...``...)."""
    env: dict[str, str] = {}
    for n, service in enumerate(d for d in documents if d["kind"] == "Service"):
        name, ip = service["metadata"]["name"].upper().replace("-", "_"), f"10.96.0.{12 + n}"
        ports = service["spec"]["ports"]
        env |= {f"{name}_SERVICE_HOST": ip, f"{name}_SERVICE_PORT": str(ports[0]["port"])}
        env[f"{name}_PORT"] = f"{ports[0]['protocol'].lower()}://{ip}:{ports[0]['port']}"
        for port in ports:
            number, proto = port["port"], port["protocol"]
            if port.get("name"):
                env[f"{name}_SERVICE_PORT_{port['name'].upper().replace('-', '_')}"] = str(number)
            link = f"{name}_PORT_{number}_{proto}"
            env |= {link: f"{proto.lower()}://{ip}:{number}", f"{link}_PROTO": proto.lower()}
            env |= {f"{link}_PORT": str(number), f"{link}_ADDR": ip}
    return env


def test_service_link_variables_are_not_read_as_config(
    documents: list[dict[str, Any]], tmp_path: Path
) -> None:
    """The shipped config with the variables Kubernetes injects for the shipped Services (had service links
    stayed on): ``serve --print-config`` starts, keeps the port, and touches no cluster (kubernetes'
    client is made unimportable: --print-config must not need it)."""
    links = service_link_env(documents)
    assert links["PREFIX_ROUTER_PORT"].startswith("tcp://10.96.0.") and links["PREFIX_ROUTER_PORT"].endswith(
        ":80"
    )
    assert "PREFIX_ROUTER_REDIS_PORT_6379_TCP_ADDR" in links and "PREFIX_ROUTER_SERVICE_HOST" in links
    config = tmp_path / "config.yaml"
    config.write_text(find(documents, "ConfigMap", "prefix-router-config")["data"]["config.yaml"])
    (tmp_path / "shim").mkdir()
    (tmp_path / "shim" / "kubernetes.py").write_text("raise RuntimeError('the cluster was touched')\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFIX_ROUTER_", "KUBE"))}
    env |= links | {"PYTHONPATH": os.pathsep.join([str(tmp_path / "shim"), os.environ.get("PYTHONPATH", "")])}
    argv = [sys.executable, "-m", "prefix_router.proxy", "serve", "--config", str(config), "--print-config"]
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=60)
    assert proc.returncode == 0, proc.stderr
    printed = yaml.safe_load(proc.stdout)
    assert printed["port"] == 8000 and printed["discovery"]["kind"] == "kubernetes"
    bogus = subprocess.run(
        argv, capture_output=True, text=True, env=env | {"PREFIX_ROUTER_BOGUS": "1"}, timeout=60
    )
    assert bogus.returncode == 2 and bogus.stderr.strip().count("\n") == 0
    assert "bogus" in bogus.stderr and "Traceback" not in bogus.stderr


def test_the_network_policy_keeps_the_event_ports_to_the_engines(documents: list[dict[str, Any]]) -> None:
    policy = find(documents, "NetworkPolicy", "prefix-router")
    router = find(documents, "Deployment", "prefix-router")
    assert policy["spec"]["podSelector"]["matchLabels"] == router["spec"]["selector"]["matchLabels"]
    open_rule, events_rule = policy["spec"]["ingress"]
    assert "from" not in open_rule and [p["port"] for p in open_rule["ports"]] == ["http"]
    assert events_rule["from"] == [
        {"podSelector": {"matchLabels": {"prefix-router.io/kv-events-publisher": "true"}}}
    ]
    assert events_rule["ports"][0]["port"] == 5557
