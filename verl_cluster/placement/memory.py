"""The memory model: pure formulas, bytes per GPU. Every formula and its source is in docs/placement.md.

Vocabulary: N = GPUs the role's FSDP shards over; T = tokens in one micro batch on one GPU;
c = compute dtype bytes (2 for bf16/fp16, 4 for fp32); m = master (model_dtype) bytes, 4 in verl ≥ 0.5.
A role has phases (its own working set while it runs) and a resident part (what stays on the GPU while
other roles run). The GPU peak is CUDA context + max over phases of (working + others' resident); the
rollout phase is vLLM's `gpu_memory_utilization × total`.

A phase's working set is what torch's caching allocator *reserves* (`torch.cuda.max_memory_reserved`), not
what tensors occupy: an FSDP update step is modelled as the largest of its moments (start of backward through
the loss, back-propagation through the decoder layers, the optimizer step), plus the pools the allocator
keeps per CUDA stream and its fragmentation (calibrated on 2x H200, docs/BENCHMARKS.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from verl_cluster.placement.model_shape import ModelShape

GIB = float(2**30)

# Measured on 2x H200 (docs/BENCHMARKS.md, "GPU machine"): NVML memory in use minus the processes' reserved
# memory is 1.13-1.21 GiB per GPU process (CUDA context, cuBLAS/NCCL buffers outside torch's allocator).
CUDA_CONTEXT_BYTES = 1.2 * GIB
# Other roles' resident states (params/grads/Adam kept between phases) as the allocator holds them. Unmeasured
# (the calibration ran one role per process): kept at the old 10% margin, applied to residents only.
ALLOCATOR_MARGIN = 0.10
VLLM_CUDA_GRAPHS_BYTES = 0.5 * GIB  # vLLM captured graphs unless enforce_eager
# vLLM 0.24 under verl 0.9.1, measured on an H100 (docs/BENCHMARKS.md, "verl for real"; the fixture
# tests/fixtures/verl_runs/h100_grpo_0.5b.json replays it):
# - its worker process's own CUDA context, outside gpu_memory_utilization (the awake tiny model: 0.3 GiB over
#   util x NVML's total, 0.53 GiB over util x torch's total, which vLLM uses)
VLLM_CONTEXT_BYTES = 0.5 * GIB
# - asleep between rollouts (weights and KV cache released): context, CUDA graph pool, torch's leftovers;
#   0.95 GiB (tiny) and 1.23 GiB (0.5B) per GPU
VLLM_ASLEEP_BYTES = 1.25 * GIB
# - awake, beyond what its profiling reserved: the sampler's per-sequence vocab-sized tensors (fp32 logits,
#   logprobs, probabilities, ...) as the caching allocator holds them while the batch shrinks. Fitted on GRPO n=5
#   (256 sequences in flight: 4.83 GiB over budget), checked on PPO n=1 (64 in flight: 0 measured, 1.2 predicted)
VLLM_SAMPLER_BYTES = 133  # per sequence in flight, per vocab entry
ADAM_BYTES = 8  # AdamW: exp_avg + exp_avg_sq in the (fp32) parameter dtype
REDUCE_BYTES = 4  # FSDP MixedPrecision(reduce_dtype=fp32): an unsharded gradient is cast to fp32 to be reduced
LOGITS_BYTES = 4  # fp32 logits per token per vocab entry (vLLM's sampler)
# Loss path (verl, scripts/calibration/calibrate_memory.py: log_softmax(logits.float()), then gather): an fp32 tensor per
# token per logit, several of them alive at once; see loss_bytes().
LOSS_FP32_BYTES = 4
# Caching-allocator fragmentation in an update: this many copies of the largest FSDP unit's gradient path
# (its unsharded c-byte gradient + the fp32 copy FSDP reduces, on two streams). What the allocator reserves
# beyond the modelled pools does not grow with the tokens or the GPU count but with the model's root unit
# (embeddings/lm_head); this is the one fitted number of the model: least squares over the twelve 0.5B
# calibration rows gives 1.81, the six 1.5B rows are the hold-out check (docs/placement.md, "Calibration").
FRAGMENT_UNITS = 1.8
# LoRA (frozen base, adapters FSDP-wrapped alone): no large gradient is reduced, so the term above does not
# apply; what the allocator reserves beyond the live peak grows with the tokens instead: this many copies of
# the checkpointed layer inputs. Least squares over the eight <= 3B LoRA rows on an H100 gives 1.98; the five 7B
# rows (fp32 and bf16 base) are the hold-out (tests/fixtures/calibration_h100_lora.json, docs/BENCHMARKS.md).
LORA_FRAGMENT_SAVED = 2.0
HOST_BASE_BYTES = 2.0 * GIB  # per GPU worker process on the host: torch/CUDA libraries, dataloader
# At the GPU's limit. The reserved working set above is what the caching allocator holds when memory is plentiful;
# near the limit it frees its cached blocks and retries before failing. With `expandable_segments:True` (verl 0.9's
# trainer turns it on for every training phase, `set_expandable_segments`) that is enough for a step whose live
# tensors fit: measured on an H100 80GB, the same FSDP updates with and without it (scripts/gpu/gpu_calib_alloc.sh,
# docs/BENCHMARKS.md): 1.5B 7x4096 (live 76.7 GiB, 85.1 reserved predicted) and 3B 2x8192 ran with it and failed
# without; 3B 5x4096 (77.9 GiB live predicted) failed both ways. The live peak plus this share of it (at least
# PRESSURE_SLACK_MIN) must fit.
PRESSURE_SLACK = 0.02
PRESSURE_SLACK_MIN = 0.5 * GIB


@dataclass(frozen=True)
class Part:
    name: str
    bytes: float

    @property
    def gib(self) -> float:
        return self.bytes / GIB


def total(parts: tuple[Part, ...]) -> float:
    return float(sum(p.bytes for p in parts))


def layer_activation_bytes(shape: ModelShape, tokens: float, c: int) -> float:
    """All tensors one decoder layer saves for backward, per micro batch (flash/SDPA attention: no s^2 term).
    Norm in/out x2, q/k/v out, rotated q/k, attention out, gate/up/act/product of the MLP, and the fp32
    upcasts of the two RMSNorms."""
    h, q, kv, inter = shape.hidden, shape.q_dim, shape.kv_dim, shape.intermediate
    per_token = c * (4 * h + (q + 2 * kv) + (q + kv) + q + 4 * inter) + 4 * 2 * h
    return per_token * tokens


def attention_scores_bytes(shape: ModelShape, micro: int, seq: int, c: int, impl: str) -> float:
    """Eager attention materialises scores and probabilities: micro x heads x s^2, twice."""
    if impl != "eager":
        return 0.0
    return 2.0 * micro * shape.heads * seq * seq * c


def fsdp_states(params: int, n: int, m: int, *, trainable: bool) -> tuple[Part, Part, Part]:
    """FSDP full shard: fp32 master params, grads in the param dtype, AdamW's two fp32 states; all / N."""
    p = Part("params", params * m / n)
    g = Part("grads", params * m / n if trainable else 0.0)
    o = Part("adam", params * ADAM_BYTES / n if trainable else 0.0)
    return p, g, o


def gathered_bytes(shape: ModelShape, c: int, *, root_params: Optional[int] = None, offload_m: int = 0,
                   n: int = 1) -> float:
    """The unshard streams' pool: the root unit (embeddings, lm_head, final norm; FSDP does not reshard it
    after forward) plus the current and the prefetched decoder layer, in the compute dtype. With
    CPUOffload(offload_params) each unit's shard is first copied to the GPU in the master dtype (offload_m)."""
    root = shape.root_params if root_params is None else root_params
    out = root * c + 2 * shape.layer_params * c
    if offload_m:
        out += max(root, shape.layer_params) * offload_m / n
    return float(out)


def loss_bytes(c: int, moment: str, *, verl_engine: bool = False, fused_ce: bool = False) -> int:
    """Bytes per token per logit the loss path holds at `moment` (forward, backward, kept), the c-byte logits
    included; `verl_engine`: verl 0.9's engine workers, `fused_ce`: flash-attn's Triton cross-entropy.
    docs/placement.md, "loss path", has each term and its measurement."""
    if fused_ce:
        return {"forward": c, "backward": c + 2, "kept": c}[moment]
    copy = LOSS_FP32_BYTES if c < LOSS_FP32_BYTES else 0
    if verl_engine and moment == "backward":
        return c + 2 * LOSS_FP32_BYTES
    return {"forward": c + copy + LOSS_FP32_BYTES, "backward": c + 3 * LOSS_FP32_BYTES,
            "kept": c + LOSS_FP32_BYTES}[moment]


def largest_unit(shape: ModelShape, root_params: Optional[int] = None) -> int:
    return max(shape.root_params if root_params is None else root_params, shape.layer_params)


@dataclass(frozen=True)
class TrainInputs:
    shape: ModelShape
    params: int  # parameters of this model (LM or value model)
    n: int  # FSDP world size of the role
    tokens: float  # tokens per micro batch per GPU
    micro: int
    seq: int
    c: int
    m: int
    grad_ckpt: bool
    attn: str
    vocab_out: int  # logits width: vocab for the LM, 1 for value heads
    root_params: Optional[int] = None
    verl_engine: bool = False  # verl >= 0.9's engine workers' loss path (see loss_bytes)
    fused_ce: bool = False  # verl computes log-probs with flash-attn's fused cross-entropy (see loss_bytes)
    adapter: int = 0  # LoRA: the adapters' parameter count (the only trainable ones); 0: full fine-tuning

    @property
    def trainable(self) -> int:
        return self.adapter or self.params


@dataclass(frozen=True)
class UpdateStep:
    """An FSDP update step: the moment that sets the peak, its reserved parts, and the live-tensor peak."""
    moment: str  # "loss backward" | "layer backward" | "optimizer step"
    parts: tuple[Part, ...]  # reserved working set at that moment (sums to `reserved`)
    allocated: float  # torch.cuda.max_memory_allocated analogue: live tensors at the largest moment

    @property
    def reserved(self) -> float:
        return total(self.parts)


def lora_states(params: int, adapter: int, n: int, m: int) -> tuple[Part, Part, Part]:
    """LoRA under FSDP (verl's _build_lora_module): the frozen base and the adapters, both in the master dtype
    (verl casts the adapters to the base's), grads and AdamW states for the adapters only; all / N."""
    return (Part("params", (params + adapter) * m / n), Part("grads", adapter * m / n),
            Part("adam", adapter * ADAM_BYTES / n))


def update_step(x: TrainInputs) -> UpdateStep:
    """Working set of an FSDP update step (actor or critic; LoRA when x.adapter > 0): the largest of its three
    moments (loss backward, layer backward, optimizer step) and the live-tensor peak. verl loads offloaded
    params and optimizer back before the update, so everything is on the GPU. docs/placement.md, "update step"
    and "reserved", has each term and why the pools add up as they do."""
    sh, n, c, m = x.shape, x.n, x.c, x.m
    p, g, o = lora_states(x.params, x.adapter, n, m) if x.adapter else fsdp_states(x.params, n, m, trainable=True)
    root = sh.root_params if x.root_params is None else x.root_params
    unit = largest_unit(sh, x.root_params)
    # the largest unit whose gradient is reduced: with LoRA an adapter's (one Linear's A and B, FSDP-wrapped alone)
    grad_unit = x.adapter // max(1, sh.layers * 7) if x.adapter else unit
    tv = x.tokens * x.vocab_out
    layer = layer_activation_bytes(sh, x.tokens, c)
    scores = attention_scores_bytes(sh, x.micro, x.seq, c, x.attn)
    saved = x.shape.layers * x.tokens * sh.hidden * c if x.grad_ckpt else sh.layers * (layer + scores)
    recompute = 2 * layer + scores if x.grad_ckpt else layer
    kept = tv * loss_bytes(c, "kept", fused_ce=x.fused_ce)
    loss_tr = saved + tv * loss_bytes(c, "backward", verl_engine=x.verl_engine, fused_ce=x.fused_ce)
    layer_tr = saved + recompute + kept
    step_tr = x.trainable * m / n + kept
    # live tensors (allocated): at N = 1 FSDP runs NO_SHARD and frees the bf16 copies after each forward
    root_live = root * c if n > 1 else 0.0
    # at N = 1 with weights already kept in the compute dtype (model_dtype=bf16) FSDP neither gathers nor casts:
    # the units run on their own storage (measured: 7B LoRA, bf16 base, H100)
    gathered = 0.0 if n == 1 and m == c else gathered_bytes(sh, c, root_params=x.root_params)
    reduce = grad_unit * REDUCE_BYTES if n > 1 else 0.0
    allocated = max(p.bytes + o.bytes + root_live + loss_tr,
                    p.bytes + o.bytes + g.bytes + gathered + reduce + layer_tr,
                    p.bytes + g.bytes + o.bytes + step_tr)
    moments = {"loss backward": (Part("activations", saved),
                                 Part("logits", tv * loss_bytes(c, "backward", verl_engine=x.verl_engine, fused_ce=x.fused_ce))),
               "layer backward": (Part("activations", saved + recompute), Part("logits", kept)),
               "optimizer step": (Part("optimizer temp", x.trainable * m / n), Part("logits", kept))}
    moment = max(moments, key=lambda k: total(moments[k]))
    parts = (p, g, o, Part("gathered", gathered), Part("grad reduce", reduce), *moments[moment],
             Part("allocator", LORA_FRAGMENT_SAVED * saved if x.adapter else FRAGMENT_UNITS * unit * (c + REDUCE_BYTES)))
    return UpdateStep(moment, tuple(q for q in parts if q.bytes > 0 or q.name in ("params", "logits")), allocated)


def train_phase(x: TrainInputs) -> tuple[Part, ...]:
    """Reserved working set of an FSDP update step (actor or critic): `update_step(x).parts`."""
    return update_step(x).parts


def forward_phase(x: TrainInputs, *, params_on_gpu: bool, extra: tuple[Part, ...] = ()) -> tuple[Part, ...]:
    """Working set of a forward-only pass (old log-probs, ref log-probs, critic values, reward scores).
    `extra`: the role's own states that sit on the GPU meanwhile (an actor's grads and Adam states).
    Params not on the GPU: verl's CPUOffload (ref, reward model) copies each unit's shard in first."""
    p, _, _ = fsdp_states(x.params, x.n, x.m, trainable=False)
    acts = layer_activation_bytes(x.shape, x.tokens, x.c) + 2 * x.tokens * x.shape.hidden * x.c
    acts += attention_scores_bytes(x.shape, x.micro, x.seq, x.c, x.attn)
    gathered = gathered_bytes(x.shape, x.c, root_params=x.root_params, offload_m=0 if params_on_gpu else x.m, n=x.n)
    return (
        Part("params", p.bytes if params_on_gpu else 0.0),
        *extra,
        Part("gathered", gathered),
        Part("activations", acts),
        Part("logits", x.tokens * x.vocab_out * loss_bytes(x.c, "forward", fused_ce=x.fused_ce)),
    )


def trainable_resident(params: int, n: int, m: int, *, param_offload: bool, optimizer_offload: bool,
                       adapter: int = 0) -> tuple[tuple[Part, ...], tuple[Part, ...]]:
    """(GPU, host) parts an actor/critic keeps between its phases. verl's param_offload moves the flat
    params to the host after each phase; optimizer_offload moves AdamW's states. Grads are freed after each
    optimizer step (zero_grad(set_to_none)): measured on an H100, the trainer process between phases holds
    params + Adam + 1.4 GiB, one model or two. LoRA (`adapter` > 0): base + adapters, Adam for the adapters."""
    p, _, o = lora_states(params, adapter, n, m) if adapter else fsdp_states(params, n, m, trainable=True)
    gpu, host = [], []
    (host if param_offload else gpu).append(p)
    (host if optimizer_offload else gpu).append(o)
    return tuple(gpu), tuple(host)


@dataclass(frozen=True)
class RolloutMemory:
    budget: float  # gpu_memory_utilization x total: what vLLM claims while awake
    weights: float
    activations: float
    graphs: float
    kv_cache: float  # what is left for KV blocks
    kv_per_seq: float
    seqs_fit: int  # sequences of full length the KV cache holds at once
    workspace: float = 0.0  # what the awake process uses beyond the budget (sampler logits)

    @property
    def parts(self) -> tuple[Part, ...]:
        return (Part("weights", self.weights), Part("activations", self.activations),
                Part("cuda graphs", self.graphs), Part("kv cache", max(0.0, self.kv_cache)),
                Part("sampler workspace", self.workspace))


def sampler_workspace(shape: ModelShape, in_flight: int) -> float:
    """What the awake vLLM process holds beyond its budget for `in_flight` sequences sampled at once."""
    return in_flight * shape.vocab * VLLM_SAMPLER_BYTES


def rollout_memory(shape: ModelShape, *, total_bytes: float, util: float, tp: int, dtype_bytes: int, seq: int,
                   max_num_seqs: int, max_num_batched_tokens: int, enforce_eager: bool,
                   in_flight: int = 0, adapter_params: int = 0) -> RolloutMemory:
    """vLLM (≥ 0.7): weights / TP, a profiling forward of max_num_batched_tokens, the sampler's fp32 logits
    for max_num_seqs, CUDA graphs; the KV cache gets the rest of util x total.
    KV bytes per token = 2 x layers x kv_heads/TP x head_dim x dtype bytes. LoRA: verl starts vLLM with
    enable_lora and max_loras=1, which keeps one adapter slot of the adapters' size beside the base weights
    (not measured: a few hundred MiB at most for 7B at rank 64)."""
    budget = util * total_bytes
    weights = (shape.params + adapter_params) * dtype_bytes / tp
    acts = max_num_batched_tokens * (4 * shape.hidden + 3 * shape.intermediate / tp) * dtype_bytes
    acts += max_num_seqs * shape.vocab * LOGITS_BYTES
    graphs = 0.0 if enforce_eager else VLLM_CUDA_GRAPHS_BYTES
    kv = budget - weights - acts - graphs
    per_seq = float(shape.kv_bytes_per_token(dtype_bytes, tp) * seq)
    workspace = sampler_workspace(shape, min(max_num_seqs, in_flight or max_num_seqs))
    return RolloutMemory(budget, weights, acts, graphs, kv, per_seq, max(0, int(kv // per_seq)), workspace)


def gpu_peak(phase_working: float, others_resident: float) -> float:
    """A torch phase's GPU peak: context + its reserved working set + what other roles keep (x margin)."""
    return CUDA_CONTEXT_BYTES + phase_working + others_resident * (1 + ALLOCATOR_MARGIN)


def pressure_need(live: float, others_resident: float) -> float:
    """The least a torch phase needs when the allocator runs at the GPU's limit with expandable segments:
    context + its live tensors (+ PRESSURE_SLACK) + what other roles keep (x margin)."""
    slack = max(live * PRESSURE_SLACK, PRESSURE_SLACK_MIN)
    return CUDA_CONTEXT_BYTES + live + slack + others_resident * (1 + ALLOCATOR_MARGIN)


def rollout_peak(r: RolloutMemory, others_resident: float, *, colocated: bool) -> float:
    """vLLM's worker process wakes into util x total plus its own context and the sampler's workspace; a
    colocated trainer process keeps its context and whatever its roles hold resident beside it."""
    trainer = CUDA_CONTEXT_BYTES + others_resident * (1 + ALLOCATOR_MARGIN) if colocated else 0.0
    return VLLM_CONTEXT_BYTES + r.budget + r.workspace + trainer
