"""The job's verl settings the planner needs, read once from JobSpec overrides into a typed object.

Key names are verl 0.9's (`actor_rollout_ref.*`, `critic.*`, `data.*`, `algorithm.*`, `trainer.*`,
`reward.reward_model.*`; ≤ 0.8 spelled the reward model `reward_model.*`, which is read too). Defaults are
verl's ppo_trainer.yaml defaults. `None` for a searchable field means "not pinned: the planner chooses".
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Optional

from verl_cluster.config.job_shape import JobShape
from verl_cluster.config.job import JobSpec
from verl_cluster.errors import ConfigError

AR = "actor_rollout_ref"
CRITIC_INFER_TOKENS = "+critic.ppo_infer_max_token_len_per_gpu"  # not in verl 0.9's yaml: appended
RM_PREFIXES = ("reward.reward_model", "reward_model")  # verl 0.9, then ≤ 0.8
CRITIC_PREFIXES = ("critic.fsdp", "critic.model.fsdp_config")  # verl 0.9, then ≤ 0.8


@dataclass(frozen=True)
class Settings:
    adv_estimator: str
    critic: bool
    ref: bool
    reward_model: bool
    reward_prefix: str  # the spelling this job uses for reward-model keys
    reward_model_path: Optional[str]
    critic_prefix: str  # critic.fsdp (verl 0.9) or critic.model.fsdp_config (≤ 0.8), as the job spells it
    train_batch_size: int
    ppo_mini_batch_size: int
    n: int
    prompt_len: int
    response_len: int
    rollout_name: str
    max_num_seqs: int
    max_num_batched_tokens: int
    enforce_eager: bool
    grad_ckpt_actor: bool
    grad_ckpt_critic: bool
    remove_padding_actor: bool
    remove_padding_critic: bool
    sp_actor: int
    sp_critic: int
    dynamic_bsz: bool
    actor_max_tokens: int  # ppo_max_token_len_per_gpu (dynamic bsz)
    critic_max_tokens: int
    master_dtype_bytes_actor: int  # fsdp_config.model_dtype (fp32 in verl ≥ 0.5)
    master_dtype_bytes_critic: int
    fsdp2: bool  # actor.strategy fsdp2 (verl's default "fsdp" is FSDP1): how a checkpoint save reaches the host
    # pinned by the user (None: the planner searches)
    tp: Optional[int]
    gpu_memory_utilization: Optional[float]
    actor_param_offload: Optional[bool]
    actor_optimizer_offload: Optional[bool]
    critic_param_offload: Optional[bool]
    critic_optimizer_offload: Optional[bool]
    actor_micro: Optional[int]
    logprob_micro: Optional[int]
    ref_micro: Optional[int]
    critic_micro: Optional[int]
    critic_fwd_micro: Optional[int]
    reward_micro: Optional[int]
    train_dtype: Optional[str]  # fsdp_config.mixed_precision.param_dtype as pinned: bfloat16 | float16 | float32
    attn_implementation: Optional[str]
    nnodes: Optional[int]
    n_gpus_per_node: Optional[int]
    # verl.trainer.main_ppo maps every role to one pool (global_pool): a critic on its own GPUs ("split") needs an
    # entrypoint that builds two pools, as verl's examples/split_placement/main_ppo_split.py does
    split_placement: bool = True
    # the job sets ppo_max_token_len_per_gpu: with use_dynamic_bsz the update runs at that budget (not searched)
    actor_tokens_pinned: bool = False
    critic_tokens_pinned: bool = False
    # verl 0.9's engine critic packs its micro batches by tokens whatever critic.ppo_micro_batch_size_per_gpu says
    # (its engine config keeps use_dynamic_bsz's default, True): both its passes under
    # critic.ppo_infer_max_token_len_per_gpu (the v1 trainer; the legacy one updates under ppo_max_token_len_per_gpu)
    critic_packs: bool = False
    critic_infer_tokens: int = 32768
    critic_infer_tokens_pinned: bool = False
    critic_v1: bool = True  # trainer.use_v1 (verl 0.9's default)
    # LoRA (actor_rollout_ref.model.lora_rank / critic.model.lora_rank; 0: full fine-tuning). With an actor LoRA
    # verl's ref is the actor with its adapters off (ref_in_actor): no second model
    lora_rank: int = 0
    critic_lora_rank: int = 0
    lora_targets: tuple[str, ...] = ("all-linear",)
    allow_lora: bool = False  # placement.allow_lora: the planner may propose LoRA
    lora_offer: int = 32  # placement.lora_rank: the rank it proposes
    at_limit: bool = True  # placement.at_limit: a phase may run at the GPU's limit when nothing fits with room
    save_freq: int = -1  # trainer.save_freq: > 0 saves checkpoints (the CPU copy of the states at each save)
    megatron: bool = False  # verl's Megatron workers: the memory model (FSDP) does not cover them
    # (written, meant): keys the job sets a letter or two away from one the plan reads, which it did not find: the
    # plan took verl's default for `meant` (`data.train_batch_sise=256` plans at 1024)
    near_misses: tuple[tuple[str, str], ...] = ()

    @property
    def shape(self) -> JobShape:
        """The counts the job pins (None: not pinned: the planner fits the cluster), as every reader takes them."""
        return JobShape(self.nnodes, self.n_gpus_per_node)

    def critic_budget(self, update: bool) -> tuple[int, bool]:
        """(token budget, pinned) the critic's update or values pass starts from: with critic_packs the one its key
        holds (critic_budget_key), else the dynamic-bsz budget (critic.ppo_max_token_len_per_gpu)."""
        if self.critic_budget_key(update) == CRITIC_INFER_TOKENS:
            return self.critic_infer_tokens, self.critic_infer_tokens_pinned
        return self.critic_max_tokens, self.critic_tokens_pinned and update

    def critic_budget_key(self, update: bool) -> str:
        """The verl key that holds a critic pass's token budget: verl 0.9 packs both passes under
        critic.ppo_infer_max_token_len_per_gpu (the legacy trainer its update under ppo_max_token_len_per_gpu);
        without packing, critic.ppo_max_token_len_per_gpu (its values' key is overrides.TOKEN_KEYS')."""
        if self.critic_packs and not (update and not self.critic_v1):
            return CRITIC_INFER_TOKENS
        return "critic.ppo_max_token_len_per_gpu"

    @property
    def seq_len(self) -> int:
        return self.prompt_len + self.response_len

    @property
    def sequences(self) -> int:
        return self.train_batch_size * self.n


def _near_misses(r: _Reader) -> tuple[tuple[str, str], ...]:
    """Keys set but not read that are at most 2 edits from a key the plan reads (set too or not: a typo'd key
    beside the file's own spelling leaves the file's value in force)."""
    asked = sorted(r.asked)
    out = []
    for key in r.ov:
        bare = key.lstrip("+")
        if bare in r.asked:
            continue
        near = [m for m in asked if _edits(bare, m, 2) <= 2]
        if near:
            out.append((bare, min(near)))
    return tuple(sorted(out))


def _edits(a: str, b: str, most: int) -> int:
    """Levenshtein distance of a and b, or most + 1 once it is over `most` (a band of 2 x most + 1 diagonals: a
    plan reads every override against every key it asks for, so this runs thousands of times a plan)."""
    if abs(len(a) - len(b)) > most:
        return most + 1
    n = 0  # the keys share long prefixes (actor_rollout_ref.actor.): what both start and end with costs nothing
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    a, b = a[n:], b[n:]
    while a and b and a[-1] == b[-1]:
        a, b = a[:-1], b[:-1]
    far = most + 1
    prev = {j: j for j in range(min(len(b), most) + 1)}
    for i in range(1, len(a) + 1):
        cur = {}
        for j in range(max(0, i - most), min(len(b), i + most) + 1):
            if j == 0:
                cur[j] = i
                continue
            cur[j] = min(prev.get(j, far) + 1, cur.get(j - 1, far) + 1, prev.get(j - 1, far) + (a[i - 1] != b[j - 1]))
        if min(cur.values()) > most:
            return far
        prev = cur
    return min(prev.get(len(b), far), far)


_DTYPE_BYTES = {"fp32": 4, "float32": 4, "bf16": 2, "bfloat16": 2, "fp16": 2, "float16": 2, "half": 2}


def uses_megatron(job: JobSpec) -> bool:
    """verl's Megatron workers: the ppo_megatron_trainer config (--config-name / -cn), actor.strategy=megatron, or
    any `.megatron.` key (only that config has them)."""
    args = [str(a) for a in job.args]
    names = [a.split("=", 1)[1] for a in args if a.startswith(("--config-name=", "-cn="))]
    names += [b for a, b in zip(args, args[1:]) if a in ("--config-name", "-cn")]
    if any("megatron" in n for n in names):
        return True
    ov = job.verl_overrides()
    if any(str(ov.get(p + k, "")).lower() == "megatron" for k in (f"{AR}.actor.strategy", "critic.strategy")
           for p in ("", "+", "++")):
        return True
    return any(".megatron." in k for k in ov)


class _Reader:
    def __init__(self, job: JobSpec):
        self.ov = job.verl_overrides()
        self.used: set[str] = set()
        self.asked: set[str] = set()

    def raw(self, key: str) -> Any:
        self.asked.add(key)
        for k in (key, "+" + key, "++" + key):
            if k in self.ov:
                self.used.add(k)
                return self.ov[k]
        return None

    def has(self, key: str) -> bool:
        return self.raw(key) is not None

    def get(self, key: str, kind: type, default: Any = None) -> Any:
        v = self.raw(key)
        if v is None:
            return default
        try:
            if kind is bool:
                if isinstance(v, str) and v.lower() in ("true", "false"):
                    return v.lower() == "true"
                if not isinstance(v, bool):
                    raise ValueError
                return v
            if kind is int:
                if isinstance(v, bool) or (isinstance(v, float) and not v.is_integer()):
                    raise ValueError
                return int(v)
            if kind is float:
                if isinstance(v, bool):
                    raise ValueError
                return float(v)
            return str(v)
        except (TypeError, ValueError):
            raise ConfigError(f"overrides: `{key}` must be {kind.__name__}, got {v!r}") from None

    def positive(self, key: str, default: Optional[int]) -> Optional[int]:
        v = self.get(key, int, default)
        if v is not None and v <= 0:
            raise ConfigError(f"overrides: `{key}` must be a positive integer, got {v}")
        return v


def _dtype_bytes(key: str, value: str) -> int:
    if value.lower() not in _DTYPE_BYTES:
        raise ConfigError(f"overrides: `{key}`: unknown dtype {value!r}", "use fp32, bf16 or fp16")
    return _DTYPE_BYTES[value.lower()]


def _targets(value: Any) -> tuple[str, ...]:
    """verl's target_modules: "all-linear", one module name, or a list of them."""
    if value is None:
        return ("all-linear",)
    if isinstance(value, str):
        return tuple(v.strip() for v in value.strip("[]").split(",") if v.strip()) or ("all-linear",)
    return tuple(str(v) for v in value) or ("all-linear",)


ONE_POOL_ENTRYPOINTS = ("verl.trainer.main_ppo",)


def splits_pools(job: JobSpec) -> bool:
    """Can this job's program put the critic/reward model on GPUs of their own? Not verl's stock main_ppo."""
    argv = [job.entrypoint] if job.entrypoint else [str(a) for a in (job.command or [])]
    return not any(a in ONE_POOL_ENTRYPOINTS for a in argv)


def read_settings(job: JobSpec) -> Settings:
    r = _Reader(job)
    adv = r.get("algorithm.adv_estimator", str, "gae")
    critic_enable = r.get("critic.enable", bool)
    critic = critic_enable if critic_enable is not None else adv == "gae"
    ref = bool(r.get("algorithm.use_kl_in_reward", bool, False) or r.get(f"{AR}.actor.use_kl_loss", bool, False))
    prefix = next((p for p in RM_PREFIXES if any(k.lstrip("+").startswith(p + ".") for k in r.ov)), RM_PREFIXES[0])
    rm = bool(r.get(f"{prefix}.enable", bool, False))
    cprefix = next((p for p in CRITIC_PREFIXES if any(k.lstrip("+").startswith(p + ".") for k in r.ov)),
                   CRITIC_PREFIXES[0])
    train_batch = r.positive("data.train_batch_size", 1024)
    mini = r.positive(f"{AR}.actor.ppo_mini_batch_size", 256)
    util = r.get(f"{AR}.rollout.gpu_memory_utilization", float)
    if util is not None and not 0.05 <= util <= 0.98:
        raise ConfigError(f"overrides: `{AR}.rollout.gpu_memory_utilization` must be in 0.05..0.98, got {util}")
    dtype_key = f"{AR}.actor.fsdp_config.mixed_precision.param_dtype"
    dtype = r.get(dtype_key, str)
    if dtype is not None:
        _dtype_bytes(dtype_key, dtype)
        dtype = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32", "half": "float16"}.get(dtype.lower(), dtype)
    attn = r.get(f"{AR}.model.override_config.attn_implementation", str)
    if attn is not None and attn not in ("flash_attention_2", "flash_attention_3", "sdpa", "eager"):
        raise ConfigError(f"overrides: `{AR}.model.override_config.attn_implementation`: unknown value {attn!r}",
                          "use flash_attention_2, sdpa or eager")
    s = Settings(
        adv_estimator=adv, critic=critic, ref=ref, reward_model=rm, reward_prefix=prefix,
        reward_model_path=r.get(f"{prefix}.model_path", str) or r.get(f"{prefix}.model.path", str),
        critic_prefix=cprefix,
        train_batch_size=train_batch, ppo_mini_batch_size=mini,
        n=r.positive(f"{AR}.rollout.n", 1),
        prompt_len=r.positive("data.max_prompt_length", 512),
        response_len=r.positive("data.max_response_length", 512),
        rollout_name=r.get(f"{AR}.rollout.name", str, "vllm"),
        max_num_seqs=r.positive(f"{AR}.rollout.max_num_seqs", 256),
        max_num_batched_tokens=r.positive(f"{AR}.rollout.max_num_batched_tokens", 8192),
        enforce_eager=r.get(f"{AR}.rollout.enforce_eager", bool, False),
        grad_ckpt_actor=r.get(f"{AR}.model.enable_gradient_checkpointing", bool, True),
        grad_ckpt_critic=r.get("critic.model.enable_gradient_checkpointing", bool, True),
        remove_padding_actor=r.get(f"{AR}.model.use_remove_padding", bool, True),
        remove_padding_critic=r.get("critic.model.use_remove_padding", bool, True),
        sp_actor=r.positive(f"{AR}.actor.ulysses_sequence_parallel_size", 1),
        sp_critic=r.positive("critic.ulysses_sequence_parallel_size", 1),
        dynamic_bsz=r.get(f"{AR}.actor.use_dynamic_bsz", bool, False),
        actor_max_tokens=r.positive(f"{AR}.actor.ppo_max_token_len_per_gpu", 16384),
        critic_max_tokens=r.positive("critic.ppo_max_token_len_per_gpu", 32768),
        master_dtype_bytes_actor=_dtype_bytes("model_dtype", r.get(f"{AR}.actor.fsdp_config.model_dtype", str, "fp32")),
        fsdp2=r.get(f"{AR}.actor.strategy", str, "fsdp") == "fsdp2",
        master_dtype_bytes_critic=_dtype_bytes("model_dtype", r.get(f"{cprefix}.model_dtype", str, "fp32")),
        tp=r.positive(f"{AR}.rollout.tensor_model_parallel_size", None),
        gpu_memory_utilization=util,
        actor_param_offload=r.get(f"{AR}.actor.fsdp_config.param_offload", bool),
        actor_optimizer_offload=r.get(f"{AR}.actor.fsdp_config.optimizer_offload", bool),
        critic_param_offload=r.get(f"{cprefix}.param_offload", bool),
        critic_optimizer_offload=r.get(f"{cprefix}.optimizer_offload", bool),
        actor_micro=r.positive(f"{AR}.actor.ppo_micro_batch_size_per_gpu", None),
        logprob_micro=r.positive(f"{AR}.rollout.log_prob_micro_batch_size_per_gpu", None),
        ref_micro=r.positive(f"{AR}.ref.log_prob_micro_batch_size_per_gpu", None),
        critic_micro=r.positive("critic.ppo_micro_batch_size_per_gpu", None),
        critic_fwd_micro=r.positive("critic.forward_micro_batch_size_per_gpu", None),
        reward_micro=r.positive(f"{prefix}.micro_batch_size_per_gpu", None),
        train_dtype=dtype,
        attn_implementation=attn,
        nnodes=r.positive("trainer.nnodes", None),
        n_gpus_per_node=r.positive("trainer.n_gpus_per_node", None),
        split_placement=splits_pools(job),
        actor_tokens_pinned=r.has(f"{AR}.actor.ppo_max_token_len_per_gpu"),
        critic_tokens_pinned=r.has("critic.ppo_max_token_len_per_gpu"),
        critic_packs=cprefix == CRITIC_PREFIXES[0],
        critic_infer_tokens=r.positive("critic.ppo_infer_max_token_len_per_gpu", 32768),
        critic_infer_tokens_pinned=r.has("critic.ppo_infer_max_token_len_per_gpu"),
        critic_v1=r.get("trainer.use_v1", bool, True),
    )
    lora = r.positive(f"{AR}.model.lora.rank", None) or r.get(f"{AR}.model.lora_rank", int, 0)
    critic_lora = r.positive("critic.model.lora.rank", None) or r.get("critic.model.lora_rank", int, 0)
    if lora < 0 or critic_lora < 0:
        raise ConfigError("overrides: `lora_rank` must be 0 (off) or a positive rank")
    if job.placement.lora_rank <= 0:
        raise ConfigError(f"placement.lora_rank must be a positive rank, got {job.placement.lora_rank}",
                          "use 16, 32 or 64")
    s = replace(s, megatron=uses_megatron(job), save_freq=r.get("trainer.save_freq", int, -1), near_misses=_near_misses(r), lora_rank=lora, critic_lora_rank=critic_lora, lora_targets=_targets(r.raw(f"{AR}.model.target_modules")),
                allow_lora=job.placement.allow_lora, lora_offer=job.placement.lora_rank,
                at_limit=job.placement.at_limit)
    if s.ppo_mini_batch_size > s.train_batch_size:
        raise ConfigError(f"overrides: `{AR}.actor.ppo_mini_batch_size` ({mini}) exceeds data.train_batch_size "
                          f"({train_batch})", "verl asserts train_batch_size >= ppo_mini_batch_size")
    return s
