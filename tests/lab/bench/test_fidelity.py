"""The fidelity benchmark on its small corpus: the targets of issue 12, asserted."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from prefix_router.lab.bench.fidelity.corpus import corpus
from prefix_router.lab.bench.fidelity.run import (
    TARGET_SCOPE,
    applicable,
    calibrated,
    fold,
    measure,
    meets_targets,
    summaries,
)
from prefix_router.lab.bench.fidelity.truth import Oracle
from prefix_router.lab.launch.llama_cpp import default_venv, venv_python
from prefix_router.routing.keys import KeyBuilder
from prefix_router.routing.settings import KeySettings, UnitSettings
from prefix_router.routing.units import UnitTuning

SAMPLES = [
    "Hello world! 12345 tokens, it's 3.14",
    "<|im_start|>system\nYou are a helpful AI<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n",
    "  leading spaces\n\n\ttabs and code: def f(x): return x**2  # ok",
    "Ünïcödé текст 日本語 😀",
    '{"type": "function", "function": {"name": "get_weather", "parameters": {}}}',
]
MESSAGES = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "What is 2 + 2?"},
    {"role": "assistant", "content": "4."},
    {"role": "user", "content": "And 3 + 3?"},
]
LLAMA_SIDE = """
import json, sys
from llama_cpp import Llama
from llama_cpp.llama_chat_format import Jinja2ChatFormatter
args = json.load(sys.stdin)
llm = Llama(model_path=args["gguf"], vocab_only=True, verbose=False)
ids = [llm.tokenize(s.encode(), add_bos=False, special=True) for s in args["samples"]]
meta = llm.metadata
fmt = Jinja2ChatFormatter(meta["tokenizer.chat_template"], eos_token="<|im_end|>", bos_token="<|im_start|>")
prompt = fmt(messages=args["messages"]).prompt
print(json.dumps({"ids": ids, "prompt": prompt}))
"""


def test_the_converted_tokenizer_and_template_match_llama_cpp(model_dirs: dict[str, Any]) -> None:
    """The tokenizer derived from the GGUF tokenizes like llama.cpp, and the chat template renders like
    llama-cpp-python's own formatter."""
    from tokenizers import Tokenizer

    from prefix_router.lab.bench.fidelity.models import smollm2_gguf
    from prefix_router.routing.template import ChatTemplate

    smol = model_dirs["smollm2"].path
    args = {"gguf": str(smollm2_gguf()), "samples": SAMPLES, "messages": MESSAGES}
    out = subprocess.run(
        [str(venv_python(default_venv())), "-c", LLAMA_SIDE],
        input=json.dumps(args), capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    theirs = json.loads(out.stdout.strip().splitlines()[-1])
    tokenizer = Tokenizer.from_file(str(Path(smol) / "tokenizer.json"))
    ours = [tokenizer.encode(s, add_special_tokens=False).ids for s in SAMPLES]
    assert ours == theirs["ids"]
    assert ChatTemplate(smol).render({"model": "m", "messages": MESSAGES}) == theirs["prompt"]


def test_small_corpus_meets_the_targets(model_dirs: dict[str, Any]) -> None:
    models = list(model_dirs.values())
    rows = [row for model in models for row in measure(model, corpus("small"))]
    found = summaries(rows, models)
    assert meets_targets(found) == []  # every target of issue 12
    exact = next(s for s in found if s.mode == "exact" and s.scope == "all")
    assert exact.over == 0 and exact.ratio >= 0.99 and exact.zero_but_shared == 0
    default = next(s for s in found if s.mode == "default-tok" and s.scope == TARGET_SCOPE)
    assert default.over == 0 and default.ratio >= 0.90
    # character blocks: with the token value learned from engine reports (held out, valued by the bytes'
    # classes), no over-prediction beyond a block where the configured 4 characters per token over-predicts,
    # and >= 90 % of true (one value per model reached 0.829: it cannot follow prose and JSON at once)
    chars = next(s for s in found if s.mode == "default" and s.scope == TARGET_SCOPE)
    fixed = next(s for s in found if s.mode == "default-fixed" and s.scope == TARGET_SCOPE)
    assert chars.over == 0 and chars.ratio >= 0.90
    assert fixed.over > 10 and fixed.ratio > 1.05
    # every layout and category was measured, with real sharing to predict
    assert {r.layout for r in rows} == set(model_dirs) and {r.category for r in rows} >= {"chat", "agent"}
    assert sum(r.true for r in rows if r.mode == "exact") > 100_000


def test_the_character_reading_learns_the_token_value_from_the_other_fold_only(
    model_dirs: dict[str, Any],
) -> None:
    model, cases = model_dirs["qwen2.5"], corpus("small")  # a layout that renders the whole key
    routers = calibrated(model, cases, Oracle(model.path, KeySettings().image_tokens), UnitSettings())
    keys = KeyBuilder(KeySettings())
    for k, router in routers.items():
        others = [c for c in applicable(model, cases) if fold(c) != k]
        long_enough = [
            body
            for c in others
            for body in (c.first, c.second)
            if keys.build("chat", body, route_id="x").key_tokens >= UnitTuning().min_sample_tokens
        ]
        learned = router.units.summary()["m"]
        assert learned["samples"] == len(long_enough) >= UnitTuning().warmup
        assert 4.6 < learned["chars_per_token"] < 5.4  # the SmolLM2 vocabulary on this text: about 5
        assert learned["chars_per_token_used"] > learned["chars_per_token"]  # the margin
        # by class: the same reports; punctuation (JSON of the tools) costs more tokens per byte than words,
        # whitespace (merged into the next word by the tokenizer) fewer
        assert learned["content_samples"] == learned["samples"] and learned["content_used"]
        assert learned["punct_tokens_per_kb"] > learned["word_tokens_per_kb"] > learned["space_tokens_per_kb"]
        assert router.index.workers() == []  # the calibration worker is gone: nothing else carried over


def test_the_corpus_is_deterministic() -> None:
    assert corpus("small") == corpus("small")
    assert len(corpus("full")) > 4 * len(corpus("small")) - 10
