"""Kubernetes manifests checked against the official client's OpenAPI models: unknown fields refused."""

from __future__ import annotations

import types
import typing
from typing import Any

from kubernetes.client import models
from pydantic import AliasChoices, BaseModel

MODELS: dict[tuple[str, str], type[BaseModel]] = {
    ("v1", "ConfigMap"): models.V1ConfigMap,
    ("v1", "Service"): models.V1Service,
    ("v1", "ServiceAccount"): models.V1ServiceAccount,
    ("apps/v1", "Deployment"): models.V1Deployment,
    ("policy/v1", "PodDisruptionBudget"): models.V1PodDisruptionBudget,
    ("networking.k8s.io/v1", "NetworkPolicy"): models.V1NetworkPolicy,
    ("rbac.authorization.k8s.io/v1", "Role"): models.V1Role,
    ("rbac.authorization.k8s.io/v1", "RoleBinding"): models.V1RoleBinding,
}


def json_fields(model: type[BaseModel]) -> dict[str, Any]:
    out = {}
    for name, field in model.model_fields.items():
        alias = field.validation_alias
        key = str(alias.choices[0]) if isinstance(alias, AliasChoices) else (field.alias or name)
        out[key] = field.annotation
    return out


def nested_model(annotation: Any) -> tuple[type[BaseModel] | None, str]:
    """(model, "one" | "list" | "dict") inside Optional/List/Dict/Annotated wrappers."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation, "one"
    if origin in (typing.Union, types.UnionType, typing.Annotated):
        return nested_model(args[0])
    if origin is list:
        model, _ = nested_model(args[0])
        return model, "list"
    if origin is dict:
        model, _ = nested_model(args[1])
        return model, "dict"
    return None, "one"


def unknown_fields(value: Any, model: type[BaseModel], path: str) -> list[str]:
    if not isinstance(value, dict):
        return []
    fields, problems = json_fields(model), []
    for key, item in value.items():
        if key not in fields:
            problems.append(f"{path}.{key}")
            continue
        inner, shape = nested_model(fields[key])
        if inner is None:
            continue
        items = item if shape == "list" and isinstance(item, list) else [item]
        items = list(item.values()) if shape == "dict" and isinstance(item, dict) else items
        for child in items:
            problems += unknown_fields(child, inner, f"{path}.{key}")
    return problems
