"""deploy/kubernetes/epp: the picker's Deployment, Service and RBAC against the official client's models;
the InferencePool (``inference.networking.k8s.io/v1``) and the HTTPRoute (``gateway.networking.k8s.io/v1``)
against models of the fields their CRDs define (unknown fields refused); and consistency: the route's
backend is the pool, the pool's picker is the Service's gRPC port, the picker discovers that pool with
the real CLI, its probes ask the health services it serves, its Role allows the calls it makes."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any, Literal

import pytest
import yaml
from pydantic import BaseModel, ConfigDict, Field

from prefix_router.epp.service import LIVENESS, READINESS
from prefix_router.pool.worker_discovery.inference_pool import pool_target
from support.manifests import MODELS, unknown_fields

DEPLOY = Path(__file__).resolve().parents[2] / "deploy" / "kubernetes" / "epp"


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class Metadata(Strict):
    name: str
    namespace: str | None = None
    labels: dict[str, str] = {}


class PortNumber(Strict):
    number: int = Field(ge=1, le=65535)


class PickerRef(Strict):
    group: str = ""
    kind: Literal["Service"] = "Service"
    name: str
    port: PortNumber
    failureMode: Literal["FailOpen", "FailClose"] = "FailClose"


class Selector(Strict):
    matchLabels: dict[str, str] = Field(min_length=1)


class PoolSpec(Strict):
    selector: Selector
    targetPorts: list[PortNumber] = Field(min_length=1, max_length=8)
    endpointPickerRef: PickerRef


class InferencePool(Strict):
    apiVersion: Literal["inference.networking.k8s.io/v1"]
    kind: Literal["InferencePool"]
    metadata: Metadata
    spec: PoolSpec


class ParentRef(Strict):
    group: str = "gateway.networking.k8s.io"
    kind: str = "Gateway"
    name: str
    namespace: str | None = None
    sectionName: str | None = None


class PathMatch(Strict):
    type: Literal["Exact", "PathPrefix", "RegularExpression"] = "PathPrefix"
    value: str = "/"


class Match(Strict):
    path: PathMatch | None = None


class BackendRef(Strict):
    group: str = ""
    kind: str = "Service"
    name: str
    port: int | None = None
    weight: int = 1


class Timeouts(Strict):
    request: str | None = None
    backendRequest: str | None = None


class Rule(Strict):
    matches: list[Match] = []
    backendRefs: list[BackendRef] = Field(min_length=1)
    timeouts: Timeouts | None = None


class RouteSpec(Strict):
    parentRefs: list[ParentRef] = Field(min_length=1)
    rules: list[Rule] = Field(min_length=1)


class HTTPRoute(Strict):
    apiVersion: Literal["gateway.networking.k8s.io/v1"]
    kind: Literal["HTTPRoute"]
    metadata: Metadata
    spec: RouteSpec


CRDS: dict[str, type[Strict]] = {"InferencePool": InferencePool, "HTTPRoute": HTTPRoute}


@pytest.fixture(scope="module")
def documents() -> list[dict[str, Any]]:
    docs: list[dict[str, Any]] = []
    for path in sorted(DEPLOY.glob("*.yaml")):
        if path.name != "kustomization.yaml":
            docs += [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
    return docs


def find(documents: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    return next(d for d in documents if d["kind"] == kind and (name is None or d["metadata"]["name"] == name))


def test_every_document_is_valid(documents: list[dict[str, Any]]) -> None:
    kinds = sorted(d["kind"] for d in documents)
    assert kinds == [
        "Deployment",
        "HTTPRoute",
        "InferencePool",
        "Role",
        "RoleBinding",
        "Service",
        "ServiceAccount",
    ]
    for doc in documents:
        if doc["kind"] in CRDS:
            CRDS[doc["kind"]].model_validate(doc)
            continue
        model = MODELS[(doc["apiVersion"], doc["kind"])]
        model.from_dict(doc)  # type: ignore[attr-defined]
        assert unknown_fields(doc, model, doc["kind"]) == []


def test_the_crd_models_refuse_mistakes() -> None:
    pool = yaml.safe_load((DEPLOY / "inferencepool.yaml").read_text())
    pool["spec"]["targetPort"] = pool["spec"].pop("targetPorts")
    with pytest.raises(ValueError, match="targetPort"):
        InferencePool.model_validate(pool)


def test_kustomization_lists_every_manifest() -> None:
    kustomization = yaml.safe_load((DEPLOY / "kustomization.yaml").read_text())
    assert set(kustomization["resources"]) == {p.name for p in DEPLOY.glob("*.yaml")} - {"kustomization.yaml"}


def epp_container(documents: list[dict[str, Any]]) -> dict[str, Any]:
    container: dict[str, Any] = find(documents, "Deployment", "prefix-router-epp")["spec"]["template"][
        "spec"
    ]["containers"][0]
    return container


def epp_args(documents: list[dict[str, Any]]) -> argparse.Namespace:
    from prefix_router.epp import cli

    parser = argparse.ArgumentParser()
    cli.register(parser.add_subparsers(dest="command"))
    known, unknown = parser.parse_known_args(epp_container(documents)["args"])
    assert unknown == [] and known.command == "epp"
    return known


def test_route_pool_picker_and_service_agree(documents: list[dict[str, Any]]) -> None:
    pool = find(documents, "InferencePool")
    backend = find(documents, "HTTPRoute")["spec"]["rules"][0]["backendRefs"][0]
    assert (backend["group"], backend["kind"], backend["name"]) == (
        "inference.networking.k8s.io",
        "InferencePool",
        pool["metadata"]["name"],
    )
    ref = pool["spec"]["endpointPickerRef"]
    service = find(documents, "Service", ref["name"])
    grpc = next(p for p in service["spec"]["ports"] if p["port"] == ref["port"]["number"])
    container = epp_container(documents)
    target = next(p for p in container["ports"] if p["name"] == grpc["targetPort"])
    args = epp_args(documents)
    assert args.grpc_port == target["containerPort"] and args.grpc_host == "0.0.0.0"
    assert args.discover_inference_pool == pool["metadata"]["name"]
    assert pool_target(pool).ports == (8000,)  # the discovery reads this pool as shipped


def test_probes_ask_the_health_services_served(documents: list[dict[str, Any]]) -> None:
    container = epp_container(documents)
    args = epp_args(documents)
    assert container["readinessProbe"]["grpc"]["service"] in READINESS
    assert container["livenessProbe"]["grpc"]["service"] in LIVENESS
    assert container["readinessProbe"]["grpc"]["port"] == args.grpc_port
    metrics = next(p for p in container["ports"] if p["name"] == "metrics")
    assert args.port == metrics["containerPort"] and args.host == "0.0.0.0"


def test_the_role_allows_what_the_discovery_calls(documents: list[dict[str, Any]]) -> None:
    spec = find(documents, "Deployment", "prefix-router-epp")["spec"]["template"]["spec"]
    binding = find(documents, "RoleBinding")
    assert {"kind": "ServiceAccount", "name": spec["serviceAccountName"]} in binding["subjects"]
    rules = find(documents, "Role", binding["roleRef"]["name"])["rules"]
    allowed = {
        (g, r, v)
        for rule in rules
        for g in rule["apiGroups"]
        for r in rule["resources"]
        for v in rule["verbs"]
    }
    assert ("inference.networking.k8s.io", "inferencepools", "get") in allowed
    assert {("", "pods", "list"), ("", "pods", "watch")} <= allowed
