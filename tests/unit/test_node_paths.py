"""`~` and `$VAR` in the paths verl opens: expanded on every node, sent as one absolute path, refused when the
nodes disagree (node_paths.judge on probe answers, and the real node probe on a localhost cluster)."""

import shutil
from pathlib import Path

from verl_cluster.config.cluster import load_cluster
from verl_cluster.config.job import JobSpec
from verl_cluster.submit.node_paths import judge, to_expand, unexpanded
from verl_cluster.submit.preflight import PreflightReport, check_nodes
from verl_cluster.jobs.request import override_args

ROOT = Path(__file__).resolve().parents[2]
GSM8K = ROOT / "tests/fixtures/prompts/gsm8k_train.parquet"
PPO = JobSpec(name="t", entrypoint="verl.trainer.main_ppo")


def _answer(**expanded):
    return {"data": [], "expanded": {raw: {"path": path, "unset": []} for raw, path in expanded.items()}}


def test_only_local_paths_with_a_tilde_or_a_variable_of_path_keys_are_expanded():
    overrides = {"data.train_files": ["~/d/train.parquet", "/abs/more.parquet"], "data.val_files": "$DATA/test.parquet",
                 "actor_rollout_ref.model.path": "Qwen/Qwen2.5-0.5B-Instruct", "critic.model.path": "~/models/q",
                 "trainer.default_local_dir": "~/ckpt", "+trainer.validation_data_dir": "~/val",
                 "trainer.experiment_name": "~not-a-path", "trainer.resume_from_path": "hdfs://nn/~x"}
    assert to_expand(overrides) == {"data.train_files": ["~/d/train.parquet"], "data.val_files": ["$DATA/test.parquet"],
                                    "critic.model.path": ["~/models/q"], "trainer.default_local_dir": ["~/ckpt"],
                                    "+trainer.validation_data_dir": ["~/val"]}


def test_nodes_that_agree_give_verl_the_absolute_path_in_place():
    overrides = {"data.train_files": ["~/d/train.parquet", "/abs/more.parquet"], "trainer.total_epochs": 1,
                 "trainer.default_local_dir": "~/ckpt"}
    same = _answer(**{"~/d/train.parquet": "/home/u/d/train.parquet", "~/ckpt": "/home/u/ckpt"})
    rewrites, found = judge(overrides, {"10.0.0.1": same, "10.0.0.2": same})
    assert rewrites == {"data.train_files": ["/home/u/d/train.parquet", "/abs/more.parquet"],
                        "trainer.default_local_dir": "/home/u/ckpt"}
    assert [(f.level, f.check) for f in found] == [("ok", "paths")]
    assert "~/d/train.parquet -> /home/u/d/train.parquet" in found[0].message
    sent = PreflightReport(found, rewrites).with_paths(overrides)
    assert list(sent) == list(overrides)  # the keys keep their order
    assert override_args(sent) == ["data.train_files=[/home/u/d/train.parquet,/abs/more.parquet]",
                                   "trainer.total_epochs=1", "trainer.default_local_dir=/home/u/ckpt"]


def test_nodes_with_another_home_are_refused_naming_both():
    overrides = {"data.train_files": ["~/d/train.parquet"]}
    rewrites, found = judge(overrides, {"10.0.0.1": _answer(**{"~/d/train.parquet": "/root/d/train.parquet"}),
                                        "10.0.0.2": _answer(**{"~/d/train.parquet": "/home/u/d/train.parquet"})})
    assert rewrites == {}
    (f,) = found
    assert (f.level, f.check) == ("error", "data")  # the job's input: exit 2
    assert f.message == ("data.train_files: `~/d/train.parquet` is a different path on each node (/root/d/train.parquet "
                         "on 10.0.0.1; /home/u/d/train.parquet on 10.0.0.2): verl would read another file on each")
    assert f.hint == "write one absolute path that every node has, e.g. data.train_files=/root/d/train.parquet"


def test_an_unset_variable_is_an_error_naming_it_and_the_node():
    ans = {"data": [], "expanded": {"$DATA/t.parquet": {"path": "$DATA/t.parquet", "unset": ["DATA"]}}}
    ok = _answer(**{"$DATA/t.parquet": "/data/t.parquet"})
    rewrites, found = judge({"data.val_files": "$DATA/t.parquet"}, {"h1": ok, "h2": ans})
    assert rewrites == {}
    assert [f.message for f in found] == ["data.val_files: `$DATA/t.parquet` uses $DATA, not set on h2"]
    assert "env: {DATA: ...}" in found[0].hint


def test_an_unreachable_node_rewrites_nothing_and_adds_nothing():
    """The node's own error says it was not checked; a path no one could expand there is not sent expanded."""
    overrides = {"actor_rollout_ref.model.path": "~/m"}
    rewrites, found = judge(overrides, {"h1": _answer(**{"~/m": "/root/m"}), "h2": OSError("unreachable")})
    assert (rewrites, found) == ({}, [])


def test_a_path_sent_as_written_gets_a_warning():
    (w,) = unexpanded({"data.train_files": ["~/d/t.parquet"], "data.val_files": ["/abs/v.parquet"]})
    assert w.level == "warning" and w.message.startswith("data.train_files: ~/d/t.parquet sent to verl as written, not "
                                                         "expanded on every node")


def test_the_real_probe_expands_home_and_the_jobs_env_on_a_localhost_cluster(tmp_path, monkeypatch):
    """node_files runs as the nodes run it (a Python subprocess): `~` in the node's HOME, `$DATA` from the job's
    env; the data check finds the file there and the request gets the absolute paths."""
    home, data = tmp_path / "home", tmp_path / "shared"
    (home / "d").mkdir(parents=True)
    data.mkdir()
    shutil.copy(GSM8K, home / "d/train.parquet")
    shutil.copy(GSM8K, data / "val.parquet")
    monkeypatch.setenv("HOME", str(home))
    c = tmp_path / "c.yaml"
    c.write_text("cluster_name: np\nhead: {host: localhost}\n")
    spec = load_cluster(c)
    job = JobSpec(name="t", entrypoint="verl.trainer.main_ppo", env={"DATA": str(data)})
    overrides = {"data.train_files": ["~/d/train.parquet"], "data.val_files": ["$DATA/val.parquet"],
                 "trainer.logger": ["console"]}
    found, rewrites = check_nodes(spec, job, overrides)
    assert rewrites == {"data.train_files": [str(home / "d/train.parquet")],
                        "data.val_files": [str(data / "val.parquet")]}
    assert not [f for f in found if f.level == "error"], found
    assert "2 data file(s) on every node" in " ".join(f.message for f in found)


def test_without_the_checks_the_paths_are_still_expanded_on_the_nodes(tmp_path, monkeypatch):
    """--skip-preflight and a watched run's next attempt (plan_submission(run_checks=False)) send verl the same
    absolute paths; where no node answers, the paths go as written with a warning each."""
    from verl_cluster.errors import RunnerError
    from verl_cluster.submit import preflight

    monkeypatch.setenv("HOME", str(tmp_path))
    c = tmp_path / "c.yaml"
    c.write_text("cluster_name: np\nhead: {host: localhost}\n")
    spec = load_cluster(c)
    overrides = {"data.train_files": ["~/d/train.parquet"], "trainer.default_local_dir": "~/ckpt"}
    rewrites, found = preflight.expand_paths(spec, PPO, overrides)
    assert rewrites == {"data.train_files": [f"{tmp_path}/d/train.parquet"],
                        "trainer.default_local_dir": f"{tmp_path}/ckpt"}
    assert [f.level for f in found] == ["ok"]
    monkeypatch.setattr(preflight, "probe_node_files",
                        lambda *a, **kw: {"localhost": RunnerError("localhost", "no answer")})
    rewrites, found = preflight.expand_paths(spec, PPO, overrides)
    assert rewrites == {}
    assert [f.message.split(":")[0] for f in found if f.level == "warning"] == ["data.train_files",
                                                                               "trainer.default_local_dir"]


def test_omegaconfs_interpolations_are_left_to_verl():
    """`${oc.env:DATA}` is OmegaConf's (verl resolves it when it composes its config): not a shell variable, not
    an error; a bare `$VAR` beside it is expanded."""
    from verl_cluster.submit import node_files

    assert to_expand({"data.train_files": ["${oc.env:DATA}/t.parquet"], "trainer.default_local_dir": "/c/${x}"}) == {}
    assert to_expand({"data.val_files": "${oc.env:DATA}/$SPLIT.parquet"}) == {"data.val_files":
                                                                             ["${oc.env:DATA}/$SPLIT.parquet"]}
    import os

    os.environ["VC_TEST_SPLIT"] = "val"
    try:
        got = node_files.expansion("${oc.env:DATA}/$VC_TEST_SPLIT/$VC_TEST_UNSET_VAR.parquet")
    finally:
        del os.environ["VC_TEST_SPLIT"]
    assert got == {"path": "${oc.env:DATA}/val/$VC_TEST_UNSET_VAR.parquet", "unset": ["VC_TEST_UNSET_VAR"]}
