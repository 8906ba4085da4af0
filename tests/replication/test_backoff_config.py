from __future__ import annotations

import random
from pathlib import Path

import pytest

from prefix_router.replication.backoff import Backoff
from prefix_router.replication.settings import ReplicationSettings


def test_backoff_grows_exponentially_up_to_the_cap_and_resets() -> None:
    backoff = Backoff(0.1, 1.0, random.Random(1))
    delays = [backoff.next() for _ in range(8)]
    ceilings = [min(1.0, 0.1 * 2**i) for i in range(8)]
    assert all(c / 2 <= d <= c for d, c in zip(delays, ceilings, strict=True))
    backoff.reset()
    assert backoff.next() <= 0.1


def test_backoff_rejects_bad_bounds() -> None:
    with pytest.raises(ValueError):
        Backoff(0.0, 1.0)
    with pytest.raises(ValueError):
        Backoff(2.0, 1.0)


@pytest.mark.parametrize(
    "knob", ["stream_maxlen", "outbox_capacity", "batch_max", "read_count", "load_ttl_s"]
)
def test_config_rejects_non_positive_bounds(knob: str) -> None:
    with pytest.raises(ValueError, match=knob):
        ReplicationSettings(**{knob: 0})  # type: ignore[arg-type]


def test_config_keys_share_the_prefix() -> None:
    cfg = ReplicationSettings(key_prefix="pr")
    assert cfg.stream_key == "pr:changes" and cfg.load_key("a/1") == "pr:load:a/1"


@pytest.mark.parametrize("knob", list(ReplicationSettings.model_fields))
def test_every_replication_knob_is_documented_with_its_default(knob: str) -> None:
    docs = Path(__file__).resolve().parents[2] / "docs" / "scale-out.md"
    start = f"| `replication.{knob}` | "
    row = next((line for line in docs.read_text().splitlines() if line.startswith(start)), None)
    assert row is not None, f"docs/scale-out.md: no row for replication.{knob}"
    cell = row[len(start) :].split("|")[0].strip().replace(",", "")
    default = ReplicationSettings.model_fields[knob].default
    if isinstance(default, int | float):
        assert float(cell) == default
    else:
        assert cell in (str(default).lower(), "HOSTNAME")


def test_backoff_bounds_are_ordered() -> None:
    with pytest.raises(ValueError, match="backoff_initial_s"):
        ReplicationSettings(backoff_initial_s=2.0, backoff_max_s=1.0)
