"""submit's placement preflight measures the training prompts on the cluster's head node — over real SSH, with the
node's Python, pyarrow and the tokenizer fixture in the model folder — and plans verl's seq_balance recipe at the
measured lengths and at the worst case. The GPUs are the recipe's own 8x H100 80GB from the GPU catalog (the
namespace hosts have none, and no recorded 8-GPU H100 facts exist)."""

import shutil
from pathlib import Path

import pytest

from verl_cluster.config.cluster import load_cluster
from verl_cluster.config.job import load_job
from verl_cluster.submit import integrations
from verl_cluster.placement import parse_gpus

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
FIX = ROOT / "tests/fixtures/prompts"
SEQ_BALANCE = ROOT / "tests/fixtures/verl_recipes/run_qwen2-7b_seq_balance.yaml"


@pytest.fixture(scope="module")
def ssh_cluster(module_lab, tmp_path_factory):
    lab = module_lab
    head = lab.add_host("head")
    for name in ("gsm8k_train.parquet", "math_long_train.parquet"):  # lab.dir is visible on the hosts
        shutil.copy(FIX / name, lab.dir / name)
    shutil.copytree(FIX / "tokenizer", lab.dir / "model")
    return lab, load_cluster(lab.cluster_yaml(head, [], name=f"len{lab.n}")), head


def _job(lab, data):
    return load_job(SEQ_BALANCE, [f"model.path={lab.dir / 'model'}", f"data.train_files=[{lab.dir / data}]",
                                  "placement.mean_response_tokens=500"])


def test_gsm8k_prompts_measured_on_the_head_node_make_the_recipe_fit_with_the_warning(ssh_cluster, monkeypatch,
                                                                                         tmp_path):
    lab, spec, head = ssh_cluster
    monkeypatch.setenv("HOME", str(tmp_path))  # no logged lengths of an earlier run
    info = integrations.placement_plan(_job(lab, "gsm8k_train.parquet"), spec, facts=parse_gpus("1x8xH100-80GB"))
    assert info.feasible is True, info.note
    measured = info.lengths["prompt"]["measured"]
    assert measured["method"] == "tokenizer" and measured["sampled"] == 2000 and 69 < measured["mean"] < 72
    data = [f for f in info.findings if f.check == "data"]
    assert [f.level for f in data] == ["ok"] and "prompts 71 tokens on average (p50 70, p95 78, max 81)" in \
        data[0].message
    (warn,) = [f for f in info.findings if f.level == "warning"]
    assert warn.message.startswith("planned at the lengths known, not the worst case: prompts 71 tokens")
    assert "critic update would not fit" in warn.message


def test_math_prompts_measured_on_the_head_node_are_refused_with_the_numbers(ssh_cluster, monkeypatch, tmp_path):
    lab, spec, head = ssh_cluster
    monkeypatch.setenv("HOME", str(tmp_path))
    info = integrations.placement_plan(_job(lab, "math_long_train.parquet"), spec, facts=parse_gpus("1x8xH100-80GB"))
    assert info.feasible is False
    assert info.note.startswith("does not fit at the worst case (8192 tokens a sequence): critic update memory")
    assert "nor at the lengths known — prompts 1806 tokens on average (p50 1817, p95 2686, max 2845)" in info.note


def test_a_node_without_the_file_says_so_and_plans_at_the_worst_case(ssh_cluster, monkeypatch, tmp_path):
    lab, spec, head = ssh_cluster
    monkeypatch.setenv("HOME", str(tmp_path))
    job = load_job(SEQ_BALANCE, ["data.train_files=[/tmp/only_here.parquet]"])  # each host's /tmp is its own
    shutil.copy(FIX / "gsm8k_train.parquet", "/tmp/only_here.parquet")
    try:
        info = integrations.placement_plan(job, spec, facts=parse_gpus("1x8xH100-80GB"))
    finally:
        Path("/tmp/only_here.parquet").unlink()
    (skip,) = [f for f in info.findings if f.level == "skipped"]
    assert skip.message.startswith(f"prompt lengths not measured on {head.ip}: ")
    assert info.lengths["prompt"]["source"].startswith("worst case")


def test_submit_dry_run_reports_the_prompts_measured_on_the_head_node(ssh_cluster, tmp_path):
    """The whole `submit --dry-run` path on a real Ray cluster of namespace hosts: the prompts are measured on the
    head while the plan is made; the hosts have no GPUs, so the plan itself is refused (exit 1) — the measured
    prompts are reported all the same."""
    import json

    from tests.harness.cli import run_cli
    from verl_cluster.testdata.tiny_model import model_config
    from verl_cluster.lifecycle.down import down
    from verl_cluster.lifecycle.up import up

    lab, spec, head = ssh_cluster
    cfg = lab.dir / "model" / "config.json"
    cfg.write_text(json.dumps(model_config("tiny", 3000, 0, 2)))
    report = up(spec)
    assert report.healthy, report.to_json()
    try:
        r = run_cli("submit", ROOT / "launch/gsm8k_grpo.yaml", f"model.path={lab.dir / 'model'}",
                    f"data.train_files=[{lab.dir / 'gsm8k_train.parquet'}]",
                    f"data.val_files=[{lab.dir / 'gsm8k_train.parquet'}]", "trainer.n_gpus_per_node=1",
                    "--dry-run", "-c", spec.source, env={"HOME": str(tmp_path)})
    finally:
        down(spec)
    err = r.stderr
    assert r.returncode == 1, err  # no GPUs on the hosts: the cluster cannot run it
    assert f"{lab.dir / 'gsm8k_train.parquet'}: prompts 71 tokens on average (p50 70, p95 78, max 81), all within " \
           "data.max_prompt_length=512" in " ".join(err.split())
    assert "placement planner" in err
