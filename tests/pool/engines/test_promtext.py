from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from prefix_router.pool.engines import promtext

PAGE = """# HELP a:x help text
# TYPE a:x gauge
a:x{engine="0",model_name="m"} 2.0
a:x{engine="1",model_name="m"} 3.5 1700000000000
a:y{label="with \\"quotes\\", commas, and } braces"} 7
a:z NaN
a:w not-a-number
a:x_bucket{le="1"} 99
"""


def test_parse_keeps_only_named_series_with_labels_and_values() -> None:
    samples = promtext.parse(PAGE, {"a:x", "a:y"})
    assert [(s.name, s.value) for s in samples] == [("a:x", 2.0), ("a:x", 3.5), ("a:y", 7.0)]
    assert samples[0].labels == {"engine": "0", "model_name": "m"}
    assert samples[2].labels == {"label": 'with "quotes", commas, and } braces'}


def test_nan_and_garbage_values_are_dropped() -> None:
    assert promtext.parse(PAGE, {"a:z", "a:w"}) == []


def test_parse_never_keeps_more_than_max_samples() -> None:
    page = "".join(f'm{{i="{i}"}} {i}\n' for i in range(1000))
    assert len(promtext.parse(page, {"m"}, max_samples=10)) == 10
    assert len(promtext.parse(page, {"m"})) == 1000


def test_total_sums_label_sets_and_falls_back_to_later_names() -> None:
    samples = promtext.parse(PAGE, {"a:x", "a:y"})
    assert promtext.total(samples, "a:x") == 5.5
    assert promtext.total(samples, "missing", "a:y") == 7.0
    assert promtext.total(samples, "missing") is None


def test_grouped_total_maxes_repeats_within_a_group_and_sums_groups() -> None:
    page = 'g{dp_rank="0",tp_rank="0"} 4\ng{dp_rank="0",tp_rank="1"} 4\ng{dp_rank="1",tp_rank="0"} 6\n'
    samples = promtext.parse(page, {"g"})
    assert promtext.grouped_total(samples, "dp_rank", "g") == 10.0
    assert promtext.total(samples, "g") == 14.0


def test_label_int_reads_numbers_and_rejects_none() -> None:
    assert promtext.label_int({"a": "16"}, "a") == 16
    assert promtext.label_int({"a": "None"}, "a") is None
    assert promtext.label_int({}, "a") is None


def test_as_int_treats_negative_as_unknown() -> None:
    assert promtext.as_int(-1.0) is None
    assert promtext.as_int(2.6) == 3


@given(st.text(max_size=300))
def test_parse_never_raises_on_arbitrary_text(text: str) -> None:
    for sample in promtext.parse(text, {"a", "vllm:x"}):
        assert sample.name in {"a", "vllm:x"}
