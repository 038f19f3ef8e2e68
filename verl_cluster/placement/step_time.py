"""Seconds per verl step, by phase, for a placed candidate. Formulas and the fit: docs/placement.md, "Step time".

Every phase is a fixed cost plus work over a rate:
- generate: each decode step reads the weights (÷ TP) and the KV cache of the batch it decodes (on average: the
  batch drains as responses end) over the GPU's HBM bandwidth, plus a per-step cost without CUDA graphs;
  continuous batching takes as many steps as the longest response; each generated token costs vLLM's and the
  agent loop's per-token work (sampling, detokenizing, streaming); a step is bound by its reads or, with hundreds
  of sequences, by its 2·N FLOPs per sequence; the prompts' prefill is 2·N·tokens FLOPs; verl's
  trainer sees the end at its next poll of the rollout (every 2 s: half a period on average);
- old log-prob, ref, critic values: a forward, 2·N FLOPs per token computed (every padded token without
  use_remove_padding), and the log-probs' logits over the real tokens; the actor's log-prob also computes the
  entropy over every logit computed (verl asks it there, not of the ref);
- the ref (verl's forward-only engine forces CPUOffload): its fp32 params stay pinned on the host and every micro
  batch's forward copies them to the GPU (never back), on FSDP's unshard stream beside the compute: only what the
  copy takes beyond the forward's FLOPs shows;
- actor/critic update: 6·N per token (+2·N recompute with gradient checkpointing) x ppo_epochs;
- FSDP (more than one GPU): per micro batch an all-gather of the params for the forward and one for the backward and
  an fp32 reduce-scatter of the grads, (N-1)/N of the bytes over the link's bus bandwidth (the GPU catalog's, or
  the NCCL figure `check` measured on the cluster: Hardware.measured_bus_gbs);
- the critic's values: its forward plus a per-token cost (measured: the 0.5B and 1.5B critics alike, ~6 us);
- advantages: a fixed cost, a cost per sequence, and with GAE verl's Python loop over the response positions;
- offload: params (and Adam states) over the host link (the catalog's pinned-copy rate, measured on the H100) to
  the GPU and back each phase, update_weights included (verl loads offloaded params to hand them to vLLM);
- weight sync to the rollout (update_weights): the params in the rollout dtype over HBM and the link;
- checkpoint save: fp32 params + Adam per GPU to storage, every save_freq steps (shown apart from the step).
Compute runs at one share of the GPU's peak dense bf16 FLOPs (held, not fitted); the fixed costs and the logits'
bytes differ with flash-attn importable or not (verl then computes log-probs without flash-attn's fused
cross-entropy: much slower on a 150k vocab).
Each phase is built as terms (constant name -> coefficient, "" for seconds from bytes and links), so the fixed
costs and the per-step/token/sequence costs are fitted by scripts/fit_plan_calibration.py, a least-squares fit
on the recorded verl 0.9.1 runs on one H100 (0.5B to 3B, where the fixed costs weigh most): a calibration, not a
law.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
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
    pcie_gbs: float = 25.0  # host <-> GPU copies from pinned buffers, GB/s: what PCIe 4.0 x16 reaches


# Vendor datasheet figures; link: NVLink boards at what NCCL reaches (328 GB/s all_reduce busbw measured on 2x H200,
# DESIGN.md), PCIe cards at a PCIe 4.0 x16 figure; host <-> GPU: PCIe 5.0 hosts (Hopper, Blackwell) at the 55.1 GB/s
# a pinned 2 GiB copy reached on the H100 host (scripts/gpu_pcie_copy.py, docs/BENCHMARKS.md), PCIe 3.0 cards ~12.
# Matched by the first name fragment found in the GPU's name.
GPU_SPEEDS: tuple[tuple[str, GpuSpeed], ...] = (
    ("GB200", GpuSpeed(2500, 8000, 700, 55)), ("B200", GpuSpeed(2250, 8000, 700, 55)),
    ("H200", GpuSpeed(989, 4800, 330, 55)), ("H100 NVL", GpuSpeed(835, 3900, 300, 55)),
    ("H100 PCIe", GpuSpeed(756, 2000, 20, 55)), ("H100", GpuSpeed(989, 3350, 330, 55)),
    ("H800", GpuSpeed(989, 3350, 150, 55)), ("H20", GpuSpeed(148, 4000, 330, 55)),
    ("A100-SXM4-40GB", GpuSpeed(312, 1555, 230)), ("A100", GpuSpeed(312, 2039, 230)),
    ("A800", GpuSpeed(312, 2039, 150)), ("L40S", GpuSpeed(362, 864, 20)), ("L40", GpuSpeed(181, 864, 20)),
    ("L20", GpuSpeed(119, 864, 20)), ("L4", GpuSpeed(121, 300, 20)), ("A10", GpuSpeed(125, 600, 20)),
    ("RTX 4090", GpuSpeed(165, 1008, 20)), ("RTX 3090", GpuSpeed(71, 936, 20)), ("A6000", GpuSpeed(155, 768, 20)),
    ("V100", GpuSpeed(125, 900, 130, 12)), ("T4", GpuSpeed(65, 320, 10, 12)), ("P40", GpuSpeed(12, 346, 10, 12)),
)
UNKNOWN_GPU = GpuSpeed(312, 2039, 20)  # an A100-class card over PCIe
INTER_NODE_GBS = 12.5  # per GPU, 100 Gb/s; on a live cluster `check` measures the real figure

# Fitted by scripts/fit_plan_calibration.py on the runs tagged time "fit" in
# tests/fixtures/verl_runs/calibration_runs.json (docs/BENCHMARKS.md, "Step time"). "flash": flash-attn importable;
# "no_flash": not (two runs only: the GRPO 0.5B and tiny of 2026-11-24/25).
FORWARD_FIXED_S = {"flash": 0.123, "no_flash": 0.802}
UPDATE_FIXED_S = {"flash": 0.789, "no_flash": 3.05}
# Held, not fitted: of the GPU's peak dense FLOPs, forward and backward alike (vLLM's prefill too). The fit runs
# cannot tell it: even on the two 3B runs the update's FLOPs are a fifth of it at this share, and left free the fit
# trades it for fixed costs (0.90 of peak, not credible); verl's own perf/mfu/actor reached 0.23 on the 1.5B run
# with its fixed costs; 0.4 is a usual FSDP bf16 figure for 7B-class models. A 7B+ run on more GPUs would pin it.
COMPUTE_SHARE = 0.4
# per real token per vocab entry, at HBM speed: the log-probs (without flash-attn verl's log-softmax loops per token)
LOGIT_FORWARD_BYTES = {"flash": 180, "no_flash": 1280}
ENTROPY_BYTES = 16.1  # per token per vocab entry computed: the entropy, in the actor's log-prob only
LOGIT_UPDATE_BYTES = {"flash": 110, "no_flash": 1300}
GENERATE_FIXED_S = 0.597  # per generate: request fan-out, vLLM wake-up and sleep
EAGER_STEP_S = 0.00398  # per decode step with enforce_eager (no CUDA graphs; the tiny run alone); with graphs a
# step costs its reads only (a per-step constant fitted to 0)
DECODE_TOKEN_S = 6.74e-05  # per generated token: sampling, detokenizing, streaming to the agent loop
SYNC_FIXED_S = 0.308  # update_weights: resharding and handing the weights to vLLM
ADV_S = 0.0273  # advantages, rewards (rule-based)
ADV_SEQ_S = 0.000619  # per sequence of the batch
GAE_STEP_S = 0.000133  # per response position: GAE's loop (PPO)
# per token in the critic's values pass, beyond its FLOPs: the 0.5B and 1.5B critics took the same ~7 us a token
VALUE_TOKEN_S = 6.24e-06
# not fitted
GEN_POLL_S = 2.0  # every recorded timing_s/gen is a multiple of 2.0 s (+0.05-0.1 s): verl polls the rollout
HBM_SHARE = 0.7  # of the HBM bandwidth a decode step's reads reach (not separable on the small runs)
REF_PARAM_BYTES = 4  # verl's ref model_dtype (fp32 by default), what its forced CPUOffload keeps on the host
SAVE_GBS = 0.55  # checkpoint write rate (fp32 params + Adam per GPU, torch.save to local disk)
Terms = dict[str, float]  # constant name (NAME or NAME:key, "1/NAME:key" for a share) -> coefficient; "" -> seconds


def const(name: str) -> float:
    """The value a term's coefficient multiplies: "" -> 1, "NAME:key" -> NAME[key], "1/NAME:key" -> 1 / NAME[key]."""
    if not name:
        return 1.0
    inv = name.startswith("1/")
    base, _, key = (name[2:] if inv else name).partition(":")
    v = globals()[base]
    v = v[key] if key else v
    return 1.0 / v if inv else v


def seconds(terms: Terms) -> float:
    return sum(coef * const(name) for name, coef in terms.items())


def add(*parts: Terms) -> Terms:
    out: Terms = {}
    for p in parts:
        for k, v in p.items():
            out[k] = out.get(k, 0.0) + v
    return out


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
    terms: dict[str, Terms] = field(default_factory=dict)  # phase -> terms (what the fit regresses on)

    def to_dict(self) -> dict:
        return {"step_s": round(self.step_s, 2), "phases_s": {k: round(v, 2) for k, v in self.phases.items()},
                "save_checkpoint_s": round(self.save_s, 2), "tokens_per_gpu_s": round(self.tokens_per_gpu_s, 1),
                "notes": list(self.notes)}


def forward_terms(params: float, tokens: float, tflops: float, kind: str, logit_reads: float = 0.0) -> Terms:
    """logit_reads: tokens x vocab over the HBM bandwidth (seconds per byte of logits per vocab entry)."""
    return {f"FORWARD_FIXED_S:{kind}": 1.0, "1/COMPUTE_SHARE": 2.0 * params * tokens / (tflops * 1e12),
            f"LOGIT_FORWARD_BYTES:{kind}": logit_reads}


def update_terms(params: float, tokens: float, tflops: float, kind: str, recompute: bool, epochs: int = 1,
                 logit_reads: float = 0.0) -> Terms:
    flops = (6.0 + (2.0 if recompute else 0.0)) * params * tokens * epochs
    return {f"UPDATE_FIXED_S:{kind}": 1.0, "1/COMPUTE_SHARE": flops / (tflops * 1e12),
            f"LOGIT_UPDATE_BYTES:{kind}": logit_reads * epochs}


def decode_read_s(weight_bytes: float, kv_bytes: float, hbm_gbs: float) -> float:
    """One decode step's reads (weights and the KV cache in flight) over the HBM bandwidth reached."""
    return (weight_bytes + kv_bytes) / (hbm_gbs * 1e9 * HBM_SHARE)


def ref_upload_s(params: float, micros: int, n: int, compute_s: float, pcie_gbs: float) -> float:
    """The ref's params copied host -> GPU once per micro batch (each GPU its 1/n shard), less the forward's compute
    they overlap with."""
    up = micros * REF_PARAM_BYTES * params / n / (pcie_gbs * 1e9)
    return max(0.0, up - compute_s)


def fsdp_comm_s(params: float, c: int, n: int, micros: int, bus_gbs: float, recompute: bool = True) -> float:
    """Per update: per micro batch the params gathered for forward and backward, fp32 grads reduce-scattered."""
    if n <= 1:
        return 0.0
    gathered = (2 if recompute else 1) * c * params
    return micros * (gathered + 4.0 * params) * (n - 1) / n / (bus_gbs * 1e9)


def measured(hw: "Hardware", n: int) -> bool:
    """Whether `check`'s measurement covers an n-GPU group: one node's GPUs or a group across nodes."""
    scope = "network" if n > hw.gpus_per_node else "node"
    return bool(hw.measured_bus_gbs) and hw.measured_bus_scope == scope


def link_gbs(hw: "Hardware", n: int, sp: GpuSpeed) -> float:
    """The bus bandwidth an n-GPU group reaches: within a node its link, across nodes the network; `check`'s
    measurement where it covers the group."""
    if measured(hw, n):
        return hw.measured_bus_gbs
    return INTER_NODE_GBS if n > hw.gpus_per_node else sp.link_gbs


def bus_note(hw: "Hardware", n: int, sp: GpuSpeed, gpu_name: str = "") -> str:
    """Which bus bandwidth the FSDP traffic of an n-GPU group is charged at, and where it comes from."""
    gbs = link_gbs(hw, n, sp)
    if measured(hw, n):
        return f"FSDP traffic over {gbs:.1f} GB/s, {hw.measured_bus_note}"
    if n > hw.gpus_per_node:
        return (f"FSDP traffic over an assumed {gbs:g} GB/s per GPU across nodes: run `verl-cluster check` on the "
                "live cluster to measure")
    return f"FSDP traffic over {gbs:g} GB/s within a node, the GPU catalog's figure for {gpu_name or hw.gpu_name}"


def step_time(c: "Candidate", s: "Settings", shape: "ModelShape", hw: "Hardware", fill: float = 1.0,
              gpu_name: Optional[str] = None) -> StepTime:
    sp, known = gpu_speed(gpu_name or hw.gpu_name)
    notes = [] if known else [f"{gpu_name or hw.gpu_name}: speed unknown, assumed an A100-class card over PCIe"]
    main = c.pools[0]
    n = main.size
    packed = c.prec.remove_padding and s.remove_padding_actor and c.prec.attn.startswith("flash")
    kind = "no_flash" if hw.flash_attn is False else "flash"
    per_seq = s.seq_len * fill if packed else s.seq_len
    real_per_seq = s.seq_len * fill
    seqs_gpu = s.sequences / n
    tokens_gpu = seqs_gpu * per_seq
    cb = c.prec.c
    terms: dict[str, Terms] = {}
    # generate
    replicas = max(1, n // c.tp)
    seqs_rep = s.sequences / replicas
    fit = c.rollout.seqs_fit if c.rollout is not None else s.max_num_seqs
    inflight = max(1, min(s.max_num_seqs, fit if fit >= 1 else 1, math.ceil(seqs_rep)))
    # continuous batching: as long as the longest response, or the tokens to decode over the sequences in flight
    generated = seqs_rep * s.response_len * fill
    steps = max(s.response_len, generated / inflight)
    kv_tok = shape.kv_bytes_per_token(cb, c.tp)
    ctx = s.prompt_len * fill + s.response_len * fill / 2  # mean context while decoding
    batch = generated / steps  # the sequences a step decodes, on average (the batch drains as responses end)
    # a decode step is bound by its reads or by its FLOPs (2·N per sequence), whichever is longer (the share is held)
    read = max(decode_read_s(shape.params * cb / c.tp, batch * ctx * kv_tok, sp.hbm_gbs),
               2.0 * shape.params * batch / c.tp / (sp.tflops * 1e12 * COMPUTE_SHARE))
    if c.tp > 1:  # two all-reduces of the hidden state per layer per step, latency-bound
        read += 2 * shape.layers * 15e-6
    terms["gen"] = {"GENERATE_FIXED_S": 1.0, "EAGER_STEP_S": steps if s.enforce_eager else 0.0,
                    "DECODE_TOKEN_S": generated, "1/COMPUTE_SHARE": 2.0 * shape.params * seqs_rep * s.prompt_len
                    * fill / c.tp / (sp.tflops * 1e12), "": steps * read + GEN_POLL_S / 2}
    bus = link_gbs(hw, n, sp)
    if n > 1:
        notes.append(bus_note(hw, n, sp, gpu_name or hw.gpu_name))
    pcie = sp.pcie_gbs * 1e9
    from verl_cluster.placement.planner import OFFLOAD_LEVELS, Phase

    param_off, opt_off = OFFLOAD_LEVELS[c.offload]

    def micros(phase: Phase) -> int:
        m = c.micro(phase)
        return max(1, math.ceil(seqs_gpu / m)) if m else max(1, math.ceil(tokens_gpu / s.actor_max_tokens))

    def offload_s(params: float, m: int, updates: bool) -> float:
        moved = (m * params / n if param_off else 0.0) + (8.0 * params / n if opt_off and updates else 0.0)
        return 2.0 * moved / pcie

    def comm_s(params: float, phase: Phase, recompute: bool, forward: bool) -> float:
        """FSDP traffic of a phase: a forward moves a third of an update's (one gather, no reduce-scatter)."""
        got = fsdp_comm_s(params, cb, n, micros(phase), bus, recompute)
        return got / 3 if forward else got

    actor_p = shape.params
    m_a = s.master_dtype_bytes_actor
    # the actor's logits (tokens x vocab): log-softmax, entropy and their backward read them several times; without
    # use_remove_padding verl takes the log-probs of the real tokens only, the entropy of every position computed
    logits = tokens_gpu * shape.vocab / (sp.hbm_gbs * 1e9)
    real_logits = seqs_gpu * real_per_seq * shape.vocab / (sp.hbm_gbs * 1e9)
    fwd = forward_terms(actor_p, tokens_gpu, sp.tflops, kind, real_logits)
    terms["old_log_prob"] = add(fwd, {"ENTROPY_BYTES": logits, "": comm_s(actor_p, Phase.ACTOR_LOG_PROB, False, True)
                                      + offload_s(actor_p, m_a, False)})
    if s.ref and not s.lora_rank:
        up = ref_upload_s(actor_p, micros(Phase.REF_LOG_PROB), n, fwd["1/COMPUTE_SHARE"] / COMPUTE_SHARE,
                          sp.pcie_gbs)
        terms["ref"] = add(fwd, {"": up + comm_s(actor_p, Phase.REF_LOG_PROB, False, True)})
    elif s.ref:  # LoRA: the actor with its adapters off, no entropy, nothing on the host
        terms["ref"] = dict(fwd)
    if s.critic:
        cp, m_c = shape.value_model_params, s.master_dtype_bytes_critic
        terms["values"] = add(forward_terms(cp, tokens_gpu, sp.tflops, kind),
                              {"VALUE_TOKEN_S": tokens_gpu, "": offload_s(cp, m_c, False)})
        terms["update_critic"] = add(update_terms(cp, tokens_gpu, sp.tflops, kind, s.grad_ckpt_critic),
                                     {"": comm_s(cp, Phase.CRITIC_UPDATE, s.grad_ckpt_critic, False)
                                      + offload_s(cp, m_c, True)})
    # on the driver, for the whole batch: GAE loops over the response positions (compute_gae_advantage_return),
    # GRPO's grouping and the batch's bookkeeping over the sequences, in Python
    terms["adv"] = {"ADV_S": 1.0, "ADV_SEQ_S": s.sequences,
                    "GAE_STEP_S": s.response_len if s.adv_estimator == "gae" else 0.0}
    terms["update_actor"] = add(update_terms(actor_p, tokens_gpu, sp.tflops, kind, s.grad_ckpt_actor,
                                             logit_reads=logits),
                                {"": comm_s(actor_p, Phase.ACTOR_UPDATE, s.grad_ckpt_actor, False)
                                 + offload_s(actor_p, m_a, True)})
    # with param offload verl loads the params to the GPU to hand them over, and offloads them again
    terms["update_weights"] = {"SYNC_FIXED_S": 1.0, "": cb * actor_p / (sp.hbm_gbs * 1e9 * HBM_SHARE)
                               + (cb * actor_p * (n - 1) / n / (bus * 1e9) if n > 1 else 0.0)
                               + offload_s(actor_p, m_a, False)}
    phases = {k: seconds(v) for k, v in terms.items()}
    trained = actor_p + (shape.value_model_params if s.critic else 0)
    save = 12.0 * trained / n / (SAVE_GBS * 1e9) if s.save_freq > 0 else 0.0
    total = sum(phases.values())
    tps = s.sequences * real_per_seq / n / total if total > 0 else 0.0
    return StepTime(phases, total, save, tps, tuple(notes), terms)
