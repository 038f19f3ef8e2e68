"""The memory model: pure formulas, bytes per GPU. Every formula and its source is in docs/placement.md.

Vocabulary: N = GPUs the role's FSDP shards over; T = tokens in one micro batch on one GPU;
c = compute dtype bytes (2 for bf16/fp16, 4 for fp32); m = master (model_dtype) bytes, 4 in verl ≥ 0.5.
A role has phases (its own working set while it runs) and a resident part (what stays on the GPU while
other roles run). The GPU peak is CUDA context + max over phases of (working + others' resident), with an
allocator margin on the torch part; the rollout phase is vLLM's `gpu_memory_utilization × total`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from verl_cluster.placement.model_shape import ModelShape

GIB = float(2**30)

# Assumptions (see docs/placement.md; scripts/calibrate_memory.py measures them on a real GPU).
CUDA_CONTEXT_BYTES = 1.0 * GIB  # CUDA context + cuBLAS workspace + NCCL buffers, once per GPU process
ALLOCATOR_MARGIN = 0.10  # torch caching allocator: reserved vs allocated at the peak
VLLM_CUDA_GRAPHS_BYTES = 0.5 * GIB  # vLLM captured graphs unless enforce_eager
ADAM_BYTES = 8  # AdamW: exp_avg + exp_avg_sq in the (fp32) parameter dtype
LOGITS_BYTES = 4  # fp32 logits per token per vocab entry (log-softmax runs in fp32)
HOST_BASE_BYTES = 2.0 * GIB  # per GPU worker process on the host: torch/CUDA libraries, dataloader


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


def gathered_bytes(shape: ModelShape, c: int, *, backward: bool, root_params: Optional[int] = None) -> float:
    """Unsharded weights in flight: the root unit (embeddings, lm_head, final norm) stays gathered through
    forward and backward (FSDP does not reshard the root), plus the current and the prefetched decoder layer;
    in backward also one unit's unsharded fp32 gradient before reduce-scatter."""
    root = shape.root_params if root_params is None else root_params
    out = root * c + 2 * shape.layer_params * c
    if backward:
        out += max(root, shape.layer_params) * 4
    return float(out)


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


def train_phase(x: TrainInputs) -> tuple[Part, ...]:
    """Working set of an FSDP update step (actor or critic): everything is on the GPU during it, because
    verl loads offloaded params/optimizer back before update_actor/update_critic."""
    p, g, o = fsdp_states(x.params, x.n, x.m, trainable=True)
    layer = layer_activation_bytes(x.shape, x.tokens, x.c)
    scores = attention_scores_bytes(x.shape, x.micro, x.seq, x.c, x.attn)
    if x.grad_ckpt:
        acts = x.shape.layers * x.tokens * x.shape.hidden * x.c + 2 * layer + scores
    else:
        acts = x.shape.layers * (layer + scores)
    return (
        p, g, o,
        Part("gathered", gathered_bytes(x.shape, x.c, backward=True, root_params=x.root_params)),
        Part("activations", acts),
        Part("logits", x.tokens * x.vocab_out * LOGITS_BYTES * 2),  # fp32 logits + their gradient
    )


def forward_phase(x: TrainInputs, *, params_on_gpu: bool, extra: tuple[Part, ...] = ()) -> tuple[Part, ...]:
    """Working set of a forward-only pass (old log-probs, ref log-probs, critic values, reward scores).
    `extra`: the role's own states that sit on the GPU meanwhile (an actor's grads and Adam states)."""
    p, _, _ = fsdp_states(x.params, x.n, x.m, trainable=False)
    acts = layer_activation_bytes(x.shape, x.tokens, x.c) + 2 * x.tokens * x.shape.hidden * x.c
    acts += attention_scores_bytes(x.shape, x.micro, x.seq, x.c, x.attn)
    return (
        Part("params", p.bytes if params_on_gpu else 0.0),
        *extra,
        Part("gathered", gathered_bytes(x.shape, x.c, backward=False, root_params=x.root_params)),
        Part("activations", acts),
        Part("logits", x.tokens * x.vocab_out * LOGITS_BYTES),
    )


def trainable_resident(params: int, n: int, m: int, *, param_offload: bool, optimizer_offload: bool) -> tuple[
        tuple[Part, ...], tuple[Part, ...]]:
    """(GPU, host) parts an actor/critic keeps between its phases. verl's param_offload moves the flat
    params (and their grads) to the host after each phase; optimizer_offload moves AdamW's states."""
    p, g, o = fsdp_states(params, n, m, trainable=True)
    gpu, host = [], []
    (host if param_offload else gpu).extend([p, g])
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

    @property
    def parts(self) -> tuple[Part, ...]:
        return (Part("weights", self.weights), Part("activations", self.activations),
                Part("cuda graphs", self.graphs), Part("kv cache", max(0.0, self.kv_cache)))


def rollout_memory(shape: ModelShape, *, total_bytes: float, util: float, tp: int, dtype_bytes: int, seq: int,
                   max_num_seqs: int, max_num_batched_tokens: int, enforce_eager: bool) -> RolloutMemory:
    """vLLM (≥ 0.7): weights / TP, a profiling forward of max_num_batched_tokens, the sampler's fp32 logits
    for max_num_seqs, CUDA graphs; the KV cache gets the rest of util x total.
    KV bytes per token = 2 x layers x kv_heads/TP x head_dim x dtype bytes."""
    budget = util * total_bytes
    weights = shape.params * dtype_bytes / tp
    acts = max_num_batched_tokens * (4 * shape.hidden + 3 * shape.intermediate / tp) * dtype_bytes
    acts += max_num_seqs * shape.vocab * LOGITS_BYTES
    graphs = 0.0 if enforce_eager else VLLM_CUDA_GRAPHS_BYTES
    kv = budget - weights - acts - graphs
    per_seq = float(shape.kv_bytes_per_token(dtype_bytes, tp) * seq)
    return RolloutMemory(budget, weights, acts, graphs, kv, per_seq, max(0, int(kv // per_seq)))


def gpu_peak(phase_working: float, others_resident: float) -> float:
    """A torch phase's GPU peak: context + (its working set + what other roles keep) x allocator margin."""
    return CUDA_CONTEXT_BYTES + (phase_working + others_resident) * (1 + ALLOCATOR_MARGIN)


def rollout_peak(budget: float, others_resident: float) -> float:
    """vLLM wakes into util x total; whatever other roles keep resident must fit beside it."""
    return CUDA_CONTEXT_BYTES + budget + others_resident * (1 + ALLOCATOR_MARGIN)
