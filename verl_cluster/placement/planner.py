"""The search: for each strategy, TP size and offload level, the largest micro batches whose phases fit.

Cost order (cheapest first): least offload, TP groups inside P2P islands, strategy (colocate first),
rollout KV cache holding the wanted concurrency, largest actor micro batch, smallest TP.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Callable, Optional

from verl_cluster.enums import StrEnum
import verl_cluster.placement.memory as mem
from verl_cluster.placement.hardware import Hardware
from verl_cluster.placement.lengths import micro_tokens
from verl_cluster.placement.memory import GIB, Part, TrainInputs
from verl_cluster.placement.model_shape import ModelShape
from verl_cluster.placement.settings import Settings



class Strategy(StrEnum):
    """How the roles share the GPUs (cheapest first); the value is what plans print and jobs name."""

    COLOCATE = "colocate"  # every role on every GPU (verl's hybrid engine, one pool)
    SPLIT = "split"  # half of every node each (verl examples/split_placement)
    SEPARATE_REWARD = "separate-reward"  # the reward model on its own GPUs on every node
    SPLIT_NODES = "split-nodes"  # whole nodes per pool


STRATEGIES = tuple(Strategy)


class Phase(StrEnum):
    """A step's phases the planner sizes, as plans print them."""

    GENERATE = "generate"
    ACTOR_LOG_PROB = "actor log-prob"
    REF_LOG_PROB = "ref log-prob"
    CRITIC_VALUES = "critic values"
    CRITIC_UPDATE = "critic update"
    ACTOR_UPDATE = "actor update"
    REWARD = "reward"
OFFLOAD_LEVELS = ((False, False), (False, True), (True, True))  # (param, optimizer) for actor and critic
OFFLOAD_NAMES = ("none", "optimizer", "param+optimizer")
UTIL_DEFAULT = 0.5  # verl's rollout.gpu_memory_utilization default
UTIL_STEP = 0.05
UTIL_MIN = 0.1


@dataclass(frozen=True)
class Precision:
    c: int  # compute dtype bytes
    train_dtype: str  # bfloat16 | float16 | float32 (fsdp_config.dtype)
    rollout_dtype: str
    attn: str  # flash_attention_2 | sdpa | eager
    remove_padding: bool  # verl's use_remove_padding needs flash-attn varlen kernels


@dataclass(frozen=True)
class Pool:
    name: str  # verl resource pool name
    gpu_indices: tuple[int, ...]  # GPU indices used on every node
    nnodes: int
    roles: tuple[str, ...]
    nodes: tuple[int, ...] = ()  # the node indices it uses (empty: nodes 0 .. nnodes-1)
    capacity: float = 0.0  # its smallest GPU's memory (0: the hardware's smallest)
    resource: str = ""  # Ray custom resource that pins it to its nodes (split-nodes)

    @property
    def size(self) -> int:
        return len(self.gpu_indices) * self.nnodes

    @property
    def node_ids(self) -> tuple[int, ...]:
        return self.nodes or tuple(range(self.nnodes))


# parts not in the default stream's cache: persistent states, and the pools of FSDP's post-backward (gradients,
# their fp32 reduce copy) and unshard (gathered weights) streams
OTHER_POOLS = ("params", "adam", "grads", "grad reduce", "gathered")
# verl's order of the trainer phases within a step (the rollout comes first and empties the cache)
STEP_ORDER = (Phase.ACTOR_LOG_PROB, Phase.REF_LOG_PROB, Phase.CRITIC_VALUES, Phase.CRITIC_UPDATE, Phase.ACTOR_UPDATE)
CRITIC_PHASES = (Phase.CRITIC_UPDATE, Phase.CRITIC_VALUES)


@dataclass(frozen=True)
class PhaseResult:
    role: str
    phase: Phase
    pool: str
    micro: Optional[int]  # None: dynamic batch size (token budget) or not applicable
    tokens: float
    parts: tuple[Part, ...]
    others_resident: float
    peak: float
    fits: bool
    note: str = ""
    bigger: Optional[tuple[int, float]] = None  # the next larger micro batch / token budget tried, and its peak
    least: float = 0.0  # torch phases: what it needs with the allocator at the GPU's limit (live tensors, context)
    at_limit: bool = False  # fits only at the limit: the reserved peak with room is over the GPU's memory
    limit_why: str = ""  # at_limit: why it still runs there (the note says it too)

    @property
    def working(self) -> float:
        return mem.total(self.parts)


@dataclass
class Candidate:
    strategy: Strategy
    pools: tuple[Pool, ...]
    tp: int
    offload: int
    util: float
    prec: Precision
    phases: list[PhaseResult] = field(default_factory=list)
    resident: dict[str, tuple[Part, ...]] = field(default_factory=dict)  # role -> GPU parts kept between phases
    host: dict[str, tuple[Part, ...]] = field(default_factory=dict)  # role -> host parts per GPU
    rollout: Optional[mem.RolloutMemory] = None
    problems: list[str] = field(default_factory=list)
    crosses_islands: bool = False
    token_budget: dict[str, int] = field(default_factory=dict)

    @property
    def feasible(self) -> bool:
        return not self.problems and all(p.fits for p in self.phases)

    def micro(self, phase: Phase) -> Optional[int]:
        return next((p.micro for p in self.phases if p.phase == phase), None)

    def cost(self, kv_wanted: int) -> tuple:
        short = self.rollout is not None and self.rollout.seqs_fit < kv_wanted
        # split-nodes: the actor side (rollout and update, the heavier work) gets the most nodes that fit
        actor_side = -self.pools[0].size if self.strategy == Strategy.SPLIT_NODES else 0
        # room first: a phase at the GPU's limit is the first to fail when real sequences run longer than planned
        at_limit = any(p.at_limit for p in self.phases)
        return (at_limit, self.offload, self.crosses_islands, STRATEGIES.index(self.strategy), short, actor_side,
                -(self.micro(Phase.ACTOR_UPDATE) or 0), self.tp, -self.util)


def choose_precision(s: Settings, hw: Hardware) -> tuple[Precision, list[str], list[str]]:
    """bf16 needs SM ≥ 8.0; flash_attention_2 needs SM ≥ 8.0 and a working flash-attn."""
    reasons, warnings = [], []
    sm = f"{hw.sm[0]}.{hw.sm[1]}"
    if s.train_dtype:
        dtype = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}.get(s.train_dtype, s.train_dtype)
        reasons.append(f"dtype {dtype}: pinned by the job")
        if dtype == "bfloat16" and hw.sm < (8, 0):
            warnings.append(f"the job pins bfloat16 but SM {sm} < 8.0 has no bf16 support: expect a CUDA error")
    elif hw.sm >= (8, 0):
        dtype = "bfloat16"
        reasons.append(f"dtype bfloat16: SM {sm} ≥ 8.0 supports bf16 (verl's default)")
    else:
        dtype = "float32"
        reasons.append(f"dtype float32: SM {sm} < 8.0 has no bf16; float16 would halve activations but risks "
                       "overflow in RL losses (pin +actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype"
                       "=fp16 to try it)")
    c = 4 if dtype == "float32" else 2
    rollout_dtype = dtype
    if s.attn_implementation:
        attn = s.attn_implementation
        reasons.append(f"attention {attn}: pinned by the job")
        if attn.startswith("flash") and (hw.sm < (8, 0) or hw.flash_attn is False):
            warnings.append(f"the job pins {attn}, but {hw.flash_attn_note if hw.flash_attn is False else f'SM {sm} < 8.0'}")
    elif hw.sm < (7, 0):
        attn = "eager"
        reasons.append(f"attention eager: SM {sm} < 7.0 (no flash-attn; torch's fused SDPA kernels are not built "
                       "for it, so eager is the predictable path)")
    elif hw.sm < (8, 0):
        attn = "sdpa"
        reasons.append(f"attention sdpa: flash_attention_2 needs SM ≥ 8.0, this is SM {sm}")
    elif hw.flash_attn is False:
        attn = "sdpa"
        reasons.append(f"attention sdpa: {hw.flash_attn_note}")
    else:
        attn = "flash_attention_2"
        reasons.append(f"attention flash_attention_2 ({hw.flash_attn_note})")
    rmpad = attn.startswith("flash")
    if not rmpad and (s.remove_padding_actor or s.remove_padding_critic):
        reasons.append("use_remove_padding off: verl's padding-free path needs flash-attn's varlen kernels; "
                       "sequences are padded to prompt+response")
    if hw.sm < (7, 0) and s.rollout_name == "vllm":
        warnings.append(f"vLLM officially needs SM ≥ 7.0 (this is SM {sm}): use a build for this GPU or an older "
                        "verl with rollout.name=hf")
    return Precision(c, dtype, rollout_dtype, attn, rmpad), reasons, warnings


def make_pools(strategy: Strategy, s: Settings, hw: Hardware) -> list[tuple[Pool, ...]]:
    g, nn = hw.gpus_per_node, hw.nnodes
    everyone = tuple(r for r in ("actor", "rollout", "ref", "critic", "reward") if _has(s, r))
    if strategy == Strategy.COLOCATE:
        return [(Pool("global_pool", tuple(range(g)), nn, everyone),)]
    if strategy == Strategy.SPLIT:  # verl examples/split_placement: half of every node each
        if not s.split_placement or not (s.critic or s.reward_model) or g < 2 or g % 2:
            return []
        first = tuple(r for r in everyone if r in ("actor", "rollout", "ref"))
        second = tuple(r for r in everyone if r in ("critic", "reward"))
        return [(Pool("actor_rollout_ref_pool", tuple(range(g // 2)), nn, first),
                 Pool("critic_pool", tuple(range(g // 2, g)), nn, second))]
    if strategy == Strategy.SPLIT_NODES:  # whole nodes per pool: actor/rollout/ref on some, critic/RM on the others
        if not s.split_placement or not (s.critic or s.reward_model) or nn < 2:
            return []
        first = tuple(r for r in everyone if r in ("actor", "rollout", "ref"))
        second = tuple(r for r in everyone if r in ("critic", "reward"))
        out = []
        if len(hw.kinds) >= 2:  # mixed nodes: the k largest GPU kinds for the actor side, pinned by Ray resources
            for k in range(1, len(hw.kinds)):
                big, small = hw.kinds[:k], hw.kinds[k:]
                nb = tuple(sorted(i for kind in big for i in kind.nodes))
                ns = tuple(sorted(i for kind in small for i in kind.nodes))
                out.append((Pool("actor_rollout_ref_pool", tuple(range(g)), len(nb), first, nb,
                                 min(x.capacity_bytes for x in big), _resource(big)),
                            Pool("critic_pool", tuple(range(g)), len(ns), second, ns,
                                 min(x.capacity_bytes for x in small), _resource(small))))
            return out
        # alike nodes (no pinning needed): the most actor nodes over which both pools' batches divide, and a half
        fits = [k for k in range(nn - 1, 0, -1) if s.sequences % (k * g) == 0 and s.sequences % ((nn - k) * g) == 0]
        for k in sorted(set(fits[:1] + [k for k in fits if k == nn // 2])):
            out.append((Pool("actor_rollout_ref_pool", tuple(range(g)), k, first, tuple(range(k))),
                        Pool("critic_pool", tuple(range(g)), nn - k, second, tuple(range(k, nn)))))
        return out
    if strategy == Strategy.SEPARATE_REWARD:  # reward_model.enable_resource_pool: its own GPUs on every node
        if not s.reward_model or g < 2:
            return []
        main = tuple(r for r in everyone if r != "reward")
        out = []
        for k in sorted({1, 2, g // 4, g // 2} - {0}):
            if k < g:
                out.append((Pool("global_pool", tuple(range(g - k)), nn, main),
                            Pool("reward_pool", tuple(range(g - k, g)), nn, ("reward",))))
        return out
    raise ValueError(strategy)


def _resource(kinds) -> str:
    return kinds[0].resource if len(kinds) == 1 else "+".join(k.resource for k in kinds)


def _has(s: Settings, role: str) -> bool:
    return {"actor": True, "rollout": True, "ref": s.ref, "critic": s.critic, "reward": s.reward_model}[role]


MICRO_CAP = 64  # larger micro batches gain little throughput and leave no room for length variance


def _divisors_desc(n: int, cap: int = MICRO_CAP) -> list[int]:
    return [d for d in range(min(n, cap), 0, -1) if n % d == 0]


class Evaluator:
    """Evaluates candidates for one (job, model, hardware, fill)."""

    def __init__(self, s: Settings, shape: ModelShape, rm_shape: ModelShape, hw: Hardware, prec: Precision,
                 fill: float):
        self.s, self.shape, self.rm_shape, self.hw, self.prec, self.fill = s, shape, rm_shape, hw, prec, fill
        self.cap = hw.capacity_bytes
        # LoRA adapters' parameter counts (0: full fine-tuning)
        self.actor_adapter = shape.lora_params(s.lora_rank, s.lora_targets) if s.lora_rank else 0
        self.critic_adapter = shape.lora_params(s.critic_lora_rank, s.lora_targets) if s.critic_lora_rank else 0

    def cap_of(self, pool: Pool) -> float:
        return pool.capacity or self.cap

    # -- tokens per micro batch on one GPU --
    def tokens(self, micro: int, *, rmpad: bool, sp: int) -> float:
        fill = self.fill if (rmpad and self.prec.remove_padding) else 1.0
        return micro * self.s.seq_len * fill / sp

    def batch_rules(self, pool: Pool, roles: tuple[str, ...]) -> list[str]:
        s, n = self.s, pool.size
        out = []
        if s.sequences % n:
            good = math.lcm(n, s.n) // s.n
            out.append(f"data.train_batch_size x rollout.n = {s.train_batch_size} x {s.n} = {s.sequences} is not "
                       f"divisible by the {n} GPUs of {pool.name}: use a train_batch_size that is a multiple of {good}")
        sp = s.sp_critic if "critic" in roles and "actor" not in roles else s.sp_actor
        if (s.ppo_mini_batch_size * s.n) % (n // sp if n % sp == 0 else n):
            out.append(f"ppo_mini_batch_size x n = {s.ppo_mini_batch_size * s.n} is not divisible by the {n // sp} "
                       f"data-parallel ranks of {pool.name} (verl's per-GPU mini batch must be whole)")
        if s.dynamic_bsz or out:
            return out
        # verl 0.9's engine splits a data-parallel rank's batch into equal micro batches (it asserts the
        # division); with Ulysses SP a rank is sp GPUs, so it holds sp times the per-GPU share
        a, cr = s.sp_actor, s.sp_critic
        per_gpu, mini = s.sequences // n, s.ppo_mini_batch_size * s.n // n
        for role, key, pinned, whole in (
                ("actor", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu", s.actor_micro, mini * a),
                ("actor", "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu", s.logprob_micro, per_gpu * a),
                ("ref", "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu", s.ref_micro, per_gpu * a),
                ("critic", "critic.ppo_micro_batch_size_per_gpu", s.critic_micro, mini * cr),
                ("critic", "critic.forward_micro_batch_size_per_gpu", s.critic_fwd_micro, per_gpu * cr)):
            if role == "critic" and s.critic_packs:  # verl 0.9 packs its critic by tokens: no division asserted
                continue
            if role in roles and pinned and whole and whole % pinned:
                fits = [d for d in range(min(pinned, whole), 0, -1) if whole % d == 0][0]
                out.append(f"{key}={pinned} does not divide the {whole} sequences each data-parallel rank of {pool.name} gets "
                           f"(verl asserts it does): use {fits} or unset it and let the plan choose")
        return out

    def evaluate(self, strategy: Strategy, pools: tuple[Pool, ...], tp: int, offload: int) -> Candidate:
        s, shape, prec = self.s, self.shape, self.prec
        c = Candidate(strategy, pools, tp, offload, s.gpu_memory_utilization or UTIL_DEFAULT, prec)
        param_off, opt_off = OFFLOAD_LEVELS[offload]
        for pool in pools:
            c.problems += self.batch_rules(pool, pool.roles)
        main = pools[0]
        g = len(main.gpu_indices)
        # verl ≥ 0.6 (workers/rollout/replica.py): a replica of TP x DP x PP GPUs spans world_size / gpus_per_node
        # whole nodes when it is larger than one node
        if main.size % tp or (g % tp if tp <= g else tp % g):
            c.problems.append(f"rollout TP {tp} must divide the {g} GPUs per node of {main.name}, or be a multiple "
                              f"of them that divides its {main.size} GPUs (verl's replica spans whole nodes)")
        c.crosses_islands = tp > 1 and self.hw.tp_crosses_islands(tp, main.gpu_indices)
        # residents (what each role keeps on the GPU between its phases) and host memory
        for pool in pools:
            n = pool.size
            for role in pool.roles:
                if role in ("actor", "critic"):
                    params = shape.params if role == "actor" else shape.value_model_params
                    m = s.master_dtype_bytes_actor if role == "actor" else s.master_dtype_bytes_critic
                    gpu, host = mem.trainable_resident(params, n, m, param_offload=param_off, optimizer_offload=opt_off,
                                                       adapter=self.actor_adapter if role == "actor" else self.critic_adapter)
                elif role == "ref" and self.actor_adapter:  # LoRA: the ref is the actor with adapters off
                    gpu, host = (), ()
                elif role == "ref":  # verl forces FSDP CPUOffload on the ref: params live on the host
                    gpu, host = (), (Part("params", shape.params * s.master_dtype_bytes_actor / n),)
                elif role == "reward":  # same for the FSDP reward model (bf16 weights)
                    gpu, host = (), (Part("params", self.rm_shape.value_model_params * 2 / n),)
                else:  # rollout sleeps between generations: weights and KV cache released, a residue stays;
                    # nothing of it stays on the host (the H100 runs' sampled RSS and Shmem of vLLM's processes)
                    gpu, host = (Part("vLLM asleep", mem.VLLM_ASLEEP_BYTES),), ()
                c.resident[role] = gpu
                c.host[role] = host
        for pool in pools:
            self._pool_phases(c, pool, tp)
        return c

    def _others(self, c: Candidate, pool: Pool, role: str) -> float:
        return sum(mem.total(c.resident[r]) for r in pool.roles if r != role)

    def _pool_phases(self, c: Candidate, pool: Pool, tp: int) -> None:
        s, shape, prec = self.s, self.shape, self.prec
        n = pool.size
        per_gpu_batch = max(1, s.sequences // n)  # per data-parallel rank: x sp (Ulysses ranks share sequences)
        _, opt_off = OFFLOAD_LEVELS[c.offload]
        if "rollout" in pool.roles:
            self._rollout(c, pool, tp)
        todo: list[tuple[tuple, dict]] = []

        def later(*args, **kw) -> None:
            todo.append((args, kw))
        # actor and ref run the same model with the same settings
        actor_base = dict(shape=shape, params=shape.params, n=n, seq=s.seq_len, c=prec.c,
                          m=s.master_dtype_bytes_actor, attn=prec.attn, vocab_out=shape.vocab, verl_engine=True,
                          fused_ce=prec.attn.startswith("flash"))  # flash-attn on the nodes: its Triton CE
        actor_extra: tuple[Part, ...] = ()
        if "actor" in pool.roles:
            o = _adam(shape.params, self.actor_adapter, n, s.master_dtype_bytes_actor)
            extra = actor_extra = () if opt_off else (o,)  # grads are None outside the update step
            base = actor_base
            mb_gpu = max(1, s.ppo_mini_batch_size * s.n * s.sp_actor // n)
            later(c, pool, "actor", Phase.ACTOR_UPDATE, s.actor_micro, _divisors_desc(mb_gpu), mb_gpu,
                  lambda mb, t, base=base: mem.update_step(TrainInputs(
                      tokens=t, micro=mb, grad_ckpt=s.grad_ckpt_actor, adapter=self.actor_adapter, **base)),
                  rmpad=s.remove_padding_actor, sp=s.sp_actor, budget=s.actor_max_tokens,
                  budget_pinned=s.actor_tokens_pinned)
            later(c, pool, "actor", Phase.ACTOR_LOG_PROB, s.logprob_micro, _divisors_desc(per_gpu_batch * s.sp_actor),
                  per_gpu_batch * s.sp_actor,
                  lambda mb, t, base=base, extra=extra: mem.forward_phase(
                      TrainInputs(tokens=t, micro=mb, grad_ckpt=False, **base), params_on_gpu=True, extra=extra),
                  rmpad=s.remove_padding_actor, sp=s.sp_actor, budget=s.actor_max_tokens)
        if "ref" in pool.roles:
            base = actor_base
            # LoRA: the actor's own module with its adapters off computes the ref log-probs (its params and
            # Adam states are on the GPU, so they are not counted again as the actor's resident)
            in_actor = bool(self.actor_adapter) and "actor" in pool.roles
            later(c, pool, "ref", Phase.REF_LOG_PROB, s.ref_micro, _divisors_desc(per_gpu_batch * s.sp_actor),
                  per_gpu_batch * s.sp_actor,
                  lambda mb, t, base=base, in_actor=in_actor: mem.forward_phase(
                      TrainInputs(tokens=t, micro=mb, grad_ckpt=False, **base), params_on_gpu=in_actor,
                      extra=actor_extra if in_actor else ()),
                  rmpad=s.remove_padding_actor, sp=s.sp_actor, budget=s.actor_max_tokens,
                  others_as="actor" if in_actor else "ref")
        if "critic" in pool.roles:
            root = shape.embed_params + 2 * shape.hidden
            o = _adam(shape.value_model_params, self.critic_adapter, n, s.master_dtype_bytes_critic)
            extra = () if opt_off else (o,)
            base = dict(shape=shape, params=shape.value_model_params, n=n, seq=s.seq_len, c=prec.c,
                        m=s.master_dtype_bytes_critic, attn=prec.attn, vocab_out=1, root_params=root,
                        verl_engine=True)
            mb_gpu = max(1, s.ppo_mini_batch_size * s.n * s.sp_critic // n)
            # verl 0.9's critic packs by tokens (Settings.critic_packs): its budget, not its micro batch, is planned
            upd, upd_pinned = s.critic_budget(update=True)
            val, val_pinned = s.critic_budget(update=False)
            later(c, pool, "critic", Phase.CRITIC_UPDATE, s.critic_micro, _divisors_desc(mb_gpu), mb_gpu,
                  lambda mb, t, base=base: mem.update_step(TrainInputs(
                      tokens=t, micro=mb, grad_ckpt=s.grad_ckpt_critic, adapter=self.critic_adapter, **base)),
                  rmpad=s.remove_padding_critic, sp=s.sp_critic, budget=upd, budget_pinned=upd_pinned,
                  packs=s.critic_packs)
            later(c, pool, "critic", Phase.CRITIC_VALUES, s.critic_fwd_micro,
                  _divisors_desc(per_gpu_batch * s.sp_critic), per_gpu_batch * s.sp_critic,
                  lambda mb, t, base=base, extra=extra: mem.forward_phase(
                      TrainInputs(tokens=t, micro=mb, grad_ckpt=False, **base), params_on_gpu=True, extra=extra),
                  rmpad=s.remove_padding_critic, sp=s.sp_critic, budget=val, budget_pinned=val_pinned,
                  packs=s.critic_packs)
        if "reward" in pool.roles:
            rm = self.rm_shape
            base = dict(shape=rm, params=rm.value_model_params, n=n, seq=s.seq_len, c=prec.c, m=2, attn=prec.attn,
                        vocab_out=1, root_params=rm.embed_params + 2 * rm.hidden)
            later(c, pool, "reward", Phase.REWARD, s.reward_micro, _divisors_desc(per_gpu_batch), per_gpu_batch,
                  lambda mb, t, base=base: mem.forward_phase(
                      TrainInputs(tokens=t, micro=mb, grad_ckpt=False, **base), params_on_gpu=False),
                  rmpad=False, sp=1, budget=None)

        # verl's order within a step, each phase holding what the earlier ones left in the shared allocator;
        # shown in the order above
        shown = [args[3] for args, _ in todo]
        self._run_phases(c, todo)
        low = self._shared_critic_budget(c)
        if low is not None:  # verl 0.9's v1 trainer runs both critic passes under one key: plan both at the smaller
            c.phases[:] = [ph for ph in c.phases if not (ph.pool == pool.name and ph.phase in shown)]
            for args, kw in todo:
                if args[3] in CRITIC_PHASES:
                    kw.update(budget=low, budget_pinned=True)
            self._run_phases(c, todo)
        mine = [ph for ph in c.phases if ph.pool == pool.name and ph.phase in shown]
        rest = [ph for ph in c.phases if not (ph.pool == pool.name and ph.phase in shown)]
        c.phases[:] = rest + sorted(mine, key=lambda ph: shown.index(ph.phase))

    def _run_phases(self, c: Candidate, todo: list[tuple[tuple, dict]]) -> None:
        carried = 0.0
        for args, kw in sorted(todo, key=lambda t: STEP_ORDER.index(t[0][3]) if t[0][3] in STEP_ORDER else 99):
            ph = self._search(*args, carried=carried, **kw)
            if ph.fits:  # a phase that does not fit is where the step fails: nothing after it runs
                carried = max(carried, _default_stream(ph.parts))

    def _shared_critic_budget(self, c: Candidate) -> Optional[int]:
        """The smaller of the packed critic's two budgets when they differ and one key sets both (else None)."""
        if not (self.s.critic_packs and self.s.critic_v1):
            return None
        got = {c.token_budget[p] for p in CRITIC_PHASES if p in c.token_budget}
        return min(got) if len(got) > 1 else None

    def _search(self, c: Candidate, pool: Pool, role: str, phase: Phase, pinned: Optional[int], candidates: list[int],
                whole: int, parts_of: Callable[[int, float], "tuple[Part, ...] | mem.UpdateStep"], *, rmpad: bool, sp: int,
                budget: Optional[int], budget_pinned: bool = False, others_as: Optional[str] = None,
                carried: float = 0.0, packs: bool = False) -> PhaseResult:
        """Largest micro batch that fits (or the pinned one); with dynamic batch size the token budget (the
        job's, when it sets one for an update). `others_as`: the role whose process runs the phase, when not
        `role`. `carried`: the default-stream cache earlier phases of the step left in the shared allocator,
        which this phase's own transient reuses (docs/placement.md, "shared allocator"). `packs`: verl packs this
        phase by tokens whatever its micro batch setting (verl 0.9's critic)."""
        others = self._others(c, pool, others_as or role)
        dynamic = (self.s.dynamic_bsz or packs) and budget is not None
        if dynamic:
            budgets = [budget] if budget_pinned else _token_budgets(budget, self.s.seq_len)
            # the budget caps a micro batch, the rank's real tokens fill it (verl's prepare_micro_batches)
            most = self.tokens(whole, rmpad=rmpad, sp=sp)
            tries = [(None, micro_tokens(most, b, self.s.seq_len / sp)) for b in budgets]
            budget_of: dict[float, int] = {}
            for (_, t), b in zip(tries, budgets):
                budget_of.setdefault(t, b)  # the largest budget giving those tokens
        elif pinned is not None:
            tries = [(pinned, self.tokens(pinned, rmpad=rmpad, sp=sp))]
        else:
            tries = [(mb, self.tokens(mb, rmpad=rmpad, sp=sp)) for mb in candidates]
        last, bigger, cap = None, None, self.cap_of(pool)
        tight: Optional[PhaseResult] = None  # a try that fits only with the allocator at the limit
        for mb, toks in tries:
            got = parts_of(mb or 1, toks)
            parts, live = (got.parts, got.allocated) if isinstance(got, mem.UpdateStep) else (got, mem.total(got))
            own = mem.gpu_peak(mem.total(parts), others)  # without what earlier phases left cached
            if carried > _default_stream(parts):
                parts += (Part("cached from earlier phases", carried - _default_stream(parts)),)
            peak = mem.gpu_peak(mem.total(parts), others)
            least = mem.pressure_need(live, others) if self.s.at_limit else 0.0  # 0: plans with room only
            # earlier phases' cached blocks are given back when memory runs short (both allocators free their
            # cache and retry before failing): they fill the GPU up to its memory but never make a phase fail
            last = PhaseResult(role, phase, pool.name, mb, toks, parts, others, min(peak, max(own, cap)), own <= cap,
                               "", bigger, least)
            if last.fits:
                break
            if 0 < least <= cap:  # at the limit, the smallest micro batch / budget: the most room left
                why = _tight_why(own, least, cap)
                tight = replace(last, peak=cap, fits=True, at_limit=True, note=f"at the GPU's limit: {why}",
                                limit_why=why)
            bigger = (mb if mb is not None else int(toks), peak)
        assert last is not None
        if not last.fits and tight is not None:  # nothing fits with room to spare
            last = tight
        if dynamic and last.fits:  # a pinned budget stays as the job wrote it (fewer tokens only hold it less full)
            # verl asserts a budget holds the longest sequence. A packed critic's one key serves both its passes
            # (overrides take the smaller): the largest budget that fit, not the tokens this phase's batch reached
            c.token_budget[phase] = int(budget) if budget_pinned else (
                budget_of[last.tokens] if packs else max(int(last.tokens), math.ceil(self.s.seq_len / sp)))
        c.phases.append(last)
        return last

    def _rollout(self, c: Candidate, pool: Pool, tp: int) -> None:
        s, shape = self.s, self.shape
        others = self._others(c, pool, "rollout")
        total = cap = self.cap_of(pool)
        colocated = any(r != "rollout" for r in pool.roles)
        in_flight = min(s.max_num_seqs, max(1, s.sequences * tp // pool.size))  # per vLLM replica (TP group)
        workspace = mem.sampler_workspace(shape, in_flight)
        room = (cap - mem.VLLM_CONTEXT_BYTES - workspace - (mem.CUDA_CONTEXT_BYTES if colocated else 0.0)
                - others * (1 + mem.ALLOCATOR_MARGIN)) / total
        if s.gpu_memory_utilization is not None:
            util = s.gpu_memory_utilization
        else:
            util = UTIL_DEFAULT
            if room < util:
                util = math.floor(max(room, 0) / UTIL_STEP + 1e-9) * UTIL_STEP
        util = round(util, 2)
        c.util = util
        r = mem.rollout_memory(shape, total_bytes=total, util=max(util, 0.0), tp=tp,
                               dtype_bytes=self.prec.c, seq=s.seq_len, max_num_seqs=s.max_num_seqs,
                               max_num_batched_tokens=s.max_num_batched_tokens, enforce_eager=s.enforce_eager,
                               in_flight=in_flight, adapter_params=self.actor_adapter)
        c.rollout = r
        peak = mem.rollout_peak(r, others, colocated=colocated)
        fits = peak <= cap and util >= UTIL_MIN - 1e-9 and r.seqs_fit >= 1
        note = ""
        if r.seqs_fit < 1:
            note = (f"KV cache {r.kv_cache / GIB:.2f} GiB holds no full {s.seq_len}-token sequence "
                    f"({r.kv_per_seq / GIB:.3f} GiB each) at gpu_memory_utilization {util}")
        elif peak > cap:
            note = f"gpu_memory_utilization {util} x {total / GIB:.1f} GiB plus what other roles keep resident"
        c.phases.append(PhaseResult("rollout", Phase.GENERATE, pool.name, None, float(s.seq_len), r.parts, others, peak,
                                    fits, note))


def _tight_why(peak: float, need: float, cap: float) -> str:
    return (f"{need / GIB:.1f} GiB of live tensors (with context and others' states) fit in "
            f"{cap / GIB:.1f} GiB, the {peak / GIB:.1f} GiB the allocator would reserve with room do not; it runs "
            "because verl trains with expandable_segments (the allocator gives its cache back at the limit)")


def _default_stream(parts: tuple[Part, ...]) -> float:
    return sum(p.bytes for p in parts if p.name not in OTHER_POOLS and p.name != "cached from earlier phases")


def _adam(params: int, adapter: int, n: int, m: int) -> Part:
    """The AdamW states a trainable role keeps on the GPU between its phases (the adapters' alone with LoRA)."""
    return (mem.lora_states(params, adapter, n, m) if adapter else mem.fsdp_states(params, n, m, trainable=True))[2]


def _token_budgets(start: int, seq: int) -> list[int]:
    out, b = [], start
    while b >= seq:
        out.append(b)
        b //= 2
    return out or [seq]


def wanted_concurrency(s: Settings, pool_size: int, tp: int) -> int:
    replicas = max(1, pool_size // tp)
    return min(s.max_num_seqs, math.ceil(s.sequences / replicas))


def search(ev: Evaluator, strategies: tuple[Strategy, ...]) -> tuple[Optional[Candidate], list[Candidate]]:
    """All candidates of the given strategies; the cheapest feasible one (or None) and every candidate."""
    s, hw = ev.s, ev.hw
    tried: list[Candidate] = []
    for strategy in strategies:
        for pools in make_pools(strategy, s, hw):
            g = len(pools[0].gpu_indices)
            if s.tp is not None:
                tps = [s.tp]
            else:
                tps = [t for t in _divisors_desc(g, g)[::-1]
                       if ev.shape.heads % t == 0 and (ev.shape.kv_heads % t == 0 or t % ev.shape.kv_heads == 0)]
            pinned_off = _pinned_offload(s)
            levels = [pinned_off] if pinned_off is not None else range(len(OFFLOAD_LEVELS))
            for tp in tps:
                for lvl in levels:
                    tried.append(ev.evaluate(strategy, pools, tp, lvl))
    feasible = [c for c in tried if c.feasible]
    if not feasible:
        return None, tried
    best = min(feasible, key=lambda c: c.cost(wanted_concurrency(s, c.pools[0].size, c.tp)))
    return best, tried


def _pinned_offload(s: Settings) -> Optional[int]:
    flags = [s.actor_param_offload, s.actor_optimizer_offload, s.critic_param_offload, s.critic_optimizer_offload]
    if all(f is None for f in flags):
        return None
    param = bool(s.actor_param_offload or s.critic_param_offload)
    opt = bool(s.actor_optimizer_offload or s.critic_optimizer_offload)
    return 2 if param else (1 if opt else 0)


def closest(tried: list[Candidate], cap: float) -> Candidate:
    """The infeasible candidate that misses by the least (to show its numbers)."""
    def miss(c: Candidate) -> tuple:
        over = max([p.peak - cap for p in c.phases if not p.fits] or [0.0])
        return (len(c.problems), over, c.offload, c.tp)
    return min(tried, key=miss)


def relaxed(s: Settings, what: str) -> Settings:
    """The job with one kind of pin removed (for "what would make it fit")."""
    if what == "offload":
        return replace(s, actor_param_offload=None, actor_optimizer_offload=None, critic_param_offload=None,
                       critic_optimizer_offload=None)
    if what == "micro":
        return replace(s, actor_micro=None, logprob_micro=None, ref_micro=None, critic_micro=None,
                       critic_fwd_micro=None, reward_micro=None, actor_tokens_pinned=False,
                       critic_tokens_pinned=False)
    if what == "rollout":
        return replace(s, tp=None, gpu_memory_utilization=None)
    raise ValueError(what)
