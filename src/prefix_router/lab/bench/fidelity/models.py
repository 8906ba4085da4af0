"""Model directories for the fidelity benchmark, derived offline from the SmolLM2 GGUF the project ships.

``gguf_model_dir`` reads a GGUF file with the ``gguf`` package and writes what an engine's model directory
holds for its chat: ``tokenizer.json`` (the GPT-2 style byte-level BPE: vocabulary and merges from the GGUF
metadata, the pre-tokenizer llama.cpp uses for SmolLM (digits one by one, then the GPT-2 split), control
tokens as special tokens) and ``tokenizer_config.json`` (``chat_template``, ``bos_token``, ``eos_token``).

Bundled templates (``templates/*.jinja``, written out by hand after the models' published templates) give
more real layouts over the same vocabulary, each with its own special tokens added: ChatML with tools
(Qwen2.5), Llama 3.1, Mistral v0.3, and a reasoning model (Qwen3). Nothing is downloaded.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from prefix_router.lab.launch.fleet import find_gguf
from prefix_router.lab.launch.gguf_model import build_tokenizer, read_meta
from prefix_router.lab.launch.llama_cpp import default_venv


@dataclass(frozen=True, slots=True)
class Layout:
    """A bundled chat template over the SmolLM2 vocabulary."""

    name: str
    bos: str
    eos: str
    specials: tuple[str, ...] = ()
    follows_default_order: bool = True  # system, tools, rest: the layout the default key assumes
    reasoning: bool = False  # the model writes a think block before every answer
    split: str | None = None  # the model's own pre-tokenizer pattern (else SmolLM2's)


@dataclass(frozen=True, slots=True)
class ModelDir:
    """A model directory to measure: its name, path, and what the benchmark needs to know of its layout."""

    name: str
    path: Path
    default_order: bool
    reasoning: bool
    renders_tools: bool = True  # SmolLM2's own template ignores tools and tool calls


# Llama 3's published pre-tokenizer pattern (newline runs stay one piece whatever follows them)
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
    r"|\s+(?!\S)|\s+"
)
_CHATML = ("<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>", "<think>", "</think>")
LAYOUTS = (
    Layout("qwen2.5", "<|im_start|>", "<|im_end|>", _CHATML),
    Layout(
        "llama3.1",
        "<|begin_of_text|>",
        "<|eot_id|>",
        ("<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>", "<|python_tag|>"),
        split=_LLAMA3_SPLIT,
    ),
    Layout(
        "mistral-v0.3",
        "<s>",
        "</s>",
        (
            "<s>",
            "</s>",
            "[INST]",
            "[/INST]",
            "[AVAILABLE_TOOLS]",
            "[/AVAILABLE_TOOLS]",
            "[TOOL_CALLS]",
            "[TOOL_RESULTS]",
            "[/TOOL_RESULTS]",
        ),
        follows_default_order=False,
    ),
    Layout("qwen3", "<|im_start|>", "<|im_end|>", _CHATML, reasoning=True),
)


def smollm2_gguf() -> Path | None:
    """The SmolLM2 GGUF installed by ``scripts/install-llama-cpp.sh``, if any."""
    return find_gguf(default_venv())


def gguf_model_dir(gguf_path: Path, out: Path, layout: Layout | None = None) -> Path:
    """Write ``tokenizer.json`` and ``tokenizer_config.json`` for the GGUF's own chat template, or for a
    bundled ``layout``, into ``out``; returns ``out``."""
    return _write_model_dir(read_meta(gguf_path), out, layout)


def _write_model_dir(meta: dict[str, Any], out: Path, layout: Layout | None) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    build_tokenizer(meta, layout.specials if layout else (), layout.split if layout else None).save(
        str(out / "tokenizer.json")
    )
    if layout is None:
        config = {
            "chat_template": meta["template"],
            "bos_token": meta["tokens"][meta["bos"]],
            "eos_token": meta["tokens"][meta["eos"]],
        }
    else:
        template = resources.files(__package__).joinpath("templates", f"{layout.name}.jinja").read_text()
        config = {"chat_template": template, "bos_token": layout.bos, "eos_token": layout.eos}
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=1), encoding="utf-8")
    return out


def all_model_dirs(gguf_path: Path, root: Path) -> list[ModelDir]:
    """SmolLM2 itself and every bundled layout over its vocabulary (the GGUF is read once)."""
    meta = read_meta(gguf_path)
    dirs = [ModelDir("smollm2", _write_model_dir(meta, root / "smollm2", None), True, False, False)]
    for lay in LAYOUTS:
        path = _write_model_dir(meta, root / lay.name, lay)
        dirs.append(ModelDir(lay.name, path, lay.follows_default_order, lay.reasoning))
    return dirs
