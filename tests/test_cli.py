"""The top-level command: every subcommand listed where the CLI says, and lab commands without the lab."""

from __future__ import annotations

import argparse
import importlib
from types import ModuleType
from typing import Any

import pytest

from prefix_router import cli


def _subcommands(parser: argparse.ArgumentParser) -> set[str]:
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return set(action.choices)


def test_every_listed_subcommand_is_registered_and_no_other() -> None:
    listed = {
        name for names in (*cli._PRODUCT_COMMANDS.values(), *cli._LAB_COMMANDS.values()) for name in names
    }
    assert _subcommands(cli.build_parser()) == listed


def _without_lab(monkeypatch: pytest.MonkeyPatch, missing: str) -> None:
    real = importlib.import_module

    def fake(name: str, package: str | None = None) -> ModuleType:
        if name.startswith("prefix_router.lab."):
            raise ModuleNotFoundError(f"No module named '{missing}'", name=missing)
        return real(name, package)

    monkeypatch.setattr(cli.importlib, "import_module", fake)


@pytest.mark.parametrize("missing", ["numpy", "prefix_router.lab"])
def test_a_lab_command_without_the_lab_says_how_to_install_it(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], missing: str
) -> None:
    _without_lab(monkeypatch, missing)
    parser = cli.build_parser()
    assert "serve" in _subcommands(parser) and "demo" in _subcommands(parser)
    with pytest.raises(SystemExit) as stop:
        cli.main(["demo", "--engine", "vllm"])
    assert stop.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "pip install 'prefix-router[lab]'" in lines[0] and missing in lines[0]


def test_a_bug_in_our_own_product_code_is_not_taken_for_a_missing_lab(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real = importlib.import_module

    def fake(name: str, package: str | None = None) -> Any:
        if name.startswith("prefix_router.lab."):
            raise ModuleNotFoundError(
                "No module named 'prefix_router.routing.gone'", name="prefix_router.routing.gone"
            )
        return real(name, package)

    monkeypatch.setattr(cli.importlib, "import_module", fake)
    with pytest.raises(ModuleNotFoundError):
        cli.build_parser()
