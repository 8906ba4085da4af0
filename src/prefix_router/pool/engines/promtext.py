"""A small reader for the Prometheus text exposition format, enough for engine ``/metrics`` pages.

Only the series an adapter asks for are kept, and at most ``max_samples`` of them, so a huge page (vLLM
emits thousands of histogram buckets) costs one pass over its lines and bounded memory.
"""

from __future__ import annotations

import math
import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

DEFAULT_MAX_SAMPLES = 10_000

_LABEL = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"')
_NAME_END = re.compile(r"[{\s]")


@dataclass(frozen=True, slots=True)
class Sample:
    """One series value: metric name, its labels and the value."""

    name: str
    labels: Mapping[str, str]
    value: float


def parse(text: str, names: Collection[str], max_samples: int = DEFAULT_MAX_SAMPLES) -> list[Sample]:
    """The samples of the named metrics in ``text``, in page order, at most ``max_samples`` of them."""
    out: list[Sample] = []
    for line in text.splitlines():
        if len(out) >= max_samples:
            break
        sample = _parse_line(line, names)
        if sample is not None:
            out.append(sample)
    return out


def _parse_line(line: str, names: Collection[str]) -> Sample | None:
    line = line.strip()
    if not line or line.startswith("#"):
        return None
    end = _NAME_END.search(line)
    name = line if end is None else line[: end.start()]
    if name not in names:
        return None
    return _sample(name, line[len(name) :])


def _sample(name: str, rest: str) -> Sample | None:
    labels: dict[str, str] = {}
    if rest.startswith("{"):
        close = _closing_brace(rest)
        if close < 0:
            return None
        labels = {k: _unescape(v) for k, v in _LABEL.findall(rest[1:close])}
        rest = rest[close + 1 :]
    value = _number(rest.split()[0]) if rest.split() else None
    return None if value is None else Sample(name, labels, value)


def _closing_brace(rest: str) -> int:
    in_quotes = False
    escaped = False
    for i, ch in enumerate(rest):
        if escaped:
            escaped = False
        elif ch == "\\":
            escaped = True
        elif ch == '"':
            in_quotes = not in_quotes
        elif ch == "}" and not in_quotes:
            return i
    return -1


def _unescape(value: str) -> str:
    return value.replace('\\"', '"').replace("\\n", "\n").replace("\\\\", "\\")


def _number(token: str) -> float | None:
    try:
        value = float(token)
    except ValueError:
        return None
    return None if math.isnan(value) else value


def total(samples: Sequence[Sample], *names: str) -> float | None:
    """Sum over label sets of the first of ``names`` present (one series per engine or rank)."""
    for name in names:
        values = [s.value for s in samples if s.name == name]
        if values:
            return sum(values)
    return None


def grouped_total(samples: Sequence[Sample], group_label: str, *names: str) -> float | None:
    """Sum over ``group_label`` values of the largest value within each group, for the first name present.

    For gauges that every tensor-parallel rank repeats (same value per ``tp_rank``) while each data-parallel
    rank or engine core reports its own share: max within a group undoes the repetition, the sum adds the
    shares. Series without the label form one group.
    """
    for name in names:
        groups: dict[str, float] = {}
        for s in samples:
            if s.name == name:
                key = s.labels.get(group_label, "")
                groups[key] = max(groups.get(key, s.value), s.value)
        if groups:
            return sum(groups.values())
    return None


def peak(samples: Sequence[Sample], *names: str) -> float | None:
    """Largest value over label sets of the first of ``names`` present."""
    for name in names:
        values = [s.value for s in samples if s.name == name]
        if values:
            return max(values)
    return None


def label_sets(samples: Sequence[Sample], name: str) -> list[Mapping[str, str]]:
    """The label sets of every series of ``name`` (an ``*_info`` metric carries its facts in labels)."""
    return [s.labels for s in samples if s.name == name]


def counter_names(base: str) -> tuple[str, str]:
    """A counter as prometheus_client exposes it (``base_total``) and as some engines print it (``base``)."""
    return (f"{base}_total", base)


def as_int(value: float | None) -> int | None:
    """A gauge value as a count (None stays None; negatives, which mean 'unknown', become None)."""
    if value is None or value < 0 or math.isinf(value):
        return None
    return round(value)


def label_int(labels: Mapping[str, str], key: str) -> int | None:
    """An integer label value, None when absent or not a number (vLLM prints ``"None"``)."""
    try:
        return int(float(labels[key]))
    except (KeyError, ValueError, OverflowError):
        return None
