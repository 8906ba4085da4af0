"""Engine profiles: the constants of the timing model and the KV-cache size, each with its source.

Every figure below is either a published number (model architecture, GPU datasheet, vLLM default) or an
explicitly labelled assumption (achieved efficiency, software overhead). The timing model that uses them is
in ``prefix_router.lab.sim.timing``; ``docs/simulator.md`` discusses the derivation.

Sources
- [L3] Llama 3.1 architecture: "The Llama 3 Herd of Models", Dubey et al. 2024, arXiv:2407.21783, Table 3
  (8B: 32 layers, model dim 4096, 32 heads, 8 KV heads; 70B: 80 layers, dim 8192, 64 heads, 8 KV heads;
  128K context), and the model cards' config.json (meta-llama/Llama-3.1-8B-Instruct, -70B-Instruct):
  head_dim 128, 8.03 B and 70.6 B parameters, bfloat16.
- [H100] NVIDIA H100 Tensor Core GPU datasheet (H100 SXM): BF16 1,979 TFLOPS *with sparsity*, i.e.
  989.4 TFLOPS dense; HBM3 3.35 TB/s; 80 GB.
- [VLLM] vLLM ``vllm/engine/arg_utils.py`` (``get_batch_defaults``): on GPUs with >= 70 GiB (H100) the
  OpenAI server defaults to ``max_num_batched_tokens=8192`` and ``max_num_seqs=1024``; ``block_size=16``
  and ``gpu_memory_utilization=0.9`` are vLLM's defaults (``vllm/config``).
- [ROOF] Roofline reasoning for LLM inference: Yuan et al. 2024, "LLM Inference Unveiled: Survey and
  Roofline Model Insights", arXiv:2402.16363 (decode is memory bound: weights + KV read per step; prefill
  is compute bound: about 2 x parameters FLOPs per token plus attention).
- [FA3] FlashAttention-3, Shah et al. 2024, arXiv:2407.08608: up to 740 TFLOPS (75 % of peak) for FP16
  attention forward on H100; we assume much less (40 %) for mixed chunked-prefill batches.
- [VIDUR] Vidur, Agrawal et al., MLSys 2024, arXiv:2405.05465: prefill cost as a linear term in tokens
  plus a quadratic attention term; discrete-event simulation of LLM serving.
- [SWEEP] "vLLM throughput-latency sweep on NVIDIA A100" (johnmusgrave.com, vLLM 0.23, Llama-3.1-8B
  BF16): one request decodes at about 75 tokens/s on an A100 40GB, about 77 % of the memory-bandwidth
  ceiling; the basis of our 80 % HBM efficiency.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

GIB = 1024**3


@dataclass(frozen=True, slots=True)
class EngineProfile:
    """Timing and capacity constants of one (model, hardware) pair. Times in seconds."""

    name: str
    model: str
    description: str
    # per step: fixed software overhead (scheduling, kernel launches, sampling; for tensor parallelism also
    # the all-reduce latency floor)
    step_overhead_s: float
    # time to stream the weights once (the decode floor of a step)
    weights_read_s: float
    # linear compute per token in a step (about 2 x parameters FLOPs at the assumed efficiency)
    token_compute_s: float
    # attention compute per (query token, context token) pair during prefill
    attention_pair_s: float
    # memory time to read one context token's KV cache during decode
    kv_read_s_per_token: float
    # per sequence in the batch (sampling, detokenisation, bookkeeping)
    per_seq_s: float
    kv_capacity_tokens: int
    max_num_seqs: int
    max_num_batched_tokens: int
    max_model_len: int
    block_size: int = 16
    # a KV handoff (prefill/decode disaggregation): seconds per prompt token whose KV cache moves from the
    # prefill engine to the decode engine (KV bytes per token / the link's bandwidth); 0: free
    kv_transfer_s_per_token: float = 0.0

    def with_overrides(self, **changes: int | float | None) -> EngineProfile:
        """A copy with the given fields replaced; ``None`` values are ignored."""
        given = {key: value for key, value in changes.items() if value is not None}
        return replace(self, **given)  # type: ignore[arg-type]


@dataclass(frozen=True, slots=True)
class Hardware:
    """A GPU group: dense BF16 FLOP/s and HBM bytes/s summed over the GPUs, and memory per GPU."""

    gpus: int
    flops: float
    hbm_bytes_s: float
    memory_bytes_per_gpu: float


@dataclass(frozen=True, slots=True)
class Model:
    """The architectural numbers that set the costs (bf16: 2 bytes per value)."""

    name: str
    params: float
    layers: int
    model_dim: int
    kv_heads: int
    head_dim: int
    max_model_len: int

    @property
    def weight_bytes(self) -> float:
        return 2.0 * self.params

    @property
    def kv_bytes_per_token(self) -> float:
        return 2.0 * self.layers * self.kv_heads * self.head_dim * 2.0

    @property
    def attention_flops_per_pair(self) -> float:
        # QK^T and AV, 2 FLOPs per multiply-add each, over all query heads of all layers
        return 4.0 * self.layers * self.model_dim


# [H100]
H100 = Hardware(gpus=1, flops=989.4e12, hbm_bytes_s=3.35e12, memory_bytes_per_gpu=80 * GIB)
# [L3]
LLAMA_31_8B = Model("meta-llama/Llama-3.1-8B-Instruct", 8.03e9, 32, 4096, 8, 128, 131_072)
LLAMA_31_70B = Model("meta-llama/Llama-3.1-70B-Instruct", 70.6e9, 80, 8192, 8, 128, 131_072)

# Assumptions (not measurements): achieved fractions of peak and fixed overheads.
LINEAR_MFU_1GPU = 0.5  # dense GEMMs of prefill chunks on one H100
LINEAR_MFU_TP8 = 0.4  # lower with tensor parallelism (communication, smaller GEMMs per GPU)
ATTENTION_EFFICIENCY = 0.4  # well below FlashAttention-3's 75 % [FA3]
HBM_EFFICIENCY = 0.8  # achievable fraction of HBM bandwidth when streaming weights/KV [SWEEP]
GPU_MEMORY_UTILIZATION = 0.9  # [VLLM] default
ACTIVATION_RESERVE_BYTES = 5 * GIB  # activations, CUDA graphs, allocator slack per GPU (assumed)
STEP_OVERHEAD_S = 0.5e-3  # scheduler + launch + sampling per step (assumed)
TP_ALLREDUCE_S = 15e-6  # latency of one small all-reduce over NVLink (assumed); 2 per layer
# the KV handoff's link per GPU (assumed): one 200 Gb/s RDMA NIC at 25 GB/s, as NIXL over InfiniBand or RoCE
KV_LINK_BYTES_S = 25e9


def kv_capacity(model: Model, hw: Hardware) -> int:
    """KV tokens that fit: (utilised memory - weights - activations) / KV bytes per token, all GPUs."""
    per_gpu = hw.memory_bytes_per_gpu * GPU_MEMORY_UTILIZATION - ACTIVATION_RESERVE_BYTES
    free = hw.gpus * per_gpu - model.weight_bytes
    return int(free / model.kv_bytes_per_token)


def derive(name: str, model: Model, hw: Hardware, mfu: float, overhead_s: float) -> EngineProfile:
    """Build a profile from architecture and hardware with the roofline model [ROOF]."""
    hbm = hw.hbm_bytes_s * HBM_EFFICIENCY
    return EngineProfile(
        name=name,
        model=model.name,
        description=f"{model.name} on {hw.gpus}x H100 SXM (derived, see profiles.py)",
        step_overhead_s=overhead_s,
        weights_read_s=model.weight_bytes / hbm,
        token_compute_s=2.0 * model.params / (hw.flops * mfu),
        attention_pair_s=model.attention_flops_per_pair / (hw.flops * ATTENTION_EFFICIENCY),
        kv_read_s_per_token=model.kv_bytes_per_token / hbm,
        per_seq_s=10e-6,
        kv_capacity_tokens=kv_capacity(model, hw),
        max_num_seqs=1024,  # [VLLM]
        max_num_batched_tokens=8192,  # [VLLM]
        max_model_len=model.max_model_len,
        kv_transfer_s_per_token=model.kv_bytes_per_token / (KV_LINK_BYTES_S * hw.gpus),
    )


def _h100s(gpus: int) -> Hardware:
    return Hardware(gpus, H100.flops * gpus, H100.hbm_bytes_s * gpus, H100.memory_bytes_per_gpu)


def builtin_profiles() -> dict[str, EngineProfile]:
    """All profiles by name (a fresh dict: no module-level mutable state)."""
    p8b = derive("llama-3.1-8b-h100", LLAMA_31_8B, H100, LINEAR_MFU_1GPU, STEP_OVERHEAD_S)
    tp8_overhead = STEP_OVERHEAD_S + 2 * LLAMA_31_70B.layers * TP_ALLREDUCE_S
    p70b = derive("llama-3.1-70b-8xh100", LLAMA_31_70B, _h100s(8), LINEAR_MFU_TP8, tp8_overhead)
    return {p.name: p for p in (p8b, p70b, cpu_demo())}


def cpu_demo() -> EngineProfile:
    """A small, fast toy profile for demos on a laptop: NOT a model of real hardware."""
    return EngineProfile(
        name="cpu-demo",
        model="sim-demo",
        description="toy profile for demos and tests (not real hardware): small cache, fast steps",
        step_overhead_s=1e-3,
        weights_read_s=2e-3,
        token_compute_s=20e-6,
        attention_pair_s=2e-9,
        kv_read_s_per_token=20e-9,
        per_seq_s=20e-6,
        kv_capacity_tokens=65_536,
        max_num_seqs=64,
        max_num_batched_tokens=2048,
        max_model_len=32_768,
        kv_transfer_s_per_token=5e-6,
    )


DEFAULT_PROFILE = "llama-3.1-8b-h100"


def get_profile(name: str) -> EngineProfile:
    """The built-in profile ``name`` (KeyError listing the choices)."""
    profiles = builtin_profiles()
    if name not in profiles:
        raise KeyError(f"unknown profile {name!r}; choose from {', '.join(profiles)}")
    return profiles[name]
