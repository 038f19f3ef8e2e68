"""`plan(job, facts) -> Plan`: a pure function of the job spec and hardware facts (no probing)."""

from __future__ import annotations

import math

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Optional

from verl_cluster.config.job import JobSpec, job_model_config
from verl_cluster.errors import ConfigError, PlanError
from verl_cluster.facts.measured_bus import BusMeasure
from verl_cluster.facts.model import NodeFacts
import verl_cluster.placement.memory as mem
from verl_cluster.placement.check_run import BY_FILL
from verl_cluster.placement.hardware import Hardware, hardware_from_facts, with_bus
from verl_cluster.placement.host_memory import host_parts, host_terms, worker_parts
from verl_cluster.placement.step_time import step_time
from verl_cluster.placement.memory import GIB
from verl_cluster.placement.model_shape import ModelShape, resolve_shape, shape_from_dir
from verl_cluster.placement.options import Option, batch_divides, find_options
from verl_cluster.placement.overrides import build_overrides
from verl_cluster.placement.planner import (OFFLOAD_NAMES, STRATEGIES, UTIL_DEFAULT, Candidate, Evaluator,
                                            Phase, PhaseResult, Strategy, choose_precision, closest, make_pools, search,
                                            wanted_concurrency)
from verl_cluster.placement.settings import Settings, read_settings

ROLE_ORDER = ("actor", "rollout", "ref", "critic", "reward")


class StrategyUnavailable(ConfigError):
    """The strategy asked for builds no verl resource pools for this job on this hardware."""

ROLE_WHY = {"actor": "always", "rollout": "hybrid engine, on the actor's GPUs", "ref": "KL loss or KL in reward",
            "critic": "critic.enable or adv_estimator=gae", "reward": "reward model enabled"}


@dataclass(frozen=True)
class Component:
    name: str
    gib: float


@dataclass(frozen=True)
class PhasePlan:
    phase: Phase
    micro_batch: Optional[int]
    tokens: int  # tokens per micro batch per GPU (or the token budget)
    components: tuple[Component, ...]  # the role's own working set
    working_gib: float
    peak_gib: float  # GPU peak while this phase runs: + others' resident, context, allocator margin
    fits: bool
    note: str = ""
    at_limit: bool = False  # fits only with the allocator at the GPU's limit (the note says why)


@dataclass(frozen=True)
class RolePlan:
    role: str
    pool: str
    gpus: tuple[tuple[int, int], ...]  # (node index, GPU index)
    memory_gib_per_gpu: float  # highest GPU peak among this role's phases
    resident_gib: float  # what it keeps on the GPU while other roles run
    host_gib_per_gpu: float
    phases: tuple[PhasePlan, ...]


@dataclass(frozen=True)
class GpuSlot:
    node: int
    host: str
    gpu: int
    roles: tuple[str, ...]
    peak_gib: float
    peak_phase: str
    capacity_gib: float = 0.0  # this GPU's memory as planned (its pool's; mixed nodes differ)


@dataclass(frozen=True)
class PoolPlan:
    """One verl resource pool: its roles, the hosts and GPUs per node it holds, and the Ray resource that pins it
    to those nodes ("": none needed)."""

    name: str
    roles: tuple[str, ...]
    hosts: tuple[str, ...]
    gpus_per_node: int
    gpu_gib: float
    ray_resource: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "roles": list(self.roles), "hosts": list(self.hosts),
                "gpus_per_node": self.gpus_per_node, "gpu_gib": self.gpu_gib, "ray_resource": self.ray_resource}


@dataclass(frozen=True)
class Plan:
    feasible: bool
    strategy: Strategy
    model: str
    params: int
    hardware: str
    capacity_gib: float
    nnodes: int
    gpus_per_node: int
    tp: int
    gpu_memory_utilization: float
    offload: str
    dtype: str
    attn: str
    fill: float
    roles: tuple[RolePlan, ...]
    gpus: tuple[GpuSlot, ...]
    overrides: dict[str, Any]  # verl overrides (verl 0.9 key names); merge them into the job's overrides
    reasons: tuple[str, ...]
    warnings: tuple[str, ...] = ()
    problems: tuple[str, ...] = ()  # why it does not fit, with the numbers
    fixes: tuple[str, ...] = ()  # what would make it fit
    host_gib_per_node: float = 0.0
    rollout_seqs_fit: int = 0
    rollout_seqs_wanted: int = 0
    binding: str = ""  # the constraint that decides when it does not fit
    options: tuple[Option, ...] = ()  # the best feasible changed jobs when it does not fit, best first
    host_mem_gib: Optional[float] = None  # RAM per node the plan was checked against (None: unknown)
    pools: tuple[PoolPlan, ...] = ()  # verl resource pools
    # not feasible at the fill planned, but as written at this lower average fill (use_remove_padding): None if not
    fits_at_fill: Optional[float] = None
    # the lengths planned at and where each came from, and the worst case's verdict (placement/lengths.py)
    lengths: Optional[dict[str, Any]] = None
    worst_case: Optional[dict[str, Any]] = None
    host_parts: dict[str, float] = field(default_factory=dict)
    host_worker_gib: float = 0.0  # a node that runs no driver, between saves (placement/host_memory.worker_parts)
    # predicted seconds per step and per phase at the lengths planned (placement/step_time.py StepTime.to_dict())
    time: Optional[dict[str, Any]] = None  # host RAM of the busiest node by part, GiB
    # "" when the memory verdict covers the job; else why it does not (verl's Megatron workers: the model is FSDP's)
    not_covered: str = ""
    # the fitted constants' coefficients: {"time": {phase: terms}, "host": terms} (scripts/calibration/fit_plan_calibration.py)
    terms: dict[str, Any] = field(default_factory=dict, repr=False)
    # tokens a step holds at fill 1 (sequences x (prompt + response)) and this plan's step time at another fill: a
    # run is held against the plan at the lengths it really had, not those planned (the worst case, by default)
    tokens_full: int = 0
    time_at: Optional[Callable[[float], dict[str, Any]]] = field(default=None, repr=False, compare=False)

    @property
    def host_steady_gib(self) -> float:
        """Host RAM per node between checkpoint saves (the peak, host_gib_per_node, includes a save)."""
        from verl_cluster.placement.host_memory import CHECKPOINT_PART

        return self.host_gib_per_node - self.host_parts.get(CHECKPOINT_PART, 0.0)

    @property
    def host_cluster_gib(self) -> float:
        """Host RAM of every node together between saves: the head plus the others (what one machine shows when
        the nodes share it, as namespace hosts do)."""
        return self.host_steady_gib + max(0, self.nnodes - 1) * self.host_worker_gib

    def predictions(self) -> dict[str, Any]:
        """What a run of this plan can be held against (placement/check_run.py): seconds per phase and step, one
        checkpoint save, host RAM per node between saves."""
        t = self.time or {}
        out = {"phases_s": dict(t.get("phases_s") or {}), "step_s": t.get("step_s"),
               "save_checkpoint_s": t.get("save_checkpoint_s"), "host_gib": round(self.host_steady_gib, 2),
               "host_gib_all_nodes": round(self.host_cluster_gib, 2), "nnodes": self.nnodes}
        if t.get("by_host_factor"):  # the phases at other hosts' speeds (check_run.host_fit)
            out["by_host_factor"] = t["by_host_factor"]
            if t.get("host_factor"):  # the phases are at this host factor (factors.apply_factors), the table not
                out["host_factor"] = t["host_factor"]
        bar = t.get("error_bar") or {}
        if bar.get("pct") and "over" in bar:  # which way the step may be off (envelope.step_range), for the ETA
            out["error_bar"] = {"pct": bar["pct"], "over": bar["over"], "under": bar["under"]}
        if self.time_at is not None and self.tokens_full:
            out["fill"], out["tokens_full"] = round(self.fill, 4), self.tokens_full
            out["by_fill"] = []  # the planned fill among them: a run at the lengths planned reads the plan itself
            for f in sorted({*BY_FILL, out["fill"]}):
                x = self.time_at(f)
                out["by_fill"].append([f, {k: round(v, 3) for k, v in x["phases_s"].items()}])
        return out

    def role(self, name: str) -> RolePlan:
        for r in self.roles:
            if r.role == name:
                return r
        raise KeyError(name)

    def at_limit_phases(self) -> list[str]:
        """The phases that fit only with the allocator at the GPU's limit."""
        return [ph.phase for r in self.roles for ph in r.phases if ph.at_limit]

    @property
    def peak_gib(self) -> float:
        return max((g.peak_gib for g in self.gpus), default=0.0)

    def raise_if_infeasible(self) -> None:
        if not self.feasible:
            raise PlanError("; ".join(self.problems) or "the job does not fit",
                            "; ".join(self.fixes) or "run `verl-cluster plan` for the numbers")

    def to_dict(self) -> dict[str, Any]:
        return {
            "feasible": self.feasible,
            "strategy": self.strategy,
            "model": {"name": self.model, "params": self.params},
            "hardware": {"description": self.hardware, "capacity_gib_per_gpu": round(self.capacity_gib, 2),
                         "nnodes": self.nnodes, "gpus_per_node": self.gpus_per_node},
            "settings": {"tp": self.tp, "gpu_memory_utilization": self.gpu_memory_utilization,
                         "offload": self.offload, "dtype": self.dtype, "attn_implementation": self.attn,
                         "fill": self.fill},
            "roles": {
                r.role: {
                    "pool": r.pool,
                    "gpus": [list(g) for g in r.gpus],
                    "memory_gib_per_gpu": round(r.memory_gib_per_gpu, 2),
                    "resident_gib_per_gpu": round(r.resident_gib, 2),
                    "host_gib_per_gpu": round(r.host_gib_per_gpu, 2),
                    "phases": [{"phase": p.phase, "micro_batch": p.micro_batch, "tokens": p.tokens,
                                "working_gib": round(p.working_gib, 2), "peak_gib": round(p.peak_gib, 2),
                                "fits": p.fits, "components": {c.name: round(c.gib, 3) for c in p.components},
                                **({"note": p.note} if p.note else {})} for p in r.phases],
                }
                for r in self.roles
            },
            "gpus": [{"node": g.node, "host": g.host, "gpu": g.gpu, "roles": list(g.roles),
                      "peak_gib": round(g.peak_gib, 2), "peak_phase": g.peak_phase,
                      "capacity_gib": round(g.capacity_gib or self.capacity_gib, 2)} for g in self.gpus],
            "rollout": {"seqs_fit_per_replica": self.rollout_seqs_fit, "seqs_wanted_per_replica": self.rollout_seqs_wanted},
            "host_gib_per_node": round(self.host_gib_per_node, 2),
            "host_parts_gib": {k: round(v, 2) for k, v in self.host_parts.items()},
            "host_steady_gib_per_node": round(self.host_steady_gib, 2),
            "host_steady_gib_worker_node": round(self.host_worker_gib, 2),
            "host_steady_gib_all_nodes": round(self.host_cluster_gib, 2),
            **({"time": self.time} if self.time is not None else {}),
            "overrides": dict(self.overrides),
            "reasons": list(self.reasons),
            "warnings": list(self.warnings),
            "problems": list(self.problems),
            "fixes": list(self.fixes),
            "binding": self.binding,
            "options": [o.to_dict() for o in self.options],
            "host_mem_gib": None if self.host_mem_gib is None else round(self.host_mem_gib, 1),
            "pools": [p.to_dict() for p in self.pools],
            "fits_at_fill": self.fits_at_fill,
            **({"lengths": self.lengths} if self.lengths is not None else {}),
            **({"worst_case": self.worst_case} if self.worst_case is not None else {}),
            "memory_verdict": "not-covered" if self.not_covered else ("fits" if self.feasible else "does-not-fit"),
            **({"not_covered": self.not_covered} if self.not_covered else {}),
        }


def plan(job: JobSpec, facts: list[NodeFacts], *, strategy: Optional[str] = None, fill: float = 1.0,
         shape: Optional[ModelShape] = None, bus: tuple[BusMeasure, ...] = ()) -> Plan:
    """Place the job's roles on the hardware. `strategy`: colocate | split | separate-reward | auto (default:
    the job's placement.strategy). `fill`: average share of prompt+response a sequence really uses (1.0 = the
    worst case; only matters with use_remove_padding). Raises ConfigError for bad input and PlanError when the
    hardware itself is unusable (heterogeneous nodes); an infeasible placement is a Plan with feasible=False.
    `bus`: `check`'s recorded all-reduce measurements of the cluster the facts come from (facts/measured_bus.py)."""
    if not (0.0 < fill <= 1.0):
        raise ConfigError(f"--fill must be in (0, 1], got {fill}")
    s = read_settings(job)
    from verl_cluster.placement.lengths import check_placement_lengths

    check_placement_lengths(job)
    shape = shape or resolve_shape(job.model.path, job.model.catalog, job_model_config(job))
    reasons: list[str] = []
    rm_shape = shape
    if s.reward_model:
        if s.reward_model_path and (Path(s.reward_model_path).expanduser() / "config.json").is_file():
            rm_shape = shape_from_dir(s.reward_model_path)
        else:
            reasons.append("reward model shape unknown here: assumed the policy's shape")
    hw = with_bus(hardware_from_facts(facts, nnodes=s.nnodes, n_gpus_per_node=s.n_gpus_per_node), bus)
    prec, prec_reasons, warnings = choose_precision(s, hw)
    want = strategy or job.placement.strategy or "auto"
    if want not in STRATEGIES + ("auto",):
        raise ConfigError(f"--strategy: unknown strategy `{want}`", f"use one of {', '.join(STRATEGIES)}, auto")
    strategies = STRATEGIES if want == "auto" else (Strategy(want),)
    if want != "auto" and not make_pools(strategies[0], s, hw):
        need = {"split": "an entrypoint that builds two pools (verl.trainer.main_ppo puts every role in "
                         "global_pool), a critic or reward model and an even GPU count per node",
                "separate-reward": "a reward model and ≥ 2 GPUs per node",
                "split-nodes": "≥ 2 nodes, a critic or reward model and an entrypoint that builds pools "
                               "(verl.trainer.main_ppo puts every role in global_pool)"}[want]
        raise StrategyUnavailable(f"strategy `{want}` needs {need}", "use --strategy colocate or auto")
    ev = Evaluator(s, shape, rm_shape, hw, prec, fill)
    best, tried = search(ev, strategies)
    roles_on = [r for r in ROLE_ORDER if r in {"actor", "rollout"} or getattr(s, r if r != "reward" else "reward_model")]
    reasons.insert(0, "roles: " + ", ".join(f"{r} ({ROLE_WHY[r]})" for r in roles_on))
    reasons.insert(1, f"model {shape.name}: {shape.params / 1e9:.2f}B parameters, {shape.layers} layers, hidden "
                      f"{shape.hidden}, vocab {shape.vocab}")
    reasons.insert(2, _hw_line(hw))
    if s.lora_rank or s.critic_lora_rank:
        reasons.append(_lora_line(s, shape))
    reasons += prec_reasons
    reasons += [n for n in hw.notes]
    if fill < 1.0 and prec.remove_padding:
        reasons.append(f"sequence lengths: planned with an average fill of {fill:.0%} of prompt+response "
                       f"({s.seq_len} tokens); real lengths above that can run out of memory")
    else:
        reasons.append(f"sequence lengths: worst case, every sequence is prompt+response = {s.seq_len} tokens "
                       "(with use_remove_padding real batches use fewer tokens, so this is stricter than reality)")
    if hw.host_mem_bytes is not None:
        reasons.append(f"host RAM {_gib(hw.host_mem_bytes)} per node (the facts' RAM; for --gpus the GPU catalog's "
                       "typical server, or --host-mem)")
    options: list[Option] = []
    warnings += [f"`{given}` is not a key the plan reads: did you mean `{meant}`? The plan went by `{meant}` as the "
                 "job sets it elsewhere, else verl's default (`submit` checks every key against verl's own config)"
                 for given, meant in s.near_misses]
    if s.critic and s.critic_packs and s.critic_micro is not None and not s.dynamic_bsz:
        warnings.append(f"critic.ppo_micro_batch_size_per_gpu={s.critic_micro} does not size the critic's micro "
                        "batches: verl 0.9 packs them by tokens (planned so); to hold its memory down set "
                        f"{s.critic_budget_key(update=True)}")
    if best is not None:
        reasons += _explain(best, tried, s, hw, want)
        problems, fixes = _host_check(best, s, shape, hw, warnings)
        warnings += [f"{p.phase} runs at the GPU's limit ({p.limit_why}): real sequences "
                     "longer than planned, or other processes on the GPU, will run out of memory there"
                     for p in best.phases if p.at_limit]
        shown = best
        binding = problems[0] if problems else ""
    else:
        shown = closest(tried, hw.capacity_bytes)
        problems = _problems(shown, hw, s.seq_len)
        binding = _binding(shown, hw, problems, s.seq_len)
    fits_at = None
    if problems:
        options = find_options(ev, strategies, job.verl_overrides(), divisible=batch_divides(s, hw.total_gpus))
        fixes = _fix_lines(options)
        if best is None and not shown.problems and prec.remove_padding:
            fits_at = fill_that_fits(s, shape, rm_shape, hw, prec, fill, strategies)
        if fits_at is not None:
            fixes.insert(0, f"as written, if sequences average ≤ {fits_at:.0%} of prompt+response "
                            f"({int(fits_at * s.seq_len)} of {s.seq_len} tokens; "
                            f"`plan --fill {fits_at:g}` shows that plan) — use_remove_padding packs real lengths, and "
                            "most RL data sits well below the maximum; or one of the changes below at any length")
    plan_ = _assemble(shown, s, shape, hw, fill, reasons, warnings, problems, fixes, best is not None and not problems)
    plan_ = replace(plan_, binding=binding, options=tuple(options), fits_at_fill=fits_at)
    return megatron_scope(plan_) if s.megatron else plan_


# What a plan still says of a Megatron job: the GPUs it runs on. Everything else (offload, micro batches, rollout
# TP and memory share) comes from the FSDP memory model.
TOPOLOGY_KEYS = ("trainer.nnodes", "trainer.n_gpus_per_node")
MEGATRON_NOTE = ("the memory verdict does not cover Megatron jobs (verl's Megatron workers shard by TP x PP x CP x "
                 "EP with a distributed optimizer; the planner models FSDP workers): no fit is claimed, the numbers "
                 "below are the FSDP model's and only the node/GPU counts are suggested")


def megatron_scope(p: Plan) -> Plan:
    """A Megatron job's plan: no memory verdict, no FSDP keys or memory-derived settings, nothing refused."""
    fsdp = [f"FSDP model, not Megatron's: {x}" for x in p.problems]
    return replace(p, feasible=True, not_covered=MEGATRON_NOTE, problems=(), fixes=(), options=(), binding="",
                   fits_at_fill=None, overrides={k: v for k, v in p.overrides.items() if k in TOPOLOGY_KEYS},
                   warnings=(MEGATRON_NOTE,) + tuple(fsdp) + p.warnings)


# Below this average sequence a "fits at real lengths" is no promise worth making (GSM8K's prompt alone, with the
# chat template and verl's instruction, is ~150 tokens); as a share of prompt+response, at least 5%.
FILL_FLOOR_TOKENS = 256


def fill_that_fits(s: Settings, shape: ModelShape, rm_shape: ModelShape, hw: Hardware, prec, fill: float,
                   strategies: tuple[Strategy, ...]) -> Optional[float]:
    """The largest average fill (0.05 steps, below the one planned) up to which the job as written fits at every
    step, or None. Scanned upwards: with token budgets memory is not monotone in the fill (verl balances a rank's
    tokens over ceil(tokens / budget) micro batches), and "fits if sequences average ≤ X" must hold below X too."""
    lo = max(1, math.ceil(FILL_FLOOR_TOKENS / max(1, s.seq_len) / 0.05 - 1e-9))  # in 0.05 units
    hi = round(fill / 0.05) - 1  # the first below `fill`
    best = None
    for step in range(lo, hi + 1):
        if search(Evaluator(s, shape, rm_shape, hw, prec, step * 0.05), strategies)[0] is None:
            break
        best = round(step * 0.05, 2)
    return best


def _lora_line(s: Settings, shape: ModelShape) -> str:
    who = [f"actor rank {s.lora_rank} ({shape.lora_params(s.lora_rank, s.lora_targets) / 1e6:.1f}M adapter "
           "params; the ref is the actor with its adapters off, no second model)"] if s.lora_rank else []
    if s.critic_lora_rank:
        who.append(f"critic rank {s.critic_lora_rank}")
    return (f"LoRA on {', '.join(s.lora_targets)}: {'; '.join(who)} — gradients and Adam states for the adapters "
            "only, the frozen base kept in model_dtype, activations as in full fine-tuning")


def _hw_line(hw: Hardware) -> str:
    if hw.kinds:
        kinds = " + ".join(f"{len(k.nodes)} node(s) x {hw.gpus_per_node} x {k.gpu_name} ({k.capacity_bytes / GIB:.1f} "
                           f"GiB, SM {k.sm[0]}.{k.sm[1]})" for k in hw.kinds)
        return f"hardware: {kinds}, P2P islands {_islands(hw)}"
    return (f"hardware: {hw.nnodes} node(s) x {hw.gpus_per_node} x {hw.gpu_name} ({hw.capacity_bytes / GIB:.1f} GiB, "
            f"SM {hw.sm[0]}.{hw.sm[1]}, P2P islands {_islands(hw)})")


def _hw_short(hw: Hardware) -> str:
    if hw.kinds:
        return " + ".join(f"{len(k.nodes)}x{hw.gpus_per_node}x {k.gpu_name}" for k in hw.kinds)
    return f"{hw.nnodes}x{hw.gpus_per_node}x {hw.gpu_name}"


def _islands(hw: Hardware) -> str:
    return " | ".join(",".join(f"[{min(i)}-{max(i)}]" if len(i) > 1 else f"[{i[0]}]" for i in layout)
                      for layout in hw.islands)


def _gib(x: float) -> str:
    return f"{x / GIB:.1f} GiB"


def _top(ph: PhaseResult, k: int = 3) -> str:
    parts = sorted(ph.parts, key=lambda p: -p.bytes)[:k]
    return ", ".join(f"{p.name} {_gib(p.bytes)}" for p in parts if p.bytes > 0)


def _explain(best: Candidate, tried: list[Candidate], s: Settings, hw: Hardware, want: str) -> list[str]:
    out = []
    cap = hw.capacity_bytes
    same = [c for c in tried if c.strategy == best.strategy and c.pools == best.pools]
    if want == "auto":
        others = sorted({c.strategy for c in tried if c.feasible} - {best.strategy})
        out.append(f"strategy {best.strategy}: cheapest feasible (least offload, then colocated hybrid engine)"
                   + (f"; also feasible: {', '.join(others)}" if others else ""))
    else:
        out.append(f"strategy {best.strategy}: as asked")
    if best.strategy == Strategy.SPLIT_NODES:
        out.append(_by_kind_line(best, hw))
    if best.offload == 0:
        out.append("offload: none, every phase fits with params, grads and Adam states on the GPU")
    else:
        lower = [c for c in same if c.tp == best.tp and c.offload == best.offload - 1]
        why = ""
        if lower:
            bad = [p for p in lower[0].phases if not p.fits]
            if bad:
                why = f": without it {bad[0].phase} needs {bad[0].peak / GIB:.1f} GiB/GPU > {cap / GIB:.1f} GiB"
        out.append(f"offload: {OFFLOAD_NAMES[best.offload]}{why}")
    if s.tp is not None:
        out.append(f"rollout TP {best.tp}: pinned by the job")
    else:
        smaller = [c for c in same if c.tp < best.tp and c.offload == best.offload]
        out.append(f"rollout TP {best.tp}: smallest that fits" + (
            f" (TP {max(c.tp for c in smaller)} does not)" if smaller else ""))
    if best.tp > best.pools[0].size // best.pools[0].nnodes:
        out.append(f"TP {best.tp} spans {best.tp // len(best.pools[0].gpu_indices)} nodes per vLLM replica: "
                   "tensor-parallel traffic crosses the network")
    if best.crosses_islands:
        out.append(f"TP {best.tp} groups cross P2P islands: NCCL goes through PCIe/host memory (slower); RTX-class "
                   "cards may also need NCCL_P2P_DISABLE=1")
    if s.gpu_memory_utilization is not None:
        out.append(f"gpu_memory_utilization {best.util}: pinned by the job")
    elif best.util < UTIL_DEFAULT:
        out.append(f"gpu_memory_utilization {best.util}: lowered from verl's {UTIL_DEFAULT} so vLLM's share fits "
                   "beside what the training roles keep resident")
    else:
        out.append(f"gpu_memory_utilization {best.util}: verl's default")
    if best.rollout is not None:
        wanted = wanted_concurrency(s, best.pools[0].size, best.tp)
        r = best.rollout
        out.append(f"rollout KV cache {_gib(max(0.0, r.kv_cache))} per GPU holds {r.seqs_fit} sequences of {s.seq_len} tokens "
                   f"per replica; the batch needs {wanted} at once" + ("" if r.seqs_fit >= wanted else
                                                                        " (it will generate in waves)"))
    for ph in best.phases:
        if ph.role == "rollout":
            continue
        what = f"token budget {int(ph.tokens)}" if ph.micro is None else f"micro batch {ph.micro}"
        budget = best.token_budget.get(ph.phase)
        if ph.micro is None and budget and budget > ph.tokens:  # a batch smaller than its budget: one micro batch
            what = f"token budget {budget}, micro batches of up to {int(ph.tokens)} tokens"
        line = f"{ph.phase}: {what} ({ph.peak / GIB:.1f} GiB/GPU peak)"
        if ph.bigger:
            line += f"; {ph.bigger[0]} would need {ph.bigger[1] / GIB:.1f} GiB"
        out.append(line)
    return out


def _by_kind_line(c: Candidate, hw: Hardware) -> str:
    """How the entrypoint must build the pools: verl's RayResourcePool(accelerator_type=R) asks every bundle for
    a sliver of resource R, so a pool lands only on nodes whose `ray start` advertised R (cluster.yaml
    `resources: {R: 1}` on those nodes)."""
    parts = []
    for p in c.pools:
        hosts = ", ".join(hw.hosts[i] for i in p.node_ids)
        parts.append(f"{p.name} ({'/'.join(p.roles)}): [{len(p.gpu_indices)}] x {p.nnodes} on {hosts} "
                     f"({(p.capacity or hw.capacity_bytes) / GIB:.0f} GiB GPUs), Ray resource `{p.resource}`")
    if not any(p.resource for p in c.pools):
        return ("pools by whole nodes — " + "; ".join(parts).replace(", Ray resource ``", "") + ". The entrypoint "
                "builds them (resource_pool_spec), as verl's examples/split_placement does; alike nodes need no pinning")
    return ("pools by GPU kind — " + "; ".join(parts) + ". verl's stock trainer cannot pin a pool to nodes: the "
            "entrypoint passes each pool's resource to RayResourcePool(accelerator_type=...), and cluster.yaml gives "
            "those nodes `resources: {RESOURCE: 1}`")


def _host_check(c: Candidate, s: Settings, shape: ModelShape, hw: Hardware,
                warnings: list[str]) -> tuple[list[str], list[str]]:
    parts = host_parts(c, s, shape)
    need = mem.total(parts)
    if hw.host_mem_bytes is None:
        return [], []
    top = ", ".join(f"{p.name} {p.gib:.1f}" for p in sorted(parts, key=lambda p: -p.bytes)[:3])
    if need > hw.host_mem_bytes:
        return ([f"host memory: {_gib(need)} per node ({top}) > {_gib(hw.host_mem_bytes)} RAM"],
                ["use less offload, fewer GPUs per node or nodes with more RAM"])
    if need > 0.9 * hw.host_mem_bytes:
        warnings.append(f"host memory {_gib(need)} per node ({top}) is over 90% of {_gib(hw.host_mem_bytes)} RAM "
                        "(Ray's memory monitor kills workers at 95%)")
    return [], []


def _rollout_need(c: Candidate, ph: PhaseResult) -> float:
    """What generation needs on a GPU: vLLM's claim (gpu_memory_utilization x total), or, when that claim is
    too small for the weights, activations, CUDA graphs and one full sequence's KV cache, that minimum - so the
    number shown is never below one of its parts."""
    r = c.rollout
    if ph.role != "rollout" or r is None or r.seqs_fit >= 1:
        return ph.peak
    least = r.weights + r.activations + r.graphs + r.kv_per_seq
    return max(ph.peak, ph.peak - r.budget + least)


def _rollout_note(c: Candidate, ph: PhaseResult, seq_len: int) -> str:
    """The phase note, with the KV cache never shown negative."""
    r = c.rollout
    if ph.role != "rollout" or r is None or r.seqs_fit >= 1:
        return ph.note
    fixed = r.weights + r.activations + r.graphs
    one = f"one {seq_len}-token sequence needs {r.kv_per_seq / GIB:.3f} GiB of KV cache"
    if r.kv_cache <= 0:
        return (f"no room for a KV cache: weights, activations and CUDA graphs ({_gib(fixed)}) exceed vLLM's "
                f"{_gib(r.budget)} (gpu_memory_utilization {c.util}) by {_gib(fixed - r.budget)}; {one}")
    return (f"KV cache {r.kv_cache / GIB:.2f} GiB at gpu_memory_utilization {c.util} holds no full sequence; {one}")


def _problems(c: Candidate, hw: Hardware, seq_len: int) -> list[str]:
    return list(dict.fromkeys(c.problems)) + [_phase_problem(c, ph, hw, seq_len) for ph in c.phases if not ph.fits]


def _phase_problem(c: Candidate, ph: PhaseResult, hw: Hardware, seq_len: int) -> str:
    pool = next(p for p in c.pools if p.name == ph.pool)
    what = "" if ph.micro is None else f" at micro batch {ph.micro}"
    least = (f", {ph.least / GIB:.1f} GiB at the least (live tensors, the allocator at its limit)"
             if ph.least else "")
    line = (f"{ph.phase} needs {_rollout_need(c, ph) / GIB:.1f} GiB/GPU{what} ({_top(ph)}{least}) on {pool.size} GPU(s) "
            f"with {OFFLOAD_NAMES[c.offload]} offload, TP {c.tp}; {hw.gpu_name} has "
            f"{(pool.capacity or hw.capacity_bytes) / GIB:.1f} GiB")
    note = _rollout_note(c, ph, seq_len)
    return line + (f" — {note}" if note else "")


def _binding(c: Candidate, hw: Hardware, problems: list[str], seq_len: int) -> str:
    """The one constraint that decides: divisibility first (no memory setting fixes it), then KV cache for one
    sequence, then the phase that needs the most memory."""
    if c.problems:
        return "divisibility: " + c.problems[0]
    bad = [p for p in c.phases if not p.fits]
    rollout = next((p for p in bad if p.role == "rollout"), None)
    if rollout is not None and c.rollout is not None and c.rollout.seqs_fit < 1 and c.rollout.kv_cache > 0:
        return "KV cache for one sequence: " + _phase_problem(c, rollout, hw, seq_len)
    if bad:
        worst = max(bad, key=lambda p: _rollout_need(c, p))
        least = f", {worst.least / GIB:.1f} at the least" if worst.least else ""
        return (f"{worst.phase} memory: {_rollout_need(c, worst) / GIB:.1f} GiB/GPU{least} > "
                f"{hw.capacity_bytes / GIB:.1f} GiB ({_top(worst)})")
    return problems[0] if problems else ""


def _fix_lines(options: list[Option]) -> list[str]:
    if not options:
        return ["no setting verl exposes fits, even on 128x the nodes: use a smaller model, shorter "
                "prompt/response, or GPUs with more memory"]
    return [f"{'; '.join(o.changes) or 'as written'} → fits ({o.strategy}, TP {o.tp}, "
            f"{'no' if o.offload == 'none' else o.offload} offload, {o.peak_gib:.1f} GiB/GPU peak)" for o in options]


def _assemble(c: Candidate, s: Settings, shape: ModelShape, hw: Hardware, fill: float, reasons: list[str],
              warnings: list[str], problems: list[str], fixes: list[str], feasible: bool) -> Plan:
    cap = hw.capacity_bytes
    role_plans, slots = [], []
    for pool in c.pools:
        gpus = tuple((node, g) for node in pool.node_ids for g in pool.gpu_indices)
        pool_phases = [p for p in c.phases if p.pool == pool.name]
        peak_phase = max(pool_phases, key=lambda p: _rollout_need(c, p)) if pool_phases else None
        for role in pool.roles:
            phases = [p for p in pool_phases if p.role == role]
            role_plans.append(RolePlan(
                role=role, pool=pool.name, gpus=gpus,
                memory_gib_per_gpu=max((_rollout_need(c, p) for p in phases), default=0.0) / GIB,
                resident_gib=mem.total(c.resident.get(role, ())) / GIB,
                host_gib_per_gpu=mem.total(c.host.get(role, ())) / GIB,
                phases=tuple(PhasePlan(p.phase, p.micro, int(p.tokens),
                                       tuple(Component(x.name, x.bytes / GIB) for x in p.parts),
                                       p.working / GIB, _rollout_need(c, p) / GIB, p.fits,
                                       _rollout_note(c, p, s.seq_len), p.at_limit) for p in phases),
            ))
        for node, g in gpus:
            slots.append(GpuSlot(node, hw.hosts[node] if node < len(hw.hosts) else f"node{node}", g, pool.roles,
                                 (_rollout_need(c, peak_phase) if peak_phase else 0.0) / GIB,
                                 peak_phase.phase if peak_phase else "", (pool.capacity or cap) / GIB))
    role_plans.sort(key=lambda r: ROLE_ORDER.index(r.role))
    slots.sort(key=lambda x: (x.node, x.gpu))
    r = c.rollout
    host = host_parts(c, s, shape)
    st = step_time(c, s, shape, hw, fill)
    return Plan(
        feasible=feasible, strategy=c.strategy, model=shape.name, params=shape.params,
        hardware=_hw_short(hw), capacity_gib=cap / GIB, nnodes=hw.nnodes,
        gpus_per_node=hw.gpus_per_node, tp=c.tp, gpu_memory_utilization=c.util, offload=OFFLOAD_NAMES[c.offload],
        dtype=c.prec.train_dtype, attn=c.prec.attn, fill=fill, roles=tuple(role_plans), gpus=tuple(slots),
        overrides=build_overrides(c, s), reasons=tuple(reasons), warnings=tuple(warnings),
        problems=tuple(problems), fixes=tuple(fixes), host_gib_per_node=mem.total(host) / GIB,
        host_parts={p.name: p.gib for p in host}, host_worker_gib=mem.total(worker_parts(host)) / GIB,
        time=st.to_dict(host_table=True), terms={"time": st.terms, "host": host_terms(c)},
        tokens_full=s.sequences * s.seq_len,
        time_at=lambda f, host_table=False: step_time(c, s, shape, hw, f).to_dict(host_table),
        rollout_seqs_fit=r.seqs_fit if r else 0,
        host_mem_gib=None if hw.host_mem_bytes is None else hw.host_mem_bytes / GIB,
        rollout_seqs_wanted=wanted_concurrency(s, c.pools[0].size, c.tp),
        pools=tuple(PoolPlan(p.name, tuple(p.roles), tuple(hw.hosts[i] for i in p.node_ids), len(p.gpu_indices),
                             round((p.capacity or cap) / GIB, 1), p.resource) for p in c.pools),
    )
