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
# Rejected at worst-case lengths, with the binding phase. Not fudged: see docs/BENCHMARKS.md for why; it still
# gets a feasible changed plan.
REJECTED = {
    "run_qwen2_5-32b": "critic update memory",  # the critic without gradient checkpointing at micro 8
}
# Fit only at real lengths (the largest average fill of prompt+response at which the plan fits as written): worst
# case (every sequence prompt+response long) is stricter than the GSM8K/MATH data these recipes train on, whose
# sequences under use_remove_padding fill a small part of the maximum. With the allocator at the GPU's limit
# where verl's expandable segments allow it (docs/BENCHMARKS.md, "The allocator at the limit").
FILL = {
    "run_qwen2-7b": 0.95,
    "run_qwen2-7b_seq_balance": 0.1,  # 819 of 8192 tokens: the critic's 98304-token budget
    "qwen2-7b_grpo_2_h800_fsdp_vllm": 0.35,  # fp32 states 57 GiB/GPU reloaded for the update
    "qwen2_14b_grpo_4_h800_fsdp_vllm": 0.25,  # same: 55 GiB/GPU of states before activations
    "qwen2-70b_grpo_32_h800_fsdp_vllm": 0.25,  # 256 of 1024 tokens
    "qwen2-70b_grpo_32_h20_fsdp_vllm": 0.4,
}
# Fit as written, with a phase at the GPU's limit (its reserved peak with room is over the GPU's memory)
AT_LIMIT = {"run_qwen3-8b": "actor update"}


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
    limit = [ph.phase for r in p.roles for ph in r.phases if "at the GPU's limit" in ph.note]
    if fill == 1.0:
        assert limit == ([AT_LIMIT[path.stem]] if path.stem in AT_LIMIT else [])
        assert bool(limit) == any("runs at the GPU's limit" in w for w in p.warnings)
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
