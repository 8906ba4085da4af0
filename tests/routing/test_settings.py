"""Routing settings: one frozen, typed group per concern, constraints on the fields, every knob documented."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import annotated_types
import pydantic
import pytest

from prefix_router.routing.policies import POLICIES
from prefix_router.routing.settings import KeySettings, RoutingSettings
from prefix_router.settings import Section

DOCS = Path(__file__).resolve().parents[2] / "docs" / "routing.md"


def leaves(model: type[Section], prefix: str) -> Iterator[tuple[str, type[Section], str, Any]]:
    """(dotted key, owning group, field name, default) for every knob under ``model``."""
    for name, field in model.model_fields.items():
        if field.exclude:  # set by the composition root, not a configuration key
            continue
        kind = field.annotation
        if isinstance(kind, type) and issubclass(kind, Section):
            yield from leaves(kind, f"{prefix}.{name}")
        else:
            yield f"{prefix}.{name}", model, name, field.get_default(call_default_factory=True)


KNOBS = list(leaves(RoutingSettings, "routing"))


def test_the_groups_cover_every_policy_and_the_core() -> None:
    keys = {key for key, *_ in KNOBS}
    assert {"routing.policy", "routing.keys.block_tokens", "routing.index.max_total_blocks"} <= keys
    assert {
        "routing.sessions.affinity",
        "routing.units.learn",
        "routing.trackers.max_tracked_requests",
    } <= keys
    for spec in POLICIES:
        assert set(spec.knobs.model_fields) == {
            k.rsplit(".", 1)[1] for k in keys if k.startswith(f"routing.policies.{spec.name}.")
        }


@pytest.mark.parametrize(("key", "group", "name", "default"), KNOBS, ids=[k for k, *_ in KNOBS])
def test_every_knob_is_documented_with_its_default(
    key: str, group: type[Section], name: str, default: Any
) -> None:
    start = f"| `{key}` | "
    row = next((line for line in DOCS.read_text().splitlines() if line.startswith(start)), None)
    assert row is not None, f"docs/routing.md: no row for {key}"
    cell = row[len(start) :].split("|")[0].strip().replace(",", "")
    if isinstance(default, dict):  # a mapping knob (templates): empty by default
        assert cell == "`{}`" and not default
    elif isinstance(default, list):  # a list knob (tools_before_system): its items as JSON strings
        assert cell == "`[" + " ".join(f'"{item}"' for item in default) + "]`"
    elif default is None or isinstance(default, bool | str):
        assert cell == str(default).lower() if not isinstance(default, str) else cell == default
    else:
        assert float(cell) == default


@pytest.mark.parametrize(("key", "group", "name", "default"), KNOBS, ids=[k for k, *_ in KNOBS])
def test_every_bound_is_enforced(key: str, group: type[Section], name: str, default: Any) -> None:
    for bound in group.model_fields[name].metadata:
        bad = {
            annotated_types.Gt: lambda b: b.gt,
            annotated_types.Ge: lambda b: b.ge - 1,
            annotated_types.Le: lambda b: b.le + 1,
        }.get(type(bound))
        if bad is not None:
            with pytest.raises(pydantic.ValidationError, match=name):
                group.model_validate({name: bad(bound)})
    group.model_validate({name: default})


def test_settings_are_frozen_and_refuse_unknown_knobs() -> None:
    cfg = RoutingSettings()
    with pytest.raises(pydantic.ValidationError):
        cfg.keys.block_tokens = 1  # type: ignore[misc]
    with pytest.raises(pydantic.ValidationError, match="bogus"):
        KeySettings.model_validate({"bogus": 1})
    with pytest.raises(pydantic.ValidationError, match="unknown policy"):
        RoutingSettings(policy="nope")


@pytest.mark.parametrize(
    ("given", "chars", "tokens"),
    [
        ({}, 64, 16),
        ({"block_tokens": 64}, 256, 64),  # the characters of a block follow its tokens
        ({"block_tokens": 512}, 2048, 512),
        ({"chars_per_token": 3.5}, 56, 16),
        ({"block_tokens": 18, "chars_per_token": 3.5}, 63, 18),
        ({"block_tokens": 32}, 128, 32),
    ],
)
def test_every_block_is_worth_block_tokens_tokens(given: dict[str, Any], chars: int, tokens: int) -> None:
    keys = KeySettings.model_validate(given)
    assert (keys.block_chars, keys.block_tokens) == (chars, tokens)
    assert keys.block_chars == round(keys.block_tokens * keys.chars_per_token)


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ({"block_chars": 256, "block_tokens": 16}, "block_chars"),  # derived: not a knob
        ({"block_tokens": 1, "chars_per_token": 0.25}, "under one byte"),
    ],
)
def test_inconsistent_block_units_are_refused_at_load(given: dict[str, Any], message: str) -> None:
    with pytest.raises(pydantic.ValidationError, match=message):
        RoutingSettings.model_validate({"keys": given})
