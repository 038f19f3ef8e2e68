"""When a job does not fit as written: search what verl lets the user change and return the few best plans.

Each option is a changed job (batch shapes that divide the data-parallel size, fewer nodes, the planner choosing
what the job pinned, enforce_eager, Ulysses SP, dynamic batch size, more nodes as the last resort), planned by
the same search as the job itself, with its exact verl overrides and what it changes from the user's job.
Cheaper changes first: the batch the user asked for matters more than a knob verl only uses for speed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, Optional

from verl_cluster.enums import StrEnum
from verl_cluster.placement.envelope import with_range
from verl_cluster.placement.hardware import Hardware
from verl_cluster.placement.memory import GIB
from verl_cluster.placement.overrides import build_overrides
from verl_cluster.placement.host_memory import host_per_node
from verl_cluster.placement.step_time import step_time
from verl_cluster.placement.planner import OFFLOAD_NAMES, Candidate, Evaluator, Strategy, relaxed, search
from verl_cluster.placement.settings import AR, Settings

MAX_OPTIONS = 3
BATCH_KEY, MINI_KEY = "data.train_batch_size", f"{AR}.actor.ppo_mini_batch_size"


class OptionKind(StrEnum):
    """What an option changes; options shown are of different kinds first."""

    SETTINGS = "settings"  # how the step runs (micro batches, offload, levers)
    BATCH = "batch"
    NODES = "nodes"  # fewer of the job's nodes
    MORE_NODES = "more nodes"
    POOLS = "pools"  # verl resource pools by whole nodes
    LORA_NOT_ALLOWED = "lora (not allowed)"  # fits only with LoRA, which the job must allow first


@dataclass(frozen=True)
class Option:
    changes: tuple[str, ...]  # what differs from the user's job, in words
    overrides: dict[str, Any]  # every verl override of this plan (the changed job keys included)
    peak_gib: float
    strategy: Strategy
    tp: int
    offload: str
    cost: float  # how far from the user's job (lower is closer)
    kind: OptionKind = OptionKind.SETTINGS
    levers: frozenset = frozenset()  # the variant's own changes (an option needing more levers than another is
    # dominated by it)
    pool_nodes: tuple[int, ...] = ()  # nodes of each verl resource pool, in order
    step_s: float = 0.0  # predicted seconds per step (placement/step_time.py)
    s_per_seq: float = 0.0  # predicted seconds per trained sequence: what the options are ranked by
    adds_lora: bool = False  # trains LoRA adapters where the job trains the whole model
    error_bar: Optional[dict] = None  # the step's error bar (placement/envelope.py ErrorBar.to_dict())

    def to_dict(self) -> dict[str, Any]:
        out = {"changes": list(self.changes), "overrides": dict(self.overrides), "peak_gib": round(self.peak_gib, 2),
               "strategy": self.strategy, "tp": self.tp, "offload": self.offload, "kind": self.kind,
               "step_s": round(self.step_s, 2), "s_per_sequence": round(self.s_per_seq, 4),
               **({"error_bar": self.error_bar} if self.error_bar else {})}
        return with_range(out)


@dataclass(frozen=True)
class Variant:
    s: Settings
    hw: Hardware
    changes: tuple[str, ...]
    job_keys: tuple[tuple[str, Any], ...]  # verl keys the change sets in the job
    cost: float
    kind: OptionKind = OptionKind.SETTINGS
    adds_lora: bool = False


def batch_shapes(s: Settings, gpus: int, limit: int = 3) -> list[tuple[int, int]]:
    """(train_batch_size, ppo_mini_batch_size) closest to the user's such that train x n and mini x n divide
    over `gpus` data-parallel ranks (÷ SP for the mini batch) and the mini batch divides the train batch."""
    step_t = gpus // math.gcd(gpus, s.n)
    dp = gpus // s.sp_actor if gpus % s.sp_actor == 0 else gpus
    step_m = dp // math.gcd(dp, s.n)
    t0, m0 = s.train_batch_size, s.ppo_mini_batch_size
    near_t = sorted(range(step_t, 4 * t0 + step_t, step_t), key=lambda t: (abs(t - t0), t))[:6]
    pairs = []
    for t in near_t:
        minis = [m for m in range(step_m, t + 1, step_m) if t % m == 0]
        for m in sorted(minis, key=lambda m: (abs(m - m0), m))[:2]:
            pairs.append(((abs(t - t0) / t0 + abs(m - m0) / m0), t, m))
    pairs.sort()
    return [(t, m) for _, t, m in pairs[:limit] if (t, m) != (t0, m0)]


def batch_divides(s: Settings, gpus: int) -> bool:
    """verl's batch rules on one pool of `gpus`: train x n over the GPUs, mini x n over the data-parallel ranks."""
    return s.sequences % gpus == 0 and (s.ppo_mini_batch_size * s.n) % max(1, gpus // s.sp_actor) == 0


def _fewer_nodes(s: Settings, hw: Hardware) -> list[Variant]:
    out = []
    for k in range(hw.nnodes - 1, 0, -1):
        gpus = k * hw.gpus_per_node
        if batch_divides(s, gpus):
            out.append(Variant(s, hw.with_nodes(k), (f"use {k} of the {hw.nnodes} nodes ({gpus} GPUs): the batch "
                                                    f"divides over them",), (("trainer.nnodes", k),),
                               1.0 + 2.0 * (hw.nnodes - k) / hw.nnodes, OptionKind.NODES))
            break  # the most nodes that work; fewer would only be slower
    return out


def _bases(s: Settings, hw: Hardware, divisible: bool) -> list[Variant]:
    if divisible:
        return [Variant(s, hw, (), (), 0.0)]
    out = []
    for t, m in batch_shapes(s, hw.total_gpus):
        what = f"train/mini batch {s.train_batch_size}/{s.ppo_mini_batch_size} → {t}/{m}"
        out.append(Variant(replace(s, train_batch_size=t, ppo_mini_batch_size=m), hw,
                           (what + f" (divides over the {hw.total_gpus} GPUs)",), ((BATCH_KEY, t), (MINI_KEY, m)),
                           0.5 + abs(t - s.train_batch_size) / s.train_batch_size
                           + abs(m - s.ppo_mini_batch_size) / s.ppo_mini_batch_size, OptionKind.BATCH))
    return out + _fewer_nodes(s, hw)


def _ladder(v: Variant, heads: int, levers: bool = True) -> list[Variant]:
    """Steps for one base job, cheapest first: as it is, one memory lever (gradient checkpointing,
    enforce_eager, dynamic batch size, Ulysses SP 2/4/8), then the planner choosing what the job pinned, alone
    and with each lever."""
    steps = [v] + (_levers(v, heads) if levers else [])
    free = relaxed(relaxed(relaxed(v.s, "offload"), "micro"), "rollout")
    if free != v.s:
        base = Variant(free, v.hw, v.changes + ("the planner chooses offload, micro batches, token budgets, "
                                                "rollout TP and gpu_memory_utilization (the job pinned some)",),
                       v.job_keys, v.cost + 0.5, v.kind, v.adds_lora)
        steps += [base] + (_levers(base, heads) if levers else [])
    return steps


def _levers(base: Variant, heads: int) -> list[Variant]:
    b, out = base.s, []
    if not (b.grad_ckpt_actor and (b.grad_ckpt_critic or not b.critic)):
        keys = ((f"{AR}.model.enable_gradient_checkpointing", True),) + (
            (("critic.model.enable_gradient_checkpointing", True),) if b.critic else ())
        out.append(_with(base, replace(b, grad_ckpt_actor=True, grad_ckpt_critic=True),
                         "gradient checkpointing on (each layer recomputed in backward: ~1/3 more compute)",
                         *keys[0], 0.3, extra=keys[1:]))
    if not b.enforce_eager:
        out.append(_with(base, replace(b, enforce_eager=True), "rollout enforce_eager (no CUDA graphs: "
                         "slower generation, 0.5 GiB less)", f"{AR}.rollout.enforce_eager", True, 0.6))
    if not b.dynamic_bsz:
        out.append(_with(base, replace(b, dynamic_bsz=True), "dynamic batch size (micro batches by token "
                         "budget)", f"{AR}.actor.use_dynamic_bsz", True, 0.7))
    if b.allow_lora and not b.lora_rank:
        out.append(_lora(base))
    for sp in (2, 4, 8):
        if sp > b.sp_actor and heads % sp == 0 and base.hw.gpus_per_node % sp == 0:
            out.append(_with(base, replace(b, sp_actor=sp, sp_critic=sp if b.critic else b.sp_critic),
                             f"Ulysses sequence parallel {sp} (actor, ref{', critic' if b.critic else ''})",
                             f"{AR}.actor.ulysses_sequence_parallel_size", sp, 0.8 + sp / 10,
                             extra=(("critic.ulysses_sequence_parallel_size", sp),) if b.critic else ()))
    return out


def _lora(base: Variant, allowed: bool = True) -> Variant:
    """LoRA on the actor (and critic): adapters of placement.lora_rank on every linear layer, base frozen;
    verl's ref becomes the actor with its adapters off. It changes what is trained, so it costs more than any
    speed knob, and it is only applied when the job allows it (placement.allow_lora)."""
    b, r = base.s, base.s.lora_offer
    what = (f"LoRA rank {r} on all linear layers (adapters trained, base frozen; ref = actor without adapters)"
            + ("" if allowed else " — only if you allow it: it changes what is trained (placement.allow_lora=true)"))
    extra = (("critic.model.lora_rank", r),) if b.critic else ()
    return replace(_with(base, replace(b, lora_rank=r, critic_lora_rank=r if b.critic else 0), what,
                         f"{AR}.model.lora_rank", r, 1.5, extra=extra), adds_lora=True)


def _with(v: Variant, s: Settings, what: str, key: str, value: Any, cost: float, extra=()) -> Variant:
    return Variant(s, v.hw, v.changes + (what,), v.job_keys + ((key, value),) + tuple(extra), v.cost + cost, v.kind,
                   v.adds_lora)


def _more_nodes(s: Settings, hw: Hardware) -> list[Variant]:
    return [Variant(s, hw.with_nodes(hw.nnodes * k), (f"use {hw.nnodes * k * hw.gpus_per_node} GPUs "
                                                       f"({hw.nnodes * k} nodes x {hw.gpus_per_node})",),
                    (("trainer.nnodes", hw.nnodes * k),), 3.0 + math.log2(k), OptionKind.MORE_NODES)
            for k in (2, 4, 8, 16, 32, 64, 128)]


def find_options(ev: Evaluator, strategies: tuple[Strategy, ...], user: dict[str, Any],
                 divisible: bool) -> list[Option]:
    """The few best feasible changed jobs. `user`: the job's own verl overrides (to say what a plan changes)."""
    found: list[Option] = []
    for base in _bases(ev.s, ev.hw, divisible):
        for step in _ladder(base, ev.shape.heads):
            opt = _try(ev, step, strategies, user)
            if opt is not None:
                found.append(opt)
    pools = _node_pools(ev, strategies, user)
    if pools is not None:
        found.append(pools)
    if found:
        return pick(found)
    out = []
    for step in _more_nodes(ev.s, ev.hw):
        out = [o for v in _ladder(step, ev.shape.heads, levers=False) for o in [_try(ev, v, strategies, user)] if o]
        if out:
            out = out[:1]
            break
    if not ev.s.allow_lora and not ev.s.lora_rank:
        # nothing fits on these nodes without LoRA: say whether LoRA would, as an option the job must allow first
        for base in _bases(ev.s, ev.hw, divisible):
            opt = _try(ev, _lora(base, allowed=False), strategies, user)
            if opt is not None:
                out.append(replace(opt, kind=OptionKind.LORA_NOT_ALLOWED))
                break
    return _ranked(out)


def _node_pools(ev: Evaluator, strategies: tuple[Strategy, ...], user: dict[str, Any]) -> Optional[Option]:
    """verl resource pools by whole nodes (actor side on some nodes, critic/RM on the others) when the job's
    entrypoint is verl's stock trainer, which cannot build them: shown as a change of entrypoint."""
    s, hw = ev.s, ev.hw
    if s.split_placement or not (s.critic or s.reward_model) or hw.nnodes < 2 or Strategy.SPLIT_NODES not in strategies:
        return None
    pools = Variant(replace(s, split_placement=True), hw, ("pools",), (), 1.2, OptionKind.POOLS)
    opt = _try(ev, pools, (Strategy.SPLIT_NODES,), user)
    if opt is None:
        return None
    k = opt.pool_nodes[0]
    what = (f"actor/rollout/ref on {k} node(s), {'critic' if s.critic else 'reward model'} on the other "
            f"{hw.nnodes - k} (verl resource pools by whole nodes: needs an entrypoint that builds them, as verl's "
            "examples/split_placement does — verl.trainer.main_ppo puts every role in one pool)")
    return replace(opt, changes=(what,) + opt.changes[1:], levers=frozenset({what}))


def pick(found: list[Option], k: int = MAX_OPTIONS) -> list[Option]:
    """The k cheapest distinct options, the best of each kind first (2 of 3 nodes beside a new batch size)."""
    ranked, seen = [], set()
    found = [o for o in found if not any(p.levers < o.levers for p in found)]  # no needless extra change
    for o in sorted(found, key=lambda o: o.cost):
        key = tuple(sorted(o.overrides.items(), key=str))
        if key not in seen:
            seen.add(key)
            ranked.append(o)
    kinds = {}
    for o in ranked:
        kinds.setdefault(o.kind, o)
    chosen = list(kinds.values())[:k]
    chosen += [o for o in ranked if o not in chosen][:k - len(chosen)]
    return _ranked(chosen)


SAME_SPEED = 1.15  # options within this factor of the fastest count as equally fast (the time model's own spread)


def _ranked(options: list[Option]) -> list[Option]:
    """Fastest first by predicted seconds per trained sequence (a smaller batch is not "faster"): those within
    SAME_SPEED of the fastest by closeness to the job, slower ones by their time. An option the job must allow
    first (LoRA) comes after those it can take as it is."""
    fastest = min((o.s_per_seq for o in options if o.s_per_seq > 0), default=0.0)

    def key(o: Option) -> tuple:
        tier = 0.0 if o.s_per_seq <= fastest * SAME_SPEED else o.s_per_seq
        return (o.kind == OptionKind.LORA_NOT_ALLOWED, tier, o.cost)
    return sorted(options, key=key)


def _try(ev: Evaluator, v: Variant, strategies: tuple[Strategy, ...], user: dict[str, Any]) -> Optional[Option]:
    e = Evaluator(v.s, ev.shape, ev.rm_shape, v.hw, ev.prec, ev.fill)
    best, _ = search(e, strategies)
    if best is None or (v.hw.host_mem_bytes is not None and host_per_node(best, v.s, ev.shape) > v.hw.host_mem_bytes):
        return None
    ov = dict(v.job_keys)
    ov.update(build_overrides(best, v.s))
    changes = list(v.changes)
    for k, was in user.items():  # pinned values the plan overrides
        if k in ov and ov[k] != was and k not in dict(v.job_keys):
            changes.append(f"{k}: {was} → {ov[k]}")
    if best.offload:
        changes.append(f"{OFFLOAD_NAMES[best.offload]} offload")
    limit = [p.phase for p in best.phases if p.at_limit]
    if limit:
        changes.append(f"{', '.join(limit)} at the GPU's limit")
    st = step_time(best, v.s, ev.shape, v.hw, ev.fill)
    # a plan with room beats one at the limit (longer sequences than planned would fail there)
    return Option(tuple(changes), ov, _peak(best) / GIB, best.strategy, best.tp, OFFLOAD_NAMES[best.offload],
                  v.cost + 0.4 * best.offload + (1.0 if limit else 0.0), v.kind, frozenset(v.changes),
                  tuple(p.nnodes for p in best.pools), st.step_s, st.step_s / max(1, v.s.sequences), v.adds_lora,
                  st.bar.to_dict() if st.bar else None)


def _peak(c: Candidate) -> float:
    return max((p.peak for p in c.phases), default=0.0)
