"""`verl-cluster plan` through the CLI entry point: exit codes, JSON shape, bad input."""

import json
from pathlib import Path

from verl_cluster.cli import main
from verl_cluster.facts.model import to_dict
from verl_cluster.placement import parse_gpus

ROOT = Path(__file__).resolve().parents[2]
PPO = str(ROOT / "launch/gsm8k.yaml")
GRPO = str(ROOT / "launch/gsm8k_grpo.yaml")


def test_json_feasible(capsys):
    assert main(["plan", GRPO, "--gpus", "1x8xH100-80GB", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["feasible"] is True and doc["strategy"] == "colocate"
    assert set(doc["roles"]) == {"actor", "rollout", "ref"}
    assert doc["roles"]["actor"]["gpus"] == [[0, g] for g in range(8)]
    assert isinstance(doc["roles"]["actor"]["memory_gib_per_gpu"], float)
    assert doc["overrides"]["actor_rollout_ref.rollout.tensor_model_parallel_size"] >= 1
    assert doc["reasons"] and isinstance(doc["reasons"][0], str)


def test_infeasible_exit_1(capsys):
    assert main(["plan", PPO, "--gpus", "1x1xT4-16GB", "model.catalog=llama-3.1-70b", "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["feasible"] is False and doc["problems"] and doc["fixes"]


def test_rich_output_and_overrides_from_cli(capsys):
    assert main(["plan", PPO, "--gpus", "1x1xP40-24GB", "actor_rollout_ref.rollout.gpu_memory_utilization=0.2"]) == 0
    text = capsys.readouterr().out
    assert "GPU map" in text and "gpu_memory_utilization=0.2" in text and "eager" in text


def test_bad_gpus_is_exit_2_one_line(capsys):
    assert main(["plan", PPO, "--gpus", "2x8xH1OO"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[0].startswith("error: --gpus") and "Traceback" not in "\n".join(err)


def test_bad_job_file_is_exit_2(tmp_path, capsys):
    bad = tmp_path / "job.yaml"
    bad.write_text("name: x\nentrypoint: verl.trainer.main_ppo\nmodel: {catalog: nope-1b}\n")
    assert main(["plan", str(bad), "--gpus", "1x8xH100-80GB"]) == 2
    assert "unknown model" in capsys.readouterr().err
    assert main(["plan", str(tmp_path / "missing.yaml"), "--gpus", "1x8xH100-80GB"]) == 2


def test_bad_override_value_is_exit_2(capsys):
    assert main(["plan", PPO, "--gpus", "1x8xH100-80GB", "actor_rollout_ref.rollout.n=many"]) == 2
    assert "actor_rollout_ref.rollout.n" in capsys.readouterr().err


def test_facts_file(tmp_path, capsys):
    facts = tmp_path / "facts.json"
    facts.write_text(json.dumps([to_dict(n) for n in parse_gpus("2x4xA100-80GB")]))
    assert main(["plan", GRPO, "--facts", str(facts), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["overrides"]["trainer.nnodes"] == 2 and doc["overrides"]["trainer.n_gpus_per_node"] == 4
    facts.write_text("{not json")
    assert main(["plan", GRPO, "--facts", str(facts)]) == 2


def test_no_gpus_here_suggests_gpus_flag(capsys, monkeypatch):
    from verl_cluster.facts.model import NodeFacts
    from verl_cluster.placement import nvml_local

    monkeypatch.setattr(nvml_local, "local_node_facts", lambda: NodeFacts(host="cpu", nvml_error="no driver"))
    assert main(["plan", PPO]) == 2
    assert "--gpus 1x8xH100-80GB" in capsys.readouterr().err


def test_heterogeneous_facts_exit_1(capsys):
    assert main(["plan", PPO, "--gpus", "1x8xH100-80GB,1x4xH100-80GB"]) == 1
    assert "different GPU counts" in capsys.readouterr().err
