"""The verl overrides that make a plan so (verl 0.9 key names; docs/placement.md lists older spellings)."""

from __future__ import annotations

from typing import Any

from verl_cluster.placement.planner import CRITIC_PHASES, OFFLOAD_LEVELS, Candidate, Phase, Strategy
from verl_cluster.placement.settings import AR, Settings

# phase -> the verl key of its micro batch (or token budget with use_dynamic_bsz)
MICRO_KEYS = {
    Phase.ACTOR_UPDATE: f"{AR}.actor.ppo_micro_batch_size_per_gpu",
    Phase.ACTOR_LOG_PROB: f"{AR}.rollout.log_prob_micro_batch_size_per_gpu",
    Phase.REF_LOG_PROB: f"{AR}.ref.log_prob_micro_batch_size_per_gpu",
    Phase.CRITIC_UPDATE: "critic.ppo_micro_batch_size_per_gpu",
    Phase.CRITIC_VALUES: "critic.forward_micro_batch_size_per_gpu",
}
TOKEN_KEYS = {
    Phase.ACTOR_UPDATE: f"{AR}.actor.ppo_max_token_len_per_gpu",
    Phase.ACTOR_LOG_PROB: f"{AR}.rollout.log_prob_max_token_len_per_gpu",
    Phase.REF_LOG_PROB: f"{AR}.ref.log_prob_max_token_len_per_gpu",
    Phase.CRITIC_UPDATE: "critic.ppo_max_token_len_per_gpu",
    Phase.CRITIC_VALUES: "critic.forward_max_token_len_per_gpu",
}
ATTN_KEYS = (f"+{AR}.model.override_config.attn_implementation", "+critic.model.override_config.attn_implementation")


def build_overrides(c: Candidate, s: Settings) -> dict[str, Any]:
    main = c.pools[0]
    out: dict[str, Any] = {
        # split-nodes: the pools take whole nodes of the cluster; the entrypoint splits trainer.nnodes among them
        "trainer.nnodes": sum(p.nnodes for p in c.pools) if c.strategy == Strategy.SPLIT_NODES else main.nnodes,
        # split: verl's examples/split_placement halves trainer.n_gpus_per_node itself
        "trainer.n_gpus_per_node": sum(len(p.gpu_indices) for p in c.pools) if c.strategy == Strategy.SPLIT
        else len(main.gpu_indices),
        f"{AR}.rollout.tensor_model_parallel_size": c.tp,
        f"{AR}.rollout.gpu_memory_utilization": c.util,
    }
    param_off, opt_off = OFFLOAD_LEVELS[c.offload]
    out[f"{AR}.actor.fsdp_config.param_offload"] = param_off
    out[f"{AR}.actor.fsdp_config.optimizer_offload"] = opt_off
    if s.ref:
        out[f"{AR}.ref.fsdp_config.param_offload"] = True  # verl forces CPUOffload on the ref anyway
    if s.critic:
        out[f"{s.critic_prefix}.param_offload"] = param_off
        out[f"{s.critic_prefix}.optimizer_offload"] = opt_off
    for ph in c.phases:
        if s.critic_packs and ph.phase in CRITIC_PHASES:
            out.update(_packed_critic(c, s, ph.phase))
        elif ph.phase in c.token_budget:
            out[TOKEN_KEYS[ph.phase]] = c.token_budget[ph.phase]
        elif ph.phase in MICRO_KEYS and ph.micro is not None:
            out[MICRO_KEYS[ph.phase]] = ph.micro
        elif ph.phase == Phase.REWARD and ph.micro is not None and s.reward_prefix == "reward_model":  # ≤ 0.8 only
            out[f"{s.reward_prefix}.micro_batch_size_per_gpu"] = ph.micro
    prec = c.prec
    if prec.train_dtype != "bfloat16":  # FSDP's param_dtype comes from mixed_precision (bf16 when unset)
        short = {"float32": "fp32", "float16": "fp16"}[prec.train_dtype]
        out[f"+{AR}.actor.fsdp_config.mixed_precision.param_dtype"] = short
        if s.ref:
            out[f"+{AR}.ref.fsdp_config.mixed_precision.param_dtype"] = short
        if s.critic:
            out[f"+{s.critic_prefix}.mixed_precision.param_dtype"] = short
        out[f"{AR}.rollout.dtype"] = prec.rollout_dtype
    if prec.attn != "flash_attention_2" or s.attn_implementation:
        out[ATTN_KEYS[0]] = prec.attn
        if s.critic:
            out[ATTN_KEYS[1]] = prec.attn
    if not prec.remove_padding:
        out[f"{AR}.model.use_remove_padding"] = False
        if s.critic:
            out["critic.model.use_remove_padding"] = False
    reward_pool = next((p for p in c.pools if p.name == "reward_pool"), None)
    if reward_pool is not None:
        out[f"{s.reward_prefix}.enable_resource_pool"] = True
        out[f"{s.reward_prefix}.n_gpus_per_node"] = len(reward_pool.gpu_indices)
        out[f"{s.reward_prefix}.nnodes"] = reward_pool.nnodes
    return out


def _packed_critic(c: Candidate, s: Settings, phase: Phase) -> dict[str, Any]:
    """verl 0.9's critic packs by tokens (Settings.critic_packs): the budget its pass runs under, at the key verl
    reads for it (the planner has given both passes one budget where one key holds both), and a micro batch size
    only because verl's config check wants one set (its engine critic does not use it): the per-GPU mini batch, one
    micro batch a mini batch."""
    out: dict[str, Any] = {}
    if phase in c.token_budget:
        out[s.critic_budget_key(update=phase == Phase.CRITIC_UPDATE)] = c.token_budget[phase]
    if phase == Phase.CRITIC_UPDATE and s.critic_micro is None and not s.dynamic_bsz:
        pool = next((p for p in c.pools if "critic" in p.roles), c.pools[0])
        out[MICRO_KEYS[phase]] = max(1, s.ppo_mini_batch_size * s.n * s.sp_critic // pool.size)
    return out
