"""The Kubernetes manifests of deploy/kubernetes, parsed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

DEPLOY = Path(__file__).resolve().parents[2] / "deploy" / "kubernetes"


def load_documents() -> list[dict[str, Any]]:
    docs: list[dict[str, Any]] = []
    for path in sorted(DEPLOY.glob("*.yaml")):
        if path.name != "kustomization.yaml":
            docs += [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
    return docs


@pytest.fixture(scope="session")
def documents() -> list[dict[str, Any]]:
    return load_documents()
