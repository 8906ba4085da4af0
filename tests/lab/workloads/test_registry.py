from __future__ import annotations

import itertools
import json
import random
import statistics
from pathlib import Path

import pydantic
import pytest

from prefix_router.lab.workloads.arrivals import Arrivals, poisson_times
from prefix_router.lab.workloads.chatbots import ChatbotSettings
from prefix_router.lab.workloads.multiturn import MultiTurnSettings
from prefix_router.lab.workloads.registry import WORKLOADS, WorkloadSpec, get_workload, workload_names
from prefix_router.lab.workloads.settings import WorkloadOptionError, WorkloadSettings, make_settings
from prefix_router.lab.workloads.traces import TRACES_ENV, find_trace
from prefix_router.lab.workloads.types import Workload

DOCS = Path(__file__).resolve().parents[3] / "docs" / "running-benchmarks.md"
SYNTHETIC = ["chatbots", "agents", "rag", "unique", "sglang-gsp", "vllm-prefix-repetition", "bursty"]
SMALL = {
    "chatbots": {"system_tokens": 32},
    "agents": {"system_tokens": 32},
    "rag": {"document_tokens": 64},
    "unique": {"prompt_tokens": 16},
    "sglang-gsp": {"system_tokens": 32, "question_tokens": 8},
    "vllm-prefix-repetition": {},
    "bursty": {"system_tokens": 32, "system_tokens_max": 64, "question_tokens_max": 16},
}


def test_names_cover_the_issue() -> None:
    expected = {"chatbots", "multi-turn", "agents", "rag", "unique", "mooncake", "sglang-gsp"}
    assert expected | {"vllm-prefix-repetition", "mixed", "trace", "bursty"} == set(workload_names())


@pytest.mark.parametrize("name", SYNTHETIC)
def test_synthetic_workloads_are_deterministic(name: str) -> None:
    a = get_workload(name, requests=50, seed=7, model="m", **SMALL[name])
    b = get_workload(name, requests=50, seed=7, model="m", **SMALL[name])
    c = get_workload(name, requests=50, seed=8, model="m", **SMALL[name])
    assert a == b and a != c
    assert isinstance(a, Workload) and a.request_count == 50


def test_trace_workloads_are_deterministic(sharegpt_file: Path, mooncake_file: Path) -> None:
    for name, opts in (
        ("multi-turn", {"trace": str(sharegpt_file)}),
        ("mooncake", {"trace": str(mooncake_file)}),
    ):
        a = get_workload(name, requests=8, seed=1, model="m", **opts)
        assert a == get_workload(name, requests=8, seed=1, model="m", **opts)
    mixed = get_workload("mixed", requests=20, seed=1, model="m", trace=str(sharegpt_file), system_tokens=16)
    assert mixed.request_count == 20
    assert {s.session_id.split("-")[0] for s in mixed.sessions} == {"chatbot", "sharegpt"}


def test_real_sharegpt_trace() -> None:
    find_trace("sharegpt_multiturn_subset.jsonl")  # the shared traces beside the checkout: required
    w = get_workload("multi-turn", requests=40, seed=0, model="m")
    assert w.request_count == 40 and any(len(s.turns) > 1 for s in w.sessions)


def test_trace_env_variable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sharegpt_file: Path) -> None:
    (tmp_path / "sharegpt_multiturn_subset.jsonl").write_bytes(sharegpt_file.read_bytes())
    monkeypatch.setenv(TRACES_ENV, str(tmp_path))
    assert find_trace("sharegpt_multiturn_subset.jsonl") == tmp_path / "sharegpt_multiturn_subset.jsonl"


def test_options_from_strings_and_errors() -> None:
    w = get_workload(
        "chatbots", requests=10, seed=0, model="m", tenants="2", zipf_s="0.5", system_tokens_max="none"
    )
    assert {s.tenant for s in w.sessions} <= {"tenant-0", "tenant-1"}
    assert make_settings(MultiTurnSettings, {"shuffle": "true"}).shuffle is True
    assert make_settings(ChatbotSettings, {"system_tokens_max": "3"}).system_tokens_max == 3
    assert make_settings(ChatbotSettings, {"system_tokens_max": "null"}).system_tokens_max is None
    with pytest.raises(ValueError, match="unknown option"):
        get_workload("chatbots", requests=10, seed=0, model="m", tenant=3)
    with pytest.raises(KeyError, match="unknown workload"):
        get_workload("nope", requests=10, seed=0, model="m")


def test_make_settings_keeps_defaults() -> None:
    assert make_settings(ChatbotSettings, {}) == ChatbotSettings()


@pytest.mark.parametrize(
    "options,named",
    [
        ({"shuffle": "ture"}, "option shuffle: Input should be a valid boolean"),  # was silently False
        ({"max_turns": "eight"}, "option max_turns: Input should be a valid integer"),
        ({"max_turns": "2.5"}, "option max_turns"),
        ({"think_time_s": "soon"}, "option think_time_s: Input should be a valid number"),
        ({"shufle": "true"}, "unknown option(s) shufle; valid: trace, max_turns"),
    ],
)
def test_a_bad_option_is_one_line_naming_it(options: dict[str, str], named: str) -> None:
    with pytest.raises(WorkloadOptionError) as err:
        get_workload("multi-turn", requests=4, seed=0, model="m", **options)
    message = str(err.value)
    assert "\n" not in message and message.startswith("workload multi-turn: ") and named in message


def test_options_are_frozen_and_forbid_extra_fields() -> None:
    built = ChatbotSettings(tenants=3)
    with pytest.raises(pydantic.ValidationError):
        built.tenants = 4  # type: ignore[misc]
    with pytest.raises(pydantic.ValidationError):
        ChatbotSettings(tenant=3)  # type: ignore[call-arg]


def test_arrivals_poisson_closed_and_trace(mooncake_file: Path) -> None:
    times = poisson_times(20000, 50.0, random.Random(0))
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert times[0] == 0.0 and statistics.mean(gaps) == pytest.approx(1 / 50, rel=0.05)
    closed = get_workload(
        "unique", requests=10, seed=0, model="m", arrivals=Arrivals("closed", concurrency=3)
    )
    assert closed.concurrency == 3 and all(s.arrival_s == 0 for s in closed.sessions)
    assert [s.session_id for s in closed.sessions] == [f"unique-{i}" for i in range(10)]
    base = get_workload("mooncake", requests=4, seed=0, model="m", trace=str(mooncake_file))
    fast = get_workload("mooncake", requests=4, seed=0, model="m", trace=str(mooncake_file),
                        arrivals=Arrivals("trace", time_scale=0.5))  # fmt: skip
    assert [s.arrival_s / 2 for s in base.sessions] == pytest.approx([s.arrival_s for s in fast.sessions])
    assert base.concurrency is None
    with pytest.raises(ValueError):
        Arrivals("poisson", rate=0)


def test_request_trace_file_replay(tmp_path: Path) -> None:
    path = tmp_path / "trace.jsonl"
    lines = [
        {"timestamp": 10.0, "session": "a", "endpoint": "chat",
         "body": {"model": "x", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}},
        {"timestamp": 12.0, "endpoint": "/v1/completions", "body": {"model": "x", "prompt": "p"}},
        {"timestamp": 11.0, "session": "a", "endpoint": "chat",
         "body": {"model": "x", "messages": [{"role": "user", "content": "again"}], "temperature": 0}},
    ]  # fmt: skip
    path.write_text("\n".join(json.dumps(line) for line in lines) + "\n\n")
    w = get_workload("trace", requests=None, seed=0, model="served", path=str(path))
    assert w.request_count == 3 and len(w.sessions) == 2
    conv = next(s for s in w.sessions if s.session_id == "a")
    assert conv.arrival_s == 0.0 and len(conv.turns) == 2
    assert conv.turns[1].body is not None and conv.turns[1].body["temperature"] == 0
    assert all(t.body is not None and t.body["model"] == "served" for s in w.sessions for t in s.turns)
    assert [t.max_tokens for t in conv.turns] == [5, 128]
    single = next(s for s in w.sessions if s.session_id != "a")
    assert single.endpoint == "completions" and single.arrival_s == pytest.approx(2.0)


def test_request_trace_file_rejects_bad_lines(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps({"timestamp": 0, "endpoint": "embeddings", "body": {}}) + "\n")
    with pytest.raises(ValueError, match="line 1"):
        get_workload("trace", requests=None, seed=0, model="", path=str(path))


def row_options(name: str, sharegpt: Path, mooncake: Path, tmp_path: Path) -> dict[str, str]:
    """What a row needs in a test: its input files (every other option keeps the row's default)."""
    trace = tmp_path / "requests.jsonl"
    line = {
        "timestamp": 0,
        "endpoint": "chat",
        "body": {"model": "x", "messages": [{"role": "user", "content": "a"}]},
    }
    trace.write_text(json.dumps(line) + "\n")
    files = {"multi-turn": {"trace": str(sharegpt)}, "mooncake": {"trace": str(mooncake)},
             "mixed": {"trace": str(sharegpt)}, "trace": {"path": str(trace)}}  # fmt: skip
    return files.get(name, {})


@pytest.mark.parametrize("spec", WORKLOADS, ids=lambda spec: spec.name)
def test_every_workload_row_builds_and_is_documented(
    spec: WorkloadSpec, sharegpt_file: Path, mooncake_file: Path, tmp_path: Path
) -> None:
    defaults = make_settings(spec.options, {})  # every option has a default
    assert isinstance(defaults, WorkloadSettings) and spec.options.__name__.endswith("Settings")
    options = row_options(spec.name, sharegpt_file, mooncake_file, tmp_path)
    built = get_workload(spec.name, requests=6, seed=3, model="m", **options)
    assert built == get_workload(spec.name, requests=6, seed=3, model="m", **options)
    assert built.name == spec.name and built.description == spec.description
    assert 0 < built.request_count <= 6 and spec.default_requests > 0
    turns = [turn for session in built.sessions for turn in session.turns]
    assert all(turn.body is None or turn.body["model"] == "m" for turn in turns)
    assert any(line.startswith(f"| `{spec.name}` |") for line in DOCS.read_text().splitlines()), spec.name
