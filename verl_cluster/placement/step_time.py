"""Seconds per verl step, by phase, for a placed candidate. Formulas, where each term comes from in verl 0.9.1 and
torch, and the fit: docs/placement.md, "Step time".

Every phase is a fixed cost plus work over a rate:
- generate: each decode step reads the weights (÷ TP) and the KV cache of the batch it decodes (on average: the
  batch drains as responses end) over the GPU's HBM bandwidth, or computes 2·N FLOPs a sequence, whichever is
  longer; continuous batching takes as many steps as the longest response; each generated token costs vLLM's and
  the agent loop's per-token work; the prompts' prefill is 2·N·tokens FLOPs; with enforce_eager (no CUDA graphs)
  every step costs a fixed part and a part per layer (its kernels launched from Python); verl's trainer sees the
  end at its next poll of the replay buffer (at once, then every 2 s: whole periods, polls()), then puts vLLM to
  sleep;
- forward phases (old log-prob, ref, critic values) and updates: per micro batch a pass through the layers with a
  floor per layer (FSDP's hooks around each unit, the layer's kernels, verl's syncs per micro batch; a forward
  layer's held at the device's, packed and padded apart), 2·N FLOPs a token computed forward and 6·N (+2·N
  recompute with gradient checkpointing) in an update; tokens computed are the real ones with use_remove_padding,
  else each micro batch padded to its longest sequence; verl's work per real token in every forward pass; without
  flash-attn verl's log-probs loop over the real tokens in Python; the actor's log-prob computes
  the entropy over every logit computed (compiled when packed, the plain function when padded); a micro batch
  takes the longer of the host's work (the layers' launches, the LM head's per-micro-batch cost and loop) and the
  GPU's (FLOPs, bytes, exposed collectives), on 2+ ranks with the LM head's host work serial (bound, overlapped);
  an update's fixed part is one rank's (NO_SHARD) or a sharded one's, fitted apart; verl 0.9's critic packs its
  micro batches by tokens (each mini batch on its own), whatever its micro batch setting;
- the ref (verl's forward-only engine forces CPUOffload): each micro batch copies the fp32 shard to the GPU beside
  the compute: only what the copy takes beyond the layers' FLOPs shows;
- FSDP1 (more than one GPU): per micro batch each layer's params gathered for the forward and again for the
  backward, the root unit once, every gradient reduce-scattered in fp32; a forward gathers each layer once; (n-1)/n
  of the bytes over the link's bus bandwidth (the catalog's, or `check`'s NCCL figure), on their own stream beside
  the layers: only what they take beyond the layers' FLOPs shows;
- update_weights: the weights handed to vLLM over HBM; across ranks FSDP1's sharded state dict and verl's
  full_tensor() gather every param twice in fp32, plus a fixed cost of the ranks; offloaded params loaded and back;
- advantages: a fixed cost, a cost per sequence, and with GAE verl's Python loop over the response positions;
- offload: params (and Adam states) over the host link (the catalog's pinned-copy rate) each phase;
- checkpoint save: fp32 params + Adam per GPU to storage, every save_freq steps (shown apart from the step).
The GPU enters through the catalog's FLOPs, HBM and link figures only: fixed, per-pass and per-token costs are the
host's (Python, kernel launches; HOST_TERMS), fitted on the recorded runs' hosts, and a host runs them at its own
speed (machines of one GPU kind ~1.4x apart: the error bar carries it, envelope.with_host).
Each phase is built as terms (constant name -> coefficient, "" for seconds from bytes and links), so the fixed
costs and the per-step/token/pass costs are fitted by scripts/calibration/fit_plan_calibration.py (least squares on the runs
tagged fit; the micro-batched phases by their relative errors under the max): a calibration, not a law.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Optional

from verl_cluster.placement.envelope import ErrorBar, error_bar, fastest_host, job_axes, with_range

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
# a pinned 2 GiB copy reached on the H100 host (scripts/gpu/gpu_pcie_copy.py, docs/BENCHMARKS.md), PCIe 3.0 cards ~12.
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

# Fitted by scripts/calibration/fit_plan_calibration.py on the runs tagged time "fit" in tests/fixtures/verl_runs/
# calibration_runs.json (one H100), multi_gpu_runs.json and grid2_runs.json (docs/BENCHMARKS.md, "Step time").
FORWARD_FIXED_S = 0.147  # per forward phase (log-prob, ref, values): dispatch to the workers, the batch to the GPU
UPDATE_FIXED_S = 0.61  # per update phase on one rank (FSDP1 NO_SHARD): clip and optimizer steps, the gathers
# the same on more ranks (FULL_SHARD), fitted on its own: the 2-GPU update at one micro batch a mini batch
# (g2fa-m32, 0.83 s for 2 micro batches) leaves no room for one rank's fixed part
UPDATE_FIXED_RANKS_S = 0.346
# Per micro batch per layer, forward: the host's launches of a layer's kernels (and FSDP's unit hooks). Held, not
# fitted: measured on an H100 host (scripts/gpu/gpu_logprob_tail.py, tests/fixtures/gpu/logprob_tail_h100.jsonl, the
# same at 1,341 and 10,861 tokens). Packed, transformers rebuilds the packing from position_ids in every attention
# layer, 5 syncs a layer the host waits on: 2.0 ms a layer. Padded (SDPA) nothing syncs: the launches alone, as the
# packed pass measured them with flash-attn's varlen arguments given (no syncs either): 1.6 ms. Fitted free, the
# split goes to the fit's per-micro-batch term (FORWARD_LM_MICRO_S), which the layers' count on the grid's shapes
# (24-36) cannot tell from it; held, that term comes to verl's own ~60 ms a micro batch the device run left over.
# The same pass at 28 and 36 layers (logprob_tail_h100_shapes.jsonl) took no longer than at 24 where the host binds:
# the floor is a micro batch's, and per layer it stands in for what depth costs through the GPU's layers under verl's
# serial work (docs/placement.md, "The fourth refit": that form tried, the one-H100 grid's held-out runs against it).
FORWARD_PASS_S = 0.0016
FORWARD_SYNC_PASS_S = 0.002
UPDATE_PASS_S = 0.013  # per micro batch per layer in an update (forward, recompute, backward)
UPDATE_LM_MICRO_S = 0.056  # per micro batch of an update through the LM head (the actor's): the host's part
FORWARD_LM_MICRO_S = 0.0509  # per micro batch of a log-prob pass (the LM head's; not the critic's values): the host's
# Held, not fitted: of the GPU's peak dense FLOPs, forward and backward alike (vLLM's prefill too). The fit runs
# cannot tell it: even on the two 3B runs the update's FLOPs are a fifth of it at this share, and left free the fit
# trades it for fixed costs (0.90 of peak, not credible); verl's own perf/mfu/actor reached 0.23 on the 1.5B run
# with its fixed costs; 0.4 is a usual FSDP bf16 figure for 7B-class models. A 7B+ run on more GPUs would pin it.
COMPUTE_SHARE = 0.4
# per real token per vocab entry, at HBM speed: the log-probs' logits. Fitted to 0 since FORWARD_TOKEN_S: the
# device run's whole tail (logits, cross-entropy, compiled entropy) was 1.2 us a token on an H100, within what the
# entropy's term takes on its own; a term of its own for a run with another vocab to tell it from verl's per token
LOGIT_FORWARD_BYTES = 0.0
# per real token of every forward pass (log-probs, ref, the critic's values: one function, forward_step): verl's work
# around the model's forward. Fitted free beside the logits' bytes it went to ~7 us a token and they to 0, on H100
# and H200 runs alike, so it follows the tokens, not the HBM; the critic's own per-token term had come to the same
FORWARD_TOKEN_S = 7.39e-06
# per token per vocab entry computed: the entropy, in the actor's log-prob only; packed verl calls it compiled
# (torch.compile: one fused pass), padded the plain function (softmax, logsumexp, product, sum: a pass over the
# logits each, softmax in fp32 under autocast). The eager one held at the device run's: its tail with the eager
# entropy less the compiled tail's whole, and the eager tail's whole, bound it at 69-100 (the middle kept); the
# compiled one fitted, within that run's whole tail (26.6-31.2)
ENTROPY_BYTES = 23.8
ENTROPY_EAGER_BYTES = 83
# per token computed per vocab entry: the logits and their backward in an update. Fitted to 0 since the grid2 runs:
# the update's LM head is host-bound at these sizes, its bytes hidden under UPDATE_LM_MICRO_S
LOGIT_UPDATE_BYTES = 0.0
# without flash-attn verl's log-probs loop over the real tokens in Python (logprobs_from_logits_v2: a log_softmax
# and a gather a row): per token, the host's launches, whatever the vocab or the GPU
LOOP_FORWARD_TOKEN_S = 5.75e-05
LOOP_UPDATE_TOKEN_S = 0.00018  # the same loop and its backward (a node a row), in an update
GENERATE_FIXED_S = 0.95  # per generate: the requests' fan-out to the agent loops and their results back
# with enforce_eager (no CUDA graphs) each decode step launches its kernels from Python: a part per step (sampling,
# the step's inputs) and a part per layer; with graphs a step costs its reads only
EAGER_STEP_S = 0.00217
EAGER_LAYER_STEP_S = 0.000702
DECODE_TOKEN_S = 6.14e-05  # per generated token: sampling, detokenizing, streaming to the agent loop
SYNC_FIXED_S = 0.301  # update_weights: resharding and handing the weights to vLLM
SYNC_RANKS_S = 0.329  # with more than one rank: the ranks' exports and the barrier before the KV cache (measured)
ADV_S = 0.0283  # advantages, rewards (rule-based)
ADV_SEQ_S = 0.000616  # per sequence of the batch
GAE_STEP_S = 0.000104  # per response position: GAE's loop (PPO)
# not fitted
# verl's ReplayBuffer.poll_interval (trainer/ppo/v1/replay_buffer.py, not a config key): the trainer's `gen` checks
# for a whole batch at once, then after every sleep of it; every recorded timing_s/gen is a multiple (+0.05-0.25 s)
GEN_POLL_S = 2.0
# a step's generate time about the model's (lognormal sigma): the draw of response lengths, and how well the model
# places the generate against the period. Held: fits at 0.05 to 0.15 differ by under 0.01 in the generate's rms error
# on the fit runs; 0.1 keeps the one-H100 grid's held-out steps within ±20% (at 0.05 a generate the model puts just
# past two periods, GRPO 3B n=8, costs a third); grid2's steps alone (1 in 68 past its period) would say ~0.05
GEN_JITTER = 0.1
# after the poll that saw the batch: the replicas put to sleep (checkpoint_manager.sleep_replicas). Measured: the
# median of timing_s/gen past its whole periods over grid2's 68 steady steps (0.08-0.24 s)
GEN_SLEEP_S = 0.14
HBM_SHARE = 0.7  # of the HBM bandwidth a decode step's reads reach (not separable on the small runs)
REF_PARAM_BYTES = 4  # verl's ref model_dtype (fp32 by default), what its forced CPUOffload keeps on the host
SAVE_GBS = 0.55  # checkpoint write rate (fp32 params + Adam per GPU, torch.save to local disk)
COMM_S = 1.0  # a unit: an update's exposed collectives in seconds, on the GPU's side of bound() ("" is serial)
Terms = dict[str, float]  # constant name (NAME, "1/NAME" for a share) -> coefficient; "" -> seconds


def const(name: str) -> float:
    """The value a term's coefficient multiplies: "" -> 1, "NAME:key" -> NAME[key], "1/NAME:key" -> 1 / NAME[key]."""
    if not name:
        return 1.0
    inv = name.startswith("1/")
    base, _, key = (name[2:] if inv else name).partition(":")
    v = globals()[base]
    v = v[key] if key else v
    return 1.0 / v if inv else v


def seconds(terms: Terms, value=None) -> float:
    """The terms' seconds, each at VALUE(name) (the module's constants by default; the fit passes its own)."""
    value = value or const
    return sum(coef * value(name) for name, coef in terms.items())


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


def gpu_family(name: str) -> str:
    """The catalog's name fragment a GPU matches (H100, H200, ...), else the name itself."""
    return next((frag for frag, _ in GPU_SPEEDS if frag.lower() in name.lower()), name)


@dataclass(frozen=True)
class StepTime:
    phases: dict[str, float]  # phase -> seconds per step (verl's timing_s names)
    step_s: float  # sum of the phases (no checkpoint save, no validation)
    save_s: float  # one checkpoint save (0: save_freq off)
    tokens_per_gpu_s: float  # real tokens (prompt + response) per GPU per second
    notes: tuple[str, ...] = ()
    terms: dict[str, Terms] = field(default_factory=dict)  # phase -> terms (what the fit regresses on)
    bar: Optional[ErrorBar] = None  # the step's error bar and the job's axes (placement/envelope.py)
    # the phases' terms before bound() and polled() (at_host), over `ranks`: what by_host_factor() works from
    raw: dict[str, Terms] = field(default_factory=dict, repr=False, compare=False)
    ranks: int = 1

    def by_host_factor(self) -> list[list]:
        """[[factor, {phase: seconds}], ...] over HOST_GRID: the phases on hosts slower or faster than the fit's, so
        that a run can be told whether its host explains its miss (check_run.host_fit)."""
        return [[h, {k: round(seconds(v), 3) for k, v in (self.terms if h == 1.0 else
                                                           at_host(self.raw, self.ranks, h)).items()}]
                for h in HOST_GRID]

    def to_dict(self, host_table: bool = False) -> dict:
        """HOST_TABLE: with by_host_factor(), which only the plan's own step time needs (not its other fills, not
        each option the planner weighs)."""
        out = {"step_s": round(self.step_s, 2), "phases_s": {k: round(v, 2) for k, v in self.phases.items()},
               "save_checkpoint_s": round(self.save_s, 2), "tokens_per_gpu_s": round(self.tokens_per_gpu_s, 1),
               "notes": list(self.notes)}
        if self.bar is not None:
            out["error_bar"] = self.bar.to_dict()
            with_range(out)
        if host_table and self.raw:
            out["by_host_factor"] = self.by_host_factor()
        return out


def forward_terms(params: float, tokens: float, tflops: float, logit_reads: float = 0.0, passes: float = 0.0,
                  loop_tokens: float = 0.0, lm_micros: float = 0.0, synced: bool = False) -> Terms:
    """A forward phase. tokens: computed per GPU; logit_reads: real tokens x vocab over the HBM bandwidth; passes:
    micro batches x layers; loop_tokens: real tokens verl's log-prob loop runs over (no flash-attn); lm_micros: micro
    batches through the LM head (a log-prob pass, not the critic's values); synced: packed, its layers syncing."""
    return {"FORWARD_FIXED_S": 1.0, "FORWARD_SYNC_PASS_S" if synced else "FORWARD_PASS_S": passes,
            "1/COMPUTE_SHARE": 2.0 * params * tokens / (tflops * 1e12), "LOGIT_FORWARD_BYTES": logit_reads,
            "LOOP_FORWARD_TOKEN_S": loop_tokens, "FORWARD_LM_MICRO_S": lm_micros}


def update_terms(params: float, tokens: float, tflops: float, recompute: bool, epochs: int = 1,
                 logit_reads: float = 0.0, passes: float = 0.0, loop_tokens: float = 0.0,
                 lm_micros: float = 0.0, sharded: bool = False) -> Terms:
    """An update phase. sharded: more than one rank (FSDP1 FULL_SHARD), whose fixed part is fitted on its own
    (UPDATE_FIXED_S stays, at 0, as the key that marks an update's terms)."""
    flops = (6.0 + (2.0 if recompute else 0.0)) * params * tokens * epochs
    fixed = {"UPDATE_FIXED_S": 0.0, "UPDATE_FIXED_RANKS_S": 1.0} if sharded else {"UPDATE_FIXED_S": 1.0}
    return {**fixed, "UPDATE_PASS_S": passes * epochs, "1/COMPUTE_SHARE": flops / (tflops * 1e12),
            "LOGIT_UPDATE_BYTES": logit_reads * epochs, "LOOP_UPDATE_TOKEN_S": loop_tokens * epochs,
            "UPDATE_LM_MICRO_S": lm_micros * epochs}


# Each micro-batched phase's terms by side: the host's work (the layers' launches, then the LM head's: its cost per
# micro batch and verl's per-token loop without flash-attn) and the GPU's (FLOPs, bytes over HBM, exposed collectives)
SIDES = {"UPDATE_FIXED_S": (("UPDATE_PASS_S", "UPDATE_LM_MICRO_S", "LOOP_UPDATE_TOKEN_S"),
                            ("1/COMPUTE_SHARE", "LOGIT_UPDATE_BYTES", "COMM_S")),
         "FORWARD_FIXED_S": (("FORWARD_PASS_S", "FORWARD_SYNC_PASS_S", "FORWARD_LM_MICRO_S", "LOOP_FORWARD_TOKEN_S"),
                             ("1/COMPUTE_SHARE", "ENTROPY_EAGER_BYTES", "COMM_S"))}
# A forward pass's tail, after its last layer: the logits' passes over tokens x vocab (flash-attn's cross-entropy, the
# compiled entropy) and verl's work per token, which the host then waits on at the per-micro-batch `.item()`.
# Packed, transformers rebuilds the packing from position_ids in every attention layer (a nonzero(), a tensor's
# truth: 5 syncs a layer on the device), so the host is never a micro batch ahead to hide them under its launches: they add to
# whichever side binds (docs/placement.md, "The logits after the last sync"). Padded (SDPA, no per-layer sync) the
# host runs a micro batch ahead and they are the GPU's side, as before. Fitted with the group.
TAIL = {"UPDATE_FIXED_S": (), "FORWARD_FIXED_S": ("LOGIT_FORWARD_BYTES", "ENTROPY_BYTES", "FORWARD_TOKEN_S")}
# the layers' launches: the host terms that overlap the GPU's on more ranks too (overlapped())
LAYER_TERMS = ("UPDATE_PASS_S", "FORWARD_PASS_S", "FORWARD_SYNC_PASS_S")
# the constants that are seconds of the host's work (Python, launches, syncs): what a faster or slower host than the
# fit's moves. The rest are the GPU's (FLOPs, bytes over HBM, links), verl's poll and its spread. Batch V ran these
# ~1.4x faster on one H100 host than the fit's hosts (docs/placement.md, "Batch V"; scripts/calibration/host_factor.py)
HOST_GRID = (0.5, 0.7, 1.0, 1.4, 2.0)  # the host factors a plan keeps its phases at (StepTime.by_host_factor())
HOST_TERMS = frozenset({
    "FORWARD_FIXED_S", "UPDATE_FIXED_S", "UPDATE_FIXED_RANKS_S", "FORWARD_PASS_S", "FORWARD_SYNC_PASS_S",
    "UPDATE_PASS_S", "UPDATE_LM_MICRO_S", "FORWARD_LM_MICRO_S", "FORWARD_TOKEN_S", "LOOP_FORWARD_TOKEN_S",
    "LOOP_UPDATE_TOKEN_S", "GENERATE_FIXED_S", "EAGER_STEP_S", "EAGER_LAYER_STEP_S", "DECODE_TOKEN_S",
    "SYNC_FIXED_S", "SYNC_RANKS_S", "ADV_S", "ADV_SEQ_S", "GAE_STEP_S"})


POLLS_SPREAD = 200  # periods in the generate's spread up to which polls() sums its terms


def polls(raw_s: float, period: float = GEN_POLL_S, jitter: float = GEN_JITTER) -> float:
    """The polls verl's `gen` waits, on average, for a generate of about RAW_S seconds: it checks the replay buffer
    at once and then every PERIOD, so a generate of R seconds is seen after ceil(R / PERIOD) periods (at least one:
    the first check comes before any result); R spread lognormally by JITTER about RAW_S. E[ceil(X)] = 1 + the sum
    over k >= 1 of P(X > k)."""
    if raw_s <= 0 or period <= 0:
        return 1.0
    if jitter * raw_s > POLLS_SPREAD * period:
        # a spread of hundreds of periods: ceil adds half a period on average (its ripple is far below 1e-9),
        # and summing would take a step per period (a response length of millions: seconds of a plan)
        return raw_s / period * math.exp(jitter * jitter / 2.0) + 0.5
    # periods far below the spread are passed for certain (P(X > k) = 1 to 1e-15 below exp(-8 sigma) of raw_s)
    k = max(1, int(raw_s * math.exp(-8.0 * jitter) / period))
    out = float(k)
    while True:
        z = math.log(k * period / raw_s) / (jitter * math.sqrt(2.0)) if jitter > 0 else math.copysign(
            math.inf, k * period - raw_s)
        p = 0.5 * math.erfc(z)
        if p < 1e-9 and k * period > raw_s:
            return out
        out += p
        k += 1


def polled(t: Terms, value=None) -> Terms:
    """The generate's terms with verl's wait for its poll: GEN_POLL_S's coefficient set so the phase takes whole
    periods (polls()) beyond the raw work's seconds, then GEN_SLEEP_S. VALUE as in seconds()."""
    value = value or const
    raw = seconds({k: v for k, v in t.items() if k not in ("GEN_POLL_S", "GEN_SLEEP_S")}, value)
    period = value("GEN_POLL_S")
    return {**t, "GEN_POLL_S": polls(raw, period, value("GEN_JITTER")) - raw / period}


def sides(t: Terms) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(host terms, GPU terms) of a micro-batched phase's terms; ((), ()) for another phase. A packed pass's TAIL
    is neither (serial: its terms carry FORWARD_SYNC_PASS_S, its layers syncing); a padded one's is the GPU's."""
    kind = next((k for k in SIDES if k in t), None)
    if kind is None:
        return (), ()
    host, gpu = SIDES[kind]
    return host, gpu + (() if "FORWARD_SYNC_PASS_S" in t else TAIL[kind])


def overlapped(ranks: int, host: tuple[str, ...]) -> tuple[str, ...]:
    """The host terms that run beside the GPU's work. On one rank torch's FSDP1 runs NO_SHARD (no all-gathers), so
    the host launches a whole micro batch ahead of the GPU: all of them. On more ranks FSDP1's rate limiter
    (limit_all_gathers, on by default; verl does not set it) holds the host within two layer units of the GPU, so
    only the layers' launches overlap; the LM head's host work starts with the GPU's queue drained."""
    return host if ranks <= 1 else tuple(k for k in host if k in LAYER_TERMS)


def side_seconds(t: Terms, ranks: int, value=None) -> tuple[tuple[str, ...], tuple[str, ...], float, float]:
    """(the host terms that overlap the GPU's, the GPU terms, their seconds, theirs) of a phase's terms, each term at
    VALUE(name) (the module's constants by default; the fit passes its own)."""
    value = value or const
    host_all, gpu_keys = sides(t)
    host_keys = overlapped(ranks, host_all)
    return (host_keys, gpu_keys, sum(t.get(k, 0.0) * value(k) for k in host_keys),
            sum(t.get(k, 0.0) * value(k) for k in gpu_keys))


def bound(t: Terms, ranks: int = 1, value=None) -> Terms:
    """A micro-batched phase takes the longer of the host's and the GPU's work where they overlap, not their sum: the
    host runs ahead of the GPU until verl's per-micro-batch syncs (`loss.detach().item()` in forward_step, forward-only
    passes included; the policy loss's metric `.item()`s) make it wait. The terms of the longer side are kept (with
    the fixed and the serial ones: a forward pass's TAIL), the other side's zeroed, so Plan.terms shows which side
    binds. VALUE as in side_seconds."""
    host_keys, gpu_keys, host, gpu = side_seconds(t, ranks, value)
    drop = gpu_keys if host >= gpu else host_keys
    return {k: (0.0 if k in drop else v) for k, v in t.items()}


def at_host(raw: dict[str, Terms], ranks: int, factor: float = 1.0) -> dict[str, Terms]:
    """The phases' terms as the plan takes them (bound(), the generate polled) from their raw terms, with the host's
    constants (HOST_TERMS) FACTOR times the fit's: 1 the fit's hosts, below 1 a faster host."""
    out = {k: bound({c: v * factor if c in HOST_TERMS else v for c, v in t.items()} if factor != 1.0 else t, ranks)
           for k, t in raw.items()}
    if "gen" in out:
        out["gen"] = polled(out["gen"])
    return out


def flops_s(terms: Terms) -> float:
    """The seconds of a phase's FLOPs (at the held compute share): what FSDP's collectives overlap with."""
    return terms.get("1/COMPUTE_SHARE", 0.0) / COMPUTE_SHARE


def padded_len(m: int, mean: float, longest: float) -> float:
    """Tokens per sequence of a micro batch of m sequences without use_remove_padding: verl 0.9.1 pads a micro batch
    to its longest sequence (transformer_impl.py prepare_model_inputs, to_padded_tensor at max_seq_len), the longest
    of m lengths spread evenly around their mean, none past `longest`."""
    hi = max(mean, min(longest, 2.0 * mean))
    lo = 2.0 * mean - hi
    return lo + (hi - lo) * m / (m + 1)


def decode_read_s(weight_bytes: float, kv_bytes: float, hbm_gbs: float) -> float:
    """One decode step's reads (weights and the KV cache in flight) over the HBM bandwidth reached."""
    return (weight_bytes + kv_bytes) / (hbm_gbs * 1e9 * HBM_SHARE)


def ref_upload_s(params: float, micros: int, n: int, compute_s: float, pcie_gbs: float) -> float:
    """The ref's params copied host -> GPU once per micro batch (each GPU its 1/n shard), less the forward's compute
    they overlap with."""
    up = micros * REF_PARAM_BYTES * params / n / (pcie_gbs * 1e9)
    return max(0.0, up - compute_s)


def fsdp_comm_s(params: float, root: float, c: int, n: int, micros: int, bus_gbs: float) -> float:
    """An update's FSDP1 (FULL_SHARD) traffic, per micro batch: each decoder layer's params gathered in the compute
    dtype for the forward and again for the backward (resharded after the forward; gradient checkpointing recomputes
    inside the layer, after that gather), the root unit once (FSDP1 keeps the root unsharded from forward to
    backward), every gradient reduce-scattered in fp32 (reduce_dtype; verl 0.9.1 syncs every micro batch).
    (n-1)/n of the bytes cross the link."""
    if n <= 1:
        return 0.0
    per_micro = c * (2.0 * (params - root) + root) + 4.0 * params
    return micros * per_micro * (n - 1) / n / (bus_gbs * 1e9)


def fsdp_forward_comm_s(params: float, root: float, c: int, n: int, micros: int, bus_gbs: float) -> float:
    """A forward-only phase: each layer gathered once per micro batch, the root once (it stays unsharded)."""
    if n <= 1:
        return 0.0
    return (micros * c * (params - root) + c * root) * (n - 1) / n / (bus_gbs * 1e9)


def sync_comm_s(params: float, n: int, bus_gbs: float, fsdp2: bool) -> float:
    """update_weights across ranks: FSDP1's sharded state dict (verl sets it for more than one rank) unshards every
    flat param in fp32 (torch's summon path forces full precision), then verl's full_tensor() gathers each tensor
    again in fp32 to hand it to the rank's own vLLM; FSDP2's state dict holds shards, gathered once."""
    if n <= 1:
        return 0.0
    return (1 if fsdp2 else 2) * 4.0 * params * (n - 1) / n / (bus_gbs * 1e9)


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
    flash = hw.flash_attn is not False  # flash-attn importable: verl's log-probs use its fused cross-entropy
    real_per_seq = s.seq_len * fill
    longest = min(float(s.seq_len), s.prompt_len * fill + s.response_len)  # a response at its limit
    seqs_gpu = s.sequences / n
    real_gpu = seqs_gpu * real_per_seq
    cb = c.prec.c
    terms: dict[str, Terms] = {}
    from verl_cluster.placement.planner import OFFLOAD_LEVELS, OFFLOAD_NAMES, Phase
    UPDATES = (Phase.ACTOR_UPDATE, Phase.CRITIC_UPDATE)

    def per_seq(phase: Phase) -> float:
        """Tokens computed per sequence: packed, the real ones; else each micro batch padded to its longest."""
        m = c.micro(phase)
        if packed:
            return real_per_seq
        return padded_len(m, real_per_seq, longest) if m else float(s.seq_len)

    def tokens(phase: Phase) -> float:
        return seqs_gpu * per_seq(phase)

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
    # enforce_eager: no CUDA graphs, so every decode step launches each layer's kernels from Python
    terms["gen"] = {"GENERATE_FIXED_S": 1.0, "EAGER_STEP_S": steps if s.enforce_eager else 0.0,
                    "EAGER_LAYER_STEP_S": steps * shape.layers if s.enforce_eager else 0.0,
                    "DECODE_TOKEN_S": generated, "1/COMPUTE_SHARE": 2.0 * shape.params * seqs_rep * s.prompt_len
                    * fill / c.tp / (sp.tflops * 1e12), "": steps * read, "GEN_POLL_S": 0.0, "GEN_SLEEP_S": 1.0}
    bus = link_gbs(hw, n, sp)
    if n > 1:
        notes.append(bus_note(hw, n, sp, gpu_name or hw.gpu_name))
    pcie = sp.pcie_gbs * 1e9
    param_off, opt_off = OFFLOAD_LEVELS[c.offload]

    def micros(phase: Phase) -> int:
        """A phase's micro batches on a GPU: by its micro batch size, or packed under its token budget (an
        update's mini batches each packed on their own)."""
        m = c.micro(phase)
        if m:
            return max(1, math.ceil(seqs_gpu / m))
        budget = c.token_budget.get(phase) or s.actor_max_tokens
        minis = max(1, s.sequences // (s.ppo_mini_batch_size * s.n)) if phase in UPDATES else 1
        return minis * max(1, math.ceil(tokens(phase) / minis / budget))

    def offload_s(params: float, m: int, updates: bool) -> float:
        moved = (m * params / n if param_off else 0.0) + (8.0 * params / n if opt_off and updates else 0.0)
        return 2.0 * moved / pcie

    def exposed(comm: float, t: Terms) -> float:
        """FSDP's collectives run on their own stream beside the layers' compute: what is left beyond the FLOPs."""
        return max(0.0, comm - flops_s(t))

    def forward(params: float, root: float, phase: Phase, vocab: int, entropy: bool = False) -> Terms:
        t = tokens(phase)
        reads = real_gpu * vocab / (sp.hbm_gbs * 1e9) if vocab > 1 else 0.0
        out = forward_terms(params, t, sp.tflops, reads, micros(phase) * shape.layers,
                            real_gpu if vocab > 1 and not flash else 0.0, micros(phase) if vocab > 1 else 0,
                            synced=packed)  # its TAIL after the layers' syncs: serial (sides())
        # the entropy over every logit computed (verl asks it of the actor's log-prob only): packed, a compiled (fused)
        # function; padded, the plain one (softmax, logsumexp, product and sum, each a pass over the logits)
        if entropy:
            out["ENTROPY_BYTES" if packed else "ENTROPY_EAGER_BYTES"] = t * vocab / (sp.hbm_gbs * 1e9)
        out["FORWARD_TOKEN_S"] = real_gpu
        out["COMM_S"] = exposed(fsdp_forward_comm_s(params, root, cb, n, micros(phase), bus), out)
        out[""] = 0.0  # serial seconds: offload, the ref's uploads
        return out

    def update(params: float, root: float, phase: Phase, vocab: int, recompute: bool) -> Terms:
        t, m = tokens(phase), micros(phase)
        out = update_terms(params, t, sp.tflops, recompute,
                           logit_reads=t * vocab / (sp.hbm_gbs * 1e9) if vocab > 1 else 0.0,
                           passes=m * shape.layers, loop_tokens=real_gpu if vocab > 1 and not flash else 0.0,
                           lm_micros=m if vocab > 1 else 0, sharded=n > 1)
        out["COMM_S"] = exposed(fsdp_comm_s(params, root, cb, n, m, bus), out)
        out[""] = 0.0  # serial seconds: offload
        return out

    actor_p, root = shape.params, shape.root_params
    m_a = s.master_dtype_bytes_actor
    old = forward(actor_p, root, Phase.ACTOR_LOG_PROB, shape.vocab, entropy=True)
    old[""] += offload_s(actor_p, m_a, False)
    terms["old_log_prob"] = old
    if s.ref and not s.lora_rank:
        ref = forward(actor_p, root, Phase.REF_LOG_PROB, shape.vocab)
        ref[""] += ref_upload_s(actor_p, micros(Phase.REF_LOG_PROB), n, flops_s(ref), sp.pcie_gbs)
        terms["ref"] = ref
    elif s.ref:  # LoRA: the actor with its adapters off, no entropy, nothing on the host
        terms["ref"] = forward(actor_p, root, Phase.REF_LOG_PROB, shape.vocab)
    if s.critic:
        cp, m_c = shape.value_model_params, s.master_dtype_bytes_critic
        values = forward(cp, shape.value_root_params, Phase.CRITIC_VALUES, 1)
        values[""] += offload_s(cp, m_c, False)
        terms["values"] = values
        uc = update(cp, shape.value_root_params, Phase.CRITIC_UPDATE, 1, s.grad_ckpt_critic)
        uc[""] += offload_s(cp, m_c, True)
        terms["update_critic"] = uc
    # on the driver, for the whole batch: GAE loops over the response positions (compute_gae_advantage_return),
    # GRPO's grouping and the batch's bookkeeping over the sequences, in Python
    terms["adv"] = {"ADV_S": 1.0, "ADV_SEQ_S": s.sequences,
                    "GAE_STEP_S": s.response_len if s.adv_estimator == "gae" else 0.0}
    ua = update(actor_p, root, Phase.ACTOR_UPDATE, shape.vocab, s.grad_ckpt_actor)
    ua[""] += offload_s(actor_p, m_a, True)  # serial: the params and states moved before and after the micro batches
    terms["update_actor"] = ua
    # with param offload verl loads the params to the GPU to hand them over, and offloads them again; across ranks
    # each tensor is gathered (DTensor full_tensor(), one call a tensor: per layer)
    terms["update_weights"] = {"SYNC_FIXED_S": 1.0, "SYNC_RANKS_S": 1.0 if n > 1 else 0.0,
                               "": cb * actor_p / (sp.hbm_gbs * 1e9 * HBM_SHARE)
                               + sync_comm_s(actor_p, n, bus, s.fsdp2) + offload_s(actor_p, m_a, False)}
    raw = terms
    terms = at_host(raw, n)
    phases = {k: seconds(v) for k, v in terms.items()}
    trained = actor_p + (shape.value_model_params if s.critic else 0)
    save = 12.0 * trained / n / (SAVE_GBS * 1e9) if s.save_freq > 0 else 0.0
    total = sum(phases.values())
    tps = s.sequences * real_per_seq / n / total if total > 0 else 0.0
    axes = job_axes(gpu=gpu_family(gpu_name or hw.gpu_name), ranks=n, nodes=len(main.node_ids), packed=packed,
                    flash=flash, adv_estimator=s.adv_estimator, critic=s.critic, offload=OFFLOAD_NAMES[c.offload],
                    eager=s.enforce_eager, micro_update=c.micro(Phase.ACTOR_UPDATE),
                    micro_log_prob=c.micro(Phase.ACTOR_LOG_PROB), params=shape.params)
    fast = fastest_host()
    host = None
    if fast is not None and total > 0:
        there = sum(seconds(v) for v in at_host(raw, n, fast[1]).values())
        host = {"group": fast[0], "factor": fast[1], "error": round(total / there - 1, 3)}
    return StepTime(phases, total, save, tps, tuple(notes), terms, error_bar(axes, host=host), raw, n)
