"""A Hugging Face style model directory derived offline from a llama-architecture GGUF (SmolLM2's).

``read_meta(gguf)`` reads the GGUF's metadata (vocabulary, merges, special tokens, chat template,
architecture numbers); ``build_tokenizer(meta)`` makes the GPT-2 style byte-level BPE ``tokenizers``
object llama.cpp uses for SmolLM (digits one by one, then the GPT-2 split; control tokens special);
``write_model_dir(gguf, out, weights=...)`` writes what vLLM loads as ``--model``:

- ``tokenizer.json``, ``tokenizer_config.json`` (``chat_template``, ``bos_token``, ``eos_token``);
- ``config.json``: ``LlamaForCausalLM`` from the GGUF's ``llama.*`` keys (tied embeddings when the GGUF
  has no ``output.weight``), ``generation_config.json``;
- with ``weights=True``, ``model.safetensors``: every tensor dequantized with ``gguf.quants`` to bfloat16,
  renamed to the Hugging Face names, and the query/key projections un-permuted (llama.cpp's converter
  interleaves their rotary halves). Without it, the engine must run with ``--load-format dummy``
  (random weights: every engine mechanism is real, the generated text is not).

Nothing is downloaded; ``gguf`` and ``tokenizers`` come from the ``lab`` extra and ``numpy`` with them.
A finished directory carries a ``.prefix-router-model`` stamp naming its source and recipe, so a second
call with the same arguments returns at once.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

_CONTROL = 3  # GGUF token type of control (special) tokens
RECIPE = 1  # bump when what is written changes, so cached directories are redone
STAMP = ".prefix-router-model"


def read_meta(path: Path) -> dict[str, Any]:
    """The metadata the tokenizer and ``config.json`` need (absent keys are None)."""
    import gguf

    reader = gguf.GGUFReader(str(path))

    def value(key: str) -> Any:
        field = reader.get_field(key)
        return None if field is None else field.contents()

    arch = value("general.architecture")
    keys = (
        "block_count",
        "context_length",
        "embedding_length",
        "feed_forward_length",
        "attention.head_count",
        "attention.head_count_kv",
        "rope.freq_base",
        "attention.layer_norm_rms_epsilon",
        "vocab_size",
        "rope.dimension_count",
    )
    return {
        "tokens": value("tokenizer.ggml.tokens"),
        "types": value("tokenizer.ggml.token_type"),
        "merges": value("tokenizer.ggml.merges"),
        "bos": value("tokenizer.ggml.bos_token_id"),
        "eos": value("tokenizer.ggml.eos_token_id"),
        "template": value("tokenizer.chat_template"),
        "model": value("tokenizer.ggml.model"),
        "architecture": arch,
        "name": value("general.name"),
        "arch": {key: value(f"{arch}.{key}") for key in keys},
        "tensors": [t.name for t in reader.tensors],
    }


def build_tokenizer(meta: dict[str, Any], extra: tuple[str, ...] = (), split: str | None = None) -> Any:
    """The GGUF vocabulary as a ``tokenizers.Tokenizer`` (``extra``: more special tokens; ``split``: a
    pre-tokenizer regex replacing SmolLM2's digits + GPT-2 split)."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers

    if meta["model"] != "gpt2":
        raise ValueError(f"only GPT-2 style BPE vocabularies are converted, not {meta['model']!r}")
    vocab = {tok: i for i, tok in enumerate(meta["tokens"])}
    merges = [tuple(m.split(" ", 1)) for m in meta["merges"]]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False))
    if split is None:
        steps = [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False),
        ]
    else:
        steps = [
            pre_tokenizers.Split(Regex(split), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    tok.pre_tokenizer = pre_tokenizers.Sequence(steps)
    tok.decoder = decoders.ByteLevel()
    control = [t for t, kind in zip(meta["tokens"], meta["types"], strict=True) if kind == _CONTROL]
    names = list(dict.fromkeys([*control, *extra]))
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in names])
    return tok


def hf_config(meta: dict[str, Any]) -> dict[str, Any]:
    """``config.json`` for a llama-architecture GGUF."""
    if meta["architecture"] != "llama":
        raise ValueError(f"only llama-architecture GGUFs are converted, not {meta['architecture']!r}")
    a = meta["arch"]
    heads = int(a["attention.head_count"])
    hidden = int(a["embedding_length"])
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": hidden,
        "intermediate_size": int(a["feed_forward_length"]),
        "num_hidden_layers": int(a["block_count"]),
        "num_attention_heads": heads,
        "num_key_value_heads": int(a["attention.head_count_kv"] or heads),
        "head_dim": int(a["rope.dimension_count"] or hidden // heads),
        "vocab_size": int(a["vocab_size"] or len(meta["tokens"])),
        "max_position_embeddings": int(a["context_length"]),
        "rope_theta": float(a["rope.freq_base"] or 10000.0),
        "rms_norm_eps": float(a["attention.layer_norm_rms_epsilon"]),
        "tie_word_embeddings": "output.weight" not in meta["tensors"],
        "hidden_act": "silu",
        "bos_token_id": int(meta["bos"]),
        "eos_token_id": int(meta["eos"]),
        "torch_dtype": "bfloat16",
    }


def write_tokenizer_files(meta: dict[str, Any], out: Path) -> None:
    """``tokenizer.json`` and ``tokenizer_config.json`` with the GGUF's own chat template."""
    out.mkdir(parents=True, exist_ok=True)
    build_tokenizer(meta).save(str(out / "tokenizer.json"))
    config = {
        "chat_template": meta["template"],
        "bos_token": meta["tokens"][meta["bos"]],
        "eos_token": meta["tokens"][meta["eos"]],
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": int(meta["arch"]["context_length"] or 8192),
    }
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=1), encoding="utf-8")


_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_TOP_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}


def hf_name(gguf_name: str) -> str:
    """``blk.3.attn_q.weight`` -> ``model.layers.3.self_attn.q_proj.weight``."""
    stem, suffix = gguf_name.rsplit(".", 1)
    parts = stem.split(".")
    if parts[0] == "blk":
        return f"model.layers.{parts[1]}.{_LAYER_NAMES[parts[2]]}.{suffix}"
    return f"{_TOP_NAMES[stem]}.{suffix}"


def unpermute(weights: Any, heads: int) -> Any:
    """Undo llama.cpp's rotary interleave of a q/k projection (rows grouped per head, halves swapped)."""
    rows = weights.shape[0]
    return (
        weights.reshape(heads, rows // heads // 2, 2, *weights.shape[1:])
        .swapaxes(1, 2)
        .reshape(weights.shape)
    )


def hf_tensors(path: Path, meta: dict[str, Any]) -> Iterator[tuple[str, Any]]:
    """(Hugging Face name, bfloat16 bits) for every tensor of the GGUF."""
    import gguf
    import numpy as np

    heads = int(meta["arch"]["attention.head_count"])
    kv_heads = int(meta["arch"]["attention.head_count_kv"] or heads)
    for tensor in gguf.GGUFReader(str(path)).tensors:
        array = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
        array = np.asarray(array, dtype=np.float32).reshape([int(n) for n in reversed(tensor.shape)])
        if tensor.name.endswith("attn_q.weight"):
            array = unpermute(array, heads)
        elif tensor.name.endswith("attn_k.weight"):
            array = unpermute(array, kv_heads)
        yield hf_name(tensor.name), bfloat16_bits(array)


def bfloat16_bits(array: Any) -> Any:
    """float32 values as bfloat16 bit patterns (uint16), rounded to nearest even."""
    import numpy as np

    bits = np.ascontiguousarray(array, dtype=np.float32).view(np.uint32)
    rounded = (bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)
    return rounded.astype(np.uint16)


def write_safetensors(tensors: Iterator[tuple[str, Any]], out: Path) -> None:
    """The safetensors layout: an 8-byte little-endian header length, a JSON header, the raw data."""
    header: dict[str, Any] = {}
    blobs: list[bytes] = []
    offset = 0
    for name, array in tensors:
        data = array.tobytes()
        header[name] = {
            "dtype": "BF16",
            "shape": list(array.shape),
            "data_offsets": [offset, offset + len(data)],
        }
        blobs.append(data)
        offset += len(data)
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    with out.open("wb") as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        for blob in blobs:
            f.write(blob)


def stamp_text(gguf_path: Path, weights: bool) -> str:
    stat = gguf_path.stat()
    return f"{gguf_path.resolve()} {stat.st_size} weights={weights} recipe={RECIPE}"


def write_model_dir(gguf_path: Path, out: Path, *, weights: bool) -> Path:
    """Write (or reuse, when its stamp matches) the model directory ``out``; returns ``out``."""
    stamp = out / STAMP
    want = stamp_text(gguf_path, weights)
    if stamp.is_file() and stamp.read_text() == want:
        return out
    out.mkdir(parents=True, exist_ok=True)
    stamp.unlink(missing_ok=True)
    meta = read_meta(gguf_path)
    write_tokenizer_files(meta, out)
    (out / "config.json").write_text(json.dumps(hf_config(meta), indent=1), encoding="utf-8")
    generation = {"bos_token_id": int(meta["bos"]), "eos_token_id": int(meta["eos"])}
    (out / "generation_config.json").write_text(json.dumps(generation), encoding="utf-8")
    weights_file = out / "model.safetensors"
    if weights:
        partial = out / "model.safetensors.partial"
        write_safetensors(hf_tensors(gguf_path, meta), partial)
        partial.replace(weights_file)
    else:
        weights_file.unlink(missing_ok=True)
    stamp.write_text(want)
    return out
