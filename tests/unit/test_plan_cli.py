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


def test_facts_of_the_wrong_type_name_the_field(tmp_path, capsys):
    """A facts file edited by hand: each wrong value is exit 2 naming its path, never an internal error; what
    `doctor --json` prints is itself a facts file."""
    node = to_dict(parse_gpus("1x2xH100-80GB")[0])
    facts = tmp_path / "facts.json"
    for edit, says in ((("gpus", 0, "memory_total_mib", "big"), "[0].gpus[0].memory_total_mib must be an integer"),
                       (("gpus", 0, "memory_total_mib", 0), "memory_total_mib must be above 0"),
                       (("gpus", 1, "memory_total_mib", -80000), "memory_total_mib must be above 0"),
                       (("gpus", 0, "compute_capability", "abc"), "compute_capability must be like"),
                       (("gpus", "lots"), "[0].gpus must be a list, got a string"),
                       (("gpus", 0, "name", None), "[0].gpus[0].name is missing")):
        doc = json.loads(json.dumps(node))
        target = doc
        for k in edit[:-2]:
            target = target[k]
        if edit[-1] is None:
            del target[edit[-2]]
        else:
            target[edit[-2]] = edit[-1]
        facts.write_text(json.dumps([doc]))
        capsys.readouterr()
        assert main(["plan", GRPO, "--facts", str(facts)]) == 2, edit
        got = capsys.readouterr().err
        assert says in got and "internal error" not in got and "doctor --json" in got, (edit, got)
    facts.write_text(json.dumps({"ok": True, "problems": [], "facts": node}))
    assert main(["plan", GRPO, "--facts", str(facts), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["overrides"]["trainer.n_gpus_per_node"] == 2


def test_a_key_a_letter_from_one_the_plan_reads_is_warned(capsys):
    """`data.train_batch_sise=256`: verl's own check runs only at submit; the plan says it planned by the key it
    reads, in the table and --json, for a typo in a key (`sise`) or in a group (`rolout`). Keys verl has that the
    plan does not read, and keys it reads, are not warned of."""
    typo = ["data.train_batch_sise=256", "actor_rollout_ref.rolout.n=4", "+actor_rollout_ref.actor.ppo_epochs=2",
            "actor_rollout_ref.actor.ppo_micro_batch_size=8", "critic.model.lora_rank=0"]
    assert main(["plan", PPO, "--gpus", "1x8xH100-80GB", "--json", *typo]) == 0
    warned = [w for w in json.loads(capsys.readouterr().out)["warnings"] if "did you mean" in w]
    assert len(warned) == 2
    assert "`data.train_batch_sise`" in warned[1] and "`data.train_batch_size`" in warned[1]
    assert "`actor_rollout_ref.rolout.n`" in warned[0] and "`actor_rollout_ref.rollout.n`" in warned[0]
    assert main(["plan", PPO, "--gpus", "1x8xH100-80GB", "data.train_batch_size=256"]) == 0
    assert "did you mean" not in capsys.readouterr().out


def test_no_gpus_here_suggests_gpus_flag(capsys, monkeypatch):
    from verl_cluster.diagnostics import gather
    from verl_cluster.facts.model import NodeFacts

    seen = {}

    def fake(head_ip=None, deep=True):
        seen.update(head_ip=head_ip, deep=deep)
        return NodeFacts(host="cpu", nvml_error="no driver")

    monkeypatch.setattr(gather, "local_facts", fake)
    assert main(["plan", PPO]) == 2
    assert "--gpus 1x8xH100-80GB" in capsys.readouterr().err
    assert seen == {"head_ip": None, "deep": False}  # the diagnostics probe, not the old pynvml reader


def test_local_machine_uses_the_diagnostics_probe(capsys):
    """No hardware given: this machine as the probe sees it. On a CPU machine a clean exit 2, no traceback."""
    from verl_cluster.diagnostics.gather import local_facts

    here = local_facts(head_ip=None, deep=False)
    rc = main(["plan", PPO, "--json"])
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err and "internal error" not in captured.err
    if not here.gpus:
        assert rc == 2 and "no GPUs on this machine" in captured.err
    else:
        assert rc in (0, 1) and json.loads(captured.out)["hardware"]


def test_recorded_h200_facts_plan(capsys):
    """The facts recorded on the real 2x H200 machine: one NVLinked P2P island, no flash-attn -> sdpa."""
    rc = main(["plan", PPO, "--facts", str(ROOT / "tests/fixtures/facts/h200x2_recorded.json"), "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert rc == 0 and doc["feasible"] is True
    assert doc["overrides"]["+actor_rollout_ref.model.override_config.attn_implementation"] == "sdpa"
    assert doc["overrides"]["actor_rollout_ref.model.use_remove_padding"] is False
    assert doc["overrides"]["trainer.nnodes"] == 1 and doc["overrides"]["trainer.n_gpus_per_node"] == 2
    assert any("P2P islands [0-1]" in r for r in doc["reasons"])  # the NVLinked pair is one island
    assert any("flash-attn is not installed" in r for r in doc["reasons"])


def _localhost_spec():
    from verl_cluster.config.cluster import load_cluster

    return load_cluster(ROOT / "cluster_configs/local.yaml")


def test_plan_for_job_on_localhost_cluster_is_a_clean_error_without_gpus():
    """plan_for_job gathers the facts of a one-node localhost cluster (the real probe, local runner)."""
    import pytest

    from verl_cluster.config.job import load_job
    from verl_cluster.diagnostics.gather import local_facts
    from verl_cluster.errors import ConfigError, PlanError
    from verl_cluster.submit.integrations import plan_for_job

    job = load_job(PPO)
    if local_facts(head_ip=None, deep=False).gpus:
        assert plan_for_job(job, _localhost_spec()).to_dict()["hardware"]
        return
    with pytest.raises((PlanError, ConfigError)) as exc:
        plan_for_job(job, _localhost_spec())
    assert "no GPUs" in exc.value.message


def test_plan_for_job_matches_what_submit_calls(monkeypatch):
    """submit/integrations.placement_plan does what plan_for_job(job, spec) does: gather every node, then plan."""
    import inspect

    from verl_cluster.config.job import load_job
    from verl_cluster.diagnostics import gather
    from verl_cluster.facts.model import from_dict, NodeFacts
    from verl_cluster.submit import integrations
    from verl_cluster.submit.integrations import plan_for_job

    assert list(inspect.signature(plan_for_job).parameters)[:2] == ["job", "spec"]
    recorded = json.loads((ROOT / "tests/fixtures/facts/h200x2_recorded.json").read_text())
    recorded = recorded if isinstance(recorded, list) else recorded.get("nodes", [recorded])
    spec = _localhost_spec()
    monkeypatch.setattr(gather, "gather_facts", lambda spec, runners=None, timeout=90.0: {
        spec.head.host: from_dict(NodeFacts, {**recorded[0], "host": spec.head.host})})
    job = load_job(PPO)
    assert (job.entrypoint or "").startswith("verl.trainer.main_")  # a verl trainer: submit plans it
    info = integrations.placement_plan(job, spec)
    assert info.feasible is True and info.overrides["trainer.n_gpus_per_node"] == 2, info.note
    assert "not available" not in info.note


def test_cluster_flag_unreachable_node_exit_1(capsys, monkeypatch):
    from verl_cluster.diagnostics import gather
    from verl_cluster.errors import RunnerError
    from verl_cluster.facts.model import from_dict, NodeFacts

    recorded = json.loads((ROOT / "tests/fixtures/facts/h200x2_recorded.json").read_text())
    recorded = recorded if isinstance(recorded, list) else recorded.get("nodes", [recorded])

    def fake(spec, runners=None, timeout=90.0):
        return {"10.0.0.1": from_dict(NodeFacts, {**recorded[0], "host": "10.0.0.1"}),
                "10.0.0.2": RunnerError("10.0.0.2", "ssh: connect to host 10.0.0.2 port 22: No route to host")}

    monkeypatch.setattr(gather, "gather_facts", fake)
    assert main(["plan", PPO, "--cluster", str(ROOT / "cluster_configs/two-nodes-ssh.yaml")]) == 1
    text = capsys.readouterr().err
    assert "10.0.0.2" in text and "No route to host" in text and "Traceback" not in text


def test_cluster_flag_plans_on_gathered_facts(capsys, monkeypatch):
    from verl_cluster.diagnostics import gather
    from verl_cluster.facts.model import from_dict, NodeFacts

    recorded = json.loads((ROOT / "tests/fixtures/facts/h200x2_recorded.json").read_text())
    recorded = recorded if isinstance(recorded, list) else recorded.get("nodes", [recorded])
    monkeypatch.setattr(gather, "gather_facts", lambda spec, runners=None, timeout=90.0: {
        h: from_dict(NodeFacts, {**recorded[0], "host": h}) for h in ("10.0.0.1", "10.0.0.2")})
    assert main(["plan", PPO, "--cluster", str(ROOT / "cluster_configs/two-nodes-ssh.yaml"), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["overrides"]["trainer.nnodes"] == 2 and doc["overrides"]["trainer.n_gpus_per_node"] == 2


def test_heterogeneous_facts_exit_1(capsys):
    assert main(["plan", PPO, "--gpus", "1x8xH100-80GB,1x4xH100-80GB"]) == 1
    assert "different GPU counts" in capsys.readouterr().err


def test_a_plan_at_the_gpus_limit_says_so_first_and_placement_at_limit_false_refuses_it(capsys):
    qwen3 = str(ROOT / "tests/fixtures/verl_recipes/run_qwen3-8b.yaml")
    assert main(["plan", qwen3, "--brief"]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert "fits at the GPU's limit (actor update: no room for longer sequences than planned)" in first
    assert main(["plan", qwen3]) == 0
    assert "79.6 at the limit" in capsys.readouterr().out  # the phase's row
    assert main(["plan", qwen3, "placement.at_limit=false", "--json"]) == 1  # room only: the pinned micro 32 has none
    doc = json.loads(capsys.readouterr().out)
    assert doc["binding"].startswith("actor update memory") and "at the least" not in doc["binding"]


def test_the_edit_distance_is_levenshtein_within_its_band():
    """settings._edits against the plain dynamic programme on every pair of short strings over 3 letters."""
    import itertools

    from verl_cluster.placement.settings import _edits

    def full(a, b):
        prev = list(range(len(b) + 1))
        for i, ca in enumerate(a, 1):
            cur = [i]
            for j, cb in enumerate(b, 1):
                cur.append(min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (ca != cb)))
            prev = cur
        return prev[-1]

    words = ["".join(w) for n in range(6) for w in itertools.product("ab_", repeat=n)]
    for a, b in itertools.product(words[::3], words[::2]):
        assert _edits(a, b, 2) == min(full(a, b), 3), (a, b)
