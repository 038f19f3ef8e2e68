"""submit's placement preflight at the lengths the data has (submit/integrations.placement_plan, which submit and
watch call): the training prompts measured on the cluster's head node — here a localhost cluster, so the node-side
probe runs for real in a subprocess with this environment's Python, pyarrow and the tokenizer fixture — and planned
on verl's seq_balance recipe's hardware (8x H100 80GB from the GPU catalog: no recorded 8-GPU H100 facts exist)."""

from pathlib import Path

import pytest

from verl_cluster.config.cluster import load_cluster
from verl_cluster.config.job import load_job
from verl_cluster.submit import integrations
from verl_cluster.submit import prompt_probe
from verl_cluster.submit.preflight import PreflightReport, prompt_findings
from verl_cluster.submit.pipeline import preflight_exit_code
from verl_cluster.placement import parse_gpus
from verl_cluster.placement.lengths import PromptStats

ROOT = Path(__file__).resolve().parents[2]
FIX = ROOT / "tests/fixtures/prompts"
SEQ_BALANCE = ROOT / "tests/fixtures/verl_recipes/run_qwen2-7b_seq_balance.yaml"
GRPO = ROOT / "launch/gsm8k_grpo.yaml"


@pytest.fixture
def spec(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    f = tmp_path / "cluster.yaml"
    f.write_text("cluster_name: lengths\nhead:\n  host: localhost\n")
    return load_cluster(f)


def _job(path, data, *extra):
    return load_job(path, [f"model.path={FIX / 'tokenizer'}", f"data.train_files=[{FIX / data}]", *extra])


def _submit_findings(info):
    """What submit.plan_submission turns the plan into (submit/pipeline.py)."""
    from verl_cluster.submit.preflight import Finding

    out = []
    if info.feasible is False:
        out.append(Finding("error", "placement", f"the placement planner finds no feasible plan: {info.note}",
                           info.hint))
    return PreflightReport(out + list(info.findings))


def test_seq_balance_recipe_on_gsm8k_passes_with_the_measured_lengths_and_the_warning(spec):
    job = _job(SEQ_BALANCE, "gsm8k_train.parquet", "placement.mean_response_tokens=500")
    info = integrations.placement_plan(job, spec, facts=parse_gpus("1x8xH100-80GB"))
    assert info.feasible is True, info.note
    assert "at the lengths known (fill 0.0696;" in info.note and "the worst case does not fit" in info.note
    assert info.lengths["prompt"]["measured"]["sampled"] == 2000
    assert info.lengths["prompt"]["source"].startswith(f"measured on all 2000 rows of {FIX / 'gsm8k_train.parquet'} "
                                                       f"with the tokenizer of {FIX / 'tokenizer'}")
    assert info.overrides["critic.ppo_max_token_len_per_gpu"] == 98304  # the recipe's own budget, kept
    report = _submit_findings(info)
    assert report.ok
    data = [f for f in report.findings if f.check == "data"]
    assert [f.level for f in data] == ["ok"] and "prompts 71 tokens on average (p50 70, p95 78, max 81)" in data[0].message
    warn = [f for f in report.findings if f.level == "warning"]
    assert len(warn) == 1 and warn[0].check == "placement"
    assert warn[0].message.startswith("planned at the lengths known, not the worst case: prompts 71 tokens")
    assert "responses 500, placement.mean_response_tokens" in warn[0].message
    assert "critic update would not fit (critic update memory: " in warn[0].message
    assert "`submit --watch` resumes the run" in warn[0].message


def test_seq_balance_recipe_on_math_long_prompts_is_refused_with_the_numbers(spec):
    job = _job(SEQ_BALANCE, "math_long_train.parquet", "placement.mean_response_tokens=500")
    info = integrations.placement_plan(job, spec, facts=parse_gpus("1x8xH100-80GB"))
    assert info.feasible is False
    assert info.note.startswith("does not fit at the worst case (8192 tokens a sequence): critic update memory: ")
    assert "nor at the lengths known — prompts 1806 tokens on average (p50 1817, p95 2686, max 2845)" in info.note
    assert info.note.count("GiB/GPU") == 2
    report = _submit_findings(info)
    assert not report.ok and preflight_exit_code(report) == 1  # the hardware cannot run it: exit 1
    err = report.errors[0]
    assert err.message.startswith("the placement planner finds no feasible plan: does not fit at the worst case")
    assert err.hint  # the planner's best change


def test_responses_unknown_is_the_worst_case_and_the_hint_says_what_to_state(spec):
    info = integrations.placement_plan(_job(SEQ_BALANCE, "gsm8k_train.parquet"), spec,
                                       facts=parse_gpus("1x8xH100-80GB"))
    assert info.feasible is False and "responses 4096, worst case: data.max_response_length" in info.note
    assert info.hint.startswith("if your responses are shorter, state placement.mean_response_tokens")


def test_over_long_prompts_are_a_data_warning_naming_what_verl_does(spec):
    info = integrations.placement_plan(_job(GRPO, "overlong_train.parquet"), spec, facts=parse_gpus("1x1xH100-80GB"))
    assert info.feasible is True
    (f,) = [f for f in info.findings if f.check == "data"]
    assert f.level == "warning" and "40 of 400 sampled prompts (10%) are longer than data.max_prompt_length=512" in \
        f.message and "verl drops them when it loads the data (data.filter_overlong_prompts)" in f.message
    stats = PromptStats.from_probe(info.lengths["prompt"]["measured"] | {"files": [str(FIX / "overlong_train.parquet")]})
    (f,) = prompt_findings(_job(GRPO, "overlong_train.parquet", "data.filter_overlong_prompts=false"), stats)
    assert "verl 0.9 cuts them to their last tokens" in f.message and "filter_overlong_prompts=true" in f.hint
    short = PromptStats.from_probe(prompt_probe.measure([str(FIX / "overlong_train.parquet")], str(FIX / "tokenizer"),
                                                        limit=60))
    (f,) = prompt_findings(_job(GRPO, "overlong_train.parquet", "data.max_prompt_length=60"), short)
    assert f.level == "error" and "every sampled prompt is longer than data.max_prompt_length=60" in f.message


def test_a_file_not_on_the_node_is_said_and_the_plan_goes_on(spec, tmp_path):
    job = load_job(GRPO, [f"data.train_files=[{tmp_path / 'nope.parquet'}]"])
    info = integrations.placement_plan(job, spec, facts=parse_gpus("1x1xH100-80GB"))
    assert info.feasible is True
    skipped = [f for f in info.findings if f.level == "skipped"]
    assert len(skipped) == 1 and skipped[0].message.startswith("prompt lengths not measured on localhost: ")
    assert info.lengths["prompt"]["source"].startswith("worst case")


def test_the_ray_jobs_metadata_carries_the_lengths_planned_at(spec):
    import json

    job = _job(SEQ_BALANCE, "gsm8k_train.parquet", "placement.mean_response_tokens=500")
    info = integrations.placement_plan(job, spec, facts=parse_gpus("1x8xH100-80GB"))
    meta = json.loads(integrations.plan_metadata(info))
    assert meta["lengths"] == {"fill": info.lengths["fill"], "prompt_mean": info.lengths["prompt"]["mean"],
                               "response_mean": 500.0}
    assert meta["lengths"]["fill"] == pytest.approx((meta["lengths"]["prompt_mean"] + 500) / 8192, abs=1e-4)
