"""Checks that cannot run here run where the job runs, and say where they ran (issue 32 item 2): verl's config in
the head's Python when this machine has no verl (a default install), the data files' columns on the nodes; an
empty parquet and `plan --data` without pyarrow get the right cause and fix."""

import os
import shutil
import sys
from pathlib import Path

import pytest

from verl_cluster.cli import main
from verl_cluster.config.cluster import load_cluster
from verl_cluster.config.job import JobSpec
from verl_cluster.submit import node_files

ROOT = Path(__file__).resolve().parents[2]
GSM8K = str(ROOT / "launch/gsm8k.yaml")
SAMPLE = str(ROOT / "tests/fixtures/prompts/gsm8k_train.parquet")
PPO = JobSpec(name="j", entrypoint="verl.trainer.main_ppo")
NO_VERL = shutil.which("python3", path="/usr/bin:/bin")  # the system Python: neither verl nor pyarrow


def _local(tmp_path, python_dir=None):
    c = tmp_path / "c.yaml"
    ray = f"\nray: {{ray_executable: {python_dir}/ray}}" if python_dir else ""
    c.write_text(f"cluster_name: w\nhead: {{host: localhost}}{ray}\n")
    return load_cluster(c)


def _has(python, module):
    import subprocess

    return subprocess.run([python, "-c", f"import {module}"], capture_output=True).returncode == 0


def _verl_here():
    from verl_cluster.submit.verl_config import verl_available

    return verl_available(sys.executable)


@pytest.mark.skipif(not NO_VERL or _has(NO_VERL, "verl"), reason="needs a Python without verl as 'this machine'")
@pytest.mark.skipif(not _verl_here(), reason="the head's Python here (the suite's venv) must have verl")
def test_verl_config_runs_on_the_head_when_this_machine_lacks_verl(tmp_path, monkeypatch):
    from verl_cluster.submit.preflight import check_verl

    monkeypatch.setenv("VC_VERL_PYTHON", NO_VERL)  # this machine as a default install sees it: no verl
    found = check_verl(PPO, {"data.train_batch_sizee": 4}, _local(tmp_path))
    errors = [f for f in found if f.level == "error"]
    assert [f.message for f in errors] == ["unknown verl key `data.train_batch_sizee`"]
    assert errors[0].hint == "did you mean `data.train_batch_size`?" and errors[0].where == "on localhost"


@pytest.mark.skipif(not NO_VERL or _has(NO_VERL, "verl"), reason="needs a Python without verl")
def test_a_head_without_verl_says_so_and_where(tmp_path, monkeypatch):
    from verl_cluster.submit.preflight import check_verl

    bin_ = tmp_path / "env/bin"
    bin_.mkdir(parents=True)
    os.symlink(NO_VERL, bin_ / "python")
    monkeypatch.setenv("VC_VERL_PYTHON", NO_VERL)
    found = check_verl(PPO, {"data.train_batch_size": 4}, _local(tmp_path, bin_))
    assert [(f.level, f.where) for f in found] == [("skipped", "on localhost")]
    assert f"verl is not installed in {bin_ / 'python'}" in found[0].message or "not installed" in found[0].message
    assert "install verl where the job runs" in found[0].hint


def test_verl_here_says_here(monkeypatch):
    from verl_cluster.submit.preflight import verl_check_where

    monkeypatch.setattr("verl_cluster.submit.verl_config.verl_available", lambda python=None: False)
    res, where = verl_check_where(PPO, {}, None)  # no cluster (or verl here): the check stays here
    assert where == "here" and not res.ran and "not installed here" in res.skipped


@pytest.mark.skipif(not NO_VERL or _has(NO_VERL, "pyarrow"), reason="needs a Python without pyarrow")
def test_columns_unread_anywhere_are_a_skipped_finding_not_silence(tmp_path, monkeypatch):
    from verl_cluster.submit.preflight import check_files

    bin_ = tmp_path / "env/bin"
    bin_.mkdir(parents=True)
    os.symlink(NO_VERL, bin_ / "python")  # the node's Python has no pyarrow
    monkeypatch.setattr("verl_cluster.submit.preflight.local_schema", lambda path: None)  # nor has this machine
    found = check_files(_local(tmp_path, bin_), PPO, {"data.train_files": [SAMPLE]})
    data = [f for f in found if f.check == "data"]
    assert [f.level for f in data] == ["skipped"], data
    assert "not checked: pyarrow is not installed" in data[0].message and "verl-cluster[data]" in data[0].hint
    assert data[0].where == "on localhost"


def test_columns_checked_on_the_node_say_where(tmp_path):
    from verl_cluster.submit.preflight import check_files

    found = check_files(_local(tmp_path), PPO, {"data.train_files": [SAMPLE]})
    ok = [f for f in found if f.check == "data" and f.level == "ok"]
    assert ok and ok[0].where == "on localhost", found


def test_preflight_table_and_json_carry_where(capsys):
    from verl_cluster.cli.submit_cmd import print_preflight
    from verl_cluster.submit.findings import Finding
    from verl_cluster.submit.preflight import PreflightReport

    report = PreflightReport([Finding("ok", "verl-config", "composes", where="on head-1")])
    print_preflight(report)
    assert "composes (on head-1)" in capsys.readouterr().err
    assert report.to_json()[0]["where"] == "on head-1"


def test_empty_parquet_is_named_empty(tmp_path):
    empty = tmp_path / "train.parquet"
    empty.write_bytes(b"")
    got = node_files.probe_data(str(empty))
    assert got["error"] == "empty file (0 bytes)"
    short = tmp_path / "short.parquet"
    short.write_bytes(b"PAR1")
    assert node_files.probe_data(str(short))["error"] == "not a parquet file (4 bytes)"


def test_plan_data_empty_file(tmp_path, capsys):
    empty = tmp_path / "train.parquet"
    empty.write_bytes(b"")
    assert main(["plan", GSM8K, "--gpus", "1x8xH100-80GB", "--data", str(empty)]) == 2
    err = capsys.readouterr().err
    assert "empty file (0 bytes)" in err and "Errno" not in err


def test_plan_data_without_pyarrow_names_the_extra(monkeypatch, capsys):
    from verl_cluster.submit import prompt_probe

    def no_pyarrow(*a, **k):
        raise ImportError("No module named 'pyarrow'")

    monkeypatch.setattr(prompt_probe, "sample_prompts", no_pyarrow)
    assert main(["plan", GSM8K, "--gpus", "1x8xH100-80GB", "--data", SAMPLE]) == 2
    err = capsys.readouterr().err
    assert "pyarrow" in err and "pip install 'verl-cluster[data]'" in err and "prompt` column" not in err


def test_readme_names_the_data_extra():
    text = (ROOT / "README.md").read_text()
    assert "verl-cluster[data]" in text

