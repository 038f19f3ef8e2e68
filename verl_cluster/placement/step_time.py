"""Seconds per verl step, by phase, for a placed candidate. Formulas and the fit: docs/placement.md, "Step time".

Every phase is a fixed cost plus work over a rate:
- generate: decode is memory-bound: each decode step reads the weights (÷ TP) and the KV cache of the sequences in
  flight, over the GPU's HBM bandwidth, plus a per-step cost (scheduling, sampling, launches); continuous batching
  takes as many steps as the longest response, or the tokens to decode over the sequences the KV cache and
  max_num_seqs let fly, whichever is more; the prompts' prefill is 2·N·tokens FLOPs;
- old log-prob, ref, critic values: a forward, 2·N FLOPs per token computed (every padded token without
  use_remove_padding);
- actor/critic update: 6·N per token (+2·N recompute with gradient checkpointing) x ppo_epochs;
- FSDP (more than one GPU): per micro batch an all-gather of the params for the forward and one for the backward and
  an fp32 reduce-scatter of the grads, (N-1)/N of the bytes over the link's bus bandwidth;
- offload: params (and Adam states) over PCIe to the GPU and back each phase;
- weight sync to the rollout (update_weights): the params in the rollout dtype over HBM and the link;
- checkpoint save: fp32 params + Adam per GPU to storage, every save_freq steps (shown apart from the step).
Compute runs at a share of the GPU's peak dense bf16 FLOPs; the shares and fixed costs are fitted on verl 0.9.1 runs
on one H100 (all were small models, where the fixed costs dominate): they are a calibration, not a law.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional

if TYPE_CHECKING:
    from verl_cluster.placement.hardware import Hardware
    from verl_cluster.placement.model_shape import ModelShape
    from verl_cluster.placement.planner import Candidate
    from verl_cluster.placement.settings import Settings


@dataclass(frozen=True)
class GpuSpeed:
    tflops: float  # dense bf16 (fp16 where no bf16), vendor figure
    hbm_gbs: float  # memory bandwidth, GB/s
    link_gbs: float  # NCCL bus bandwidth between GPUs of one node, GB/s (NVLink boards; PCIe cards ~20)


# Vendor datasheet figures; link: NVLink boards at what NCCL reaches (328 GB/s all_reduce busbw measured on 2x H200,
# DESIGN.md), PCIe cards at a PCIe 4.0 x16 figure. Matched by the first name fragment found in the GPU's name.
GPU_SPEEDS: tuple[tuple[str, GpuSpeed], ...] = (
    ("GB200", GpuSpeed(2500, 8000, 700)), ("B200", GpuSpeed(2250, 8000, 700)),
    ("H200", GpuSpeed(989, 4800, 330)), ("H100 NVL", GpuSpeed(835, 3900, 300)),
    ("H100 PCIe", GpuSpeed(756, 2000, 20)), ("H100", GpuSpeed(989, 3350, 330)), ("H800", GpuSpeed(989, 3350, 150)),
    ("H20", GpuSpeed(148, 4000, 330)), ("A100-SXM4-40GB", GpuSpeed(312, 1555, 230)), ("A100", GpuSpeed(312, 2039, 230)),
    ("A800", GpuSpeed(312, 2039, 150)), ("L40S", GpuSpeed(362, 864, 20)), ("L40", GpuSpeed(181, 864, 20)),
    ("L20", GpuSpeed(119, 864, 20)), ("L4", GpuSpeed(121, 300, 20)), ("A10", GpuSpeed(125, 600, 20)),
    ("RTX 4090", GpuSpeed(165, 1008, 20)), ("RTX 3090", GpuSpeed(71, 936, 20)), ("A6000", GpuSpeed(155, 768, 20)),
    ("V100", GpuSpeed(125, 900, 130)), ("T4", GpuSpeed(65, 320, 10)), ("P40", GpuSpeed(12, 346, 10)),
)
UNKNOWN_GPU = GpuSpeed(312, 2039, 20)  # an A100-class card over PCIe
INTER_NODE_GBS = 12.5  # per GPU, 100 Gb/s; `check` measures the real figure on a live cluster
PCIE_GBS = 20.0  # host <-> GPU, pinned buffers, PCIe 4.0 x16 in practice

# Fitted on the recorded H100 runs (docs/BENCHMARKS.md, "Step time"): fixed seconds per phase and compute shares
# of peak. "padded": no use_remove_padding or no flash-attn (every sequence padded to the maximum, SDPA with a mask);
# "packed": flash-attn with use_remove_padding.
FORWARD_FIXED_S = {"padded": 0.8, "packed": 0.25}
UPDATE_FIXED_S = {"padded": 3.0, "packed": 0.8}
FORWARD_SHARE = {"padded": 0.044, "packed": 0.07}
UPDATE_SHARE = {"padded": 0.058, "packed": 0.23}
DECODE_STEP_S = 0.0075  # per decode step beyond its bytes: vLLM's scheduler, sampling, launches
HBM_SHARE = 0.7  # of the HBM bandwidth a decode step's reads reach (not measurable on the small runs)
SAMPLER_BYTES = 40  # per sequence in flight per vocab entry per decode step (fp32 logits, softmax, sampling passes)
GENERATE_FIXED_S = 0.2
SYNC_FIXED_S = 0.5  # update_weights: resharding and handing the weights to vLLM
ADV_S = 0.15  # advantages, rewards (rule-based)
SAVE_GBS = 0.55  # checkpoint write rate (fp32 params + Adam per GPU, torch.save to local disk)


def gpu_speed(name: str) -> tuple[GpuSpeed, bool]:
    """(speed, known) for a GPU name as NVML or the catalog spells it."""
    for frag, sp in GPU_SPEEDS:
        if frag.lower() in name.lower():
            return sp, True
    return UNKNOWN_GPU, False


@dataclass(frozen=True)
class StepTime:
    phases: dict[str, float]  # phase -> seconds per step (verl's timing_s names)
    step_s: float  # sum of the phases (no checkpoint save, no validation)
    save_s: float  # one checkpoint save (0: save_freq off)
    tokens_per_gpu_s: float  # real tokens (prompt + response) per GPU per second
    notes: tuple[str, ...] = ()

    def to_dict(self) -> dict:
        return {"step_s": round(self.step_s, 2), "phases_s": {k: round(v, 2) for k, v in self.phases.items()},
                "save_checkpoint_s": round(self.save_s, 2), "tokens_per_gpu_s": round(self.tokens_per_gpu_s, 1),
                "notes": list(self.notes)}


def forward_s(params: float, tokens: float, tflops: float, kind: str) -> float:
    return FORWARD_FIXED_S[kind] + 2.0 * params * tokens / (tflops * 1e12 * FORWARD_SHARE[kind])


def update_s(params: float, tokens: float, tflops: float, kind: str, recompute: bool, epochs: int = 1) -> float:
    flops = (6.0 + (2.0 if recompute else 0.0)) * params * tokens * epochs
    return UPDATE_FIXED_S[kind] + flops / (tflops * 1e12 * UPDATE_SHARE[kind])


def decode_step_s(weight_bytes: float, kv_bytes: float, seqs: float, vocab: int, hbm_gbs: float) -> float:
    read = weight_bytes + kv_bytes + seqs * vocab * SAMPLER_BYTES
    return DECODE_STEP_S + read / (hbm_gbs * 1e9 * HBM_SHARE)


def fsdp_comm_s(params: float, c: int, n: int, micros: int, bus_gbs: float, recompute: bool = True) -> float:
    """Per update: per micro batch the params gathered for forward and backward, fp32 grads reduce-scattered."""
    if n <= 1:
        return 0.0
    gathered = (2 if recompute else 1) * c * params
    return micros * (gathered + 4.0 * params) * (n - 1) / n / (bus_gbs * 1e9)


def link_gbs(hw: "Hardware", n: int, sp: GpuSpeed) -> float:
    """The bus bandwidth an n-GPU group reaches: within a node its link, across nodes the network."""
    if n > hw.gpus_per_node:
        return INTER_NODE_GBS
    return sp.link_gbs


def step_time(c: "Candidate", s: "Settings", shape: "ModelShape", hw: "Hardware", fill: float = 1.0,
              gpu_name: Optional[str] = None) -> StepTime:
    sp, known = gpu_speed(gpu_name or hw.gpu_name)
    notes = [] if known else [f"{gpu_name or hw.gpu_name}: speed unknown, assumed an A100-class card over PCIe"]
    main = c.pools[0]
    n = main.size
    packed = c.prec.remove_padding and s.remove_padding_actor and c.prec.attn.startswith("flash")
    kind = "packed" if packed else "padded"
    per_seq = s.seq_len if kind == "padded" else s.seq_len * fill
    real_per_seq = s.seq_len * fill
    seqs_gpu = s.sequences / n
    tokens_gpu = seqs_gpu * per_seq
    cb = c.prec.c
    phases: dict[str, float] = {}
    # generate
    replicas = max(1, n // c.tp)
    seqs_rep = s.sequences / replicas
    fit = c.rollout.seqs_fit if c.rollout is not None else s.max_num_seqs
    inflight = max(1, min(s.max_num_seqs, fit if fit >= 1 else 1, math.ceil(seqs_rep)))
    # continuous batching: as long as the longest response, or the tokens to decode over the sequences in flight
    steps = max(s.response_len, seqs_rep * s.response_len * fill / inflight)
    kv_tok = shape.kv_bytes_per_token(cb, c.tp)
    ctx = s.prompt_len * fill + s.response_len * fill / 2  # mean context while decoding
    step = decode_step_s(shape.params * cb / c.tp, inflight * ctx * kv_tok, inflight, shape.vocab, sp.hbm_gbs)
    if c.tp > 1:  # two all-reduces of the hidden state per layer per step, latency-bound
        step += 2 * shape.layers * 15e-6
    prefill = 2.0 * shape.params * seqs_rep * s.prompt_len * fill / c.tp / (sp.tflops * 1e12 * FORWARD_SHARE["packed"])
    phases["gen"] = GENERATE_FIXED_S + steps * step + prefill
    bus = link_gbs(hw, n, sp)
    pcie = PCIE_GBS * 1e9
    from verl_cluster.placement.planner import OFFLOAD_LEVELS, Phase

    param_off, opt_off = OFFLOAD_LEVELS[c.offload]

    def micros(phase: Phase) -> int:
        m = c.micro(phase)
        return max(1, math.ceil(seqs_gpu / m)) if m else max(1, math.ceil(tokens_gpu / s.actor_max_tokens))

    def offload_s(params: float, m: int, updates: bool) -> float:
        moved = (m * params / n if param_off else 0.0) + (8.0 * params / n if opt_off and updates else 0.0)
        return 2.0 * moved / pcie

    actor_p = shape.params
    m_a = s.master_dtype_bytes_actor
    phases["old_log_prob"] = (forward_s(actor_p, tokens_gpu, sp.tflops, kind)
                              + fsdp_comm_s(actor_p, cb, n, micros(Phase.ACTOR_LOG_PROB), bus, recompute=False) / 3
                              + offload_s(actor_p, m_a, False))
    if s.ref and not s.lora_rank:
        phases["ref"] = (forward_s(actor_p, tokens_gpu, sp.tflops, kind) + m_a * actor_p / n / pcie
                         + fsdp_comm_s(actor_p, cb, n, micros(Phase.REF_LOG_PROB), bus, recompute=False) / 3)
    elif s.ref:
        phases["ref"] = forward_s(actor_p, tokens_gpu, sp.tflops, kind)
    if s.critic:
        cp = shape.value_model_params
        phases["values"] = forward_s(cp, tokens_gpu, sp.tflops, kind) + offload_s(cp, s.master_dtype_bytes_critic, False)
        phases["update_critic"] = (update_s(cp, tokens_gpu, sp.tflops, kind, s.grad_ckpt_critic)
                                   + fsdp_comm_s(cp, cb, n, micros(Phase.CRITIC_UPDATE), bus, s.grad_ckpt_critic)
                                   + offload_s(cp, s.master_dtype_bytes_critic, True))
    phases["adv"] = ADV_S
    phases["update_actor"] = (update_s(actor_p, tokens_gpu, sp.tflops, kind, s.grad_ckpt_actor)
                              + fsdp_comm_s(actor_p, cb, n, micros(Phase.ACTOR_UPDATE), bus, s.grad_ckpt_actor)
                              + offload_s(actor_p, m_a, True))
    phases["update_weights"] = (SYNC_FIXED_S + cb * actor_p / (sp.hbm_gbs * 1e9 * HBM_SHARE)
                                + (cb * actor_p * (n - 1) / n / (bus * 1e9) if n > 1 else 0.0))
    trained = actor_p + (shape.value_model_params if s.critic else 0)
    save = 12.0 * trained / n / (SAVE_GBS * 1e9) if s.save_freq > 0 else 0.0
    total = sum(phases.values())
    tps = s.sequences * real_per_seq / n / total if total > 0 else 0.0
    return StepTime(phases, total, save, tps, tuple(notes))
