"""Secrets: one masking rule everywhere, private files from their first byte, an importer no script can stall."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from verl_cluster.config.cluster import load_cluster
from verl_cluster.config.names import MASK, is_secret_name, masked_env
from verl_cluster.nodes.auth import ensure_token
from verl_cluster.lifecycle.commands import plan_start
from verl_cluster.jobs.request import RayJobRequest, TorchrunRequest, NodeLaunch
from verl_cluster.verl_scripts.shell_words import looks_secret
from verl_cluster.runners.local import LocalRunner

ROOT = Path(__file__).resolve().parents[2]
SECRET_LOOKING = {"HF_TOKEN": "a1", "WANDB_API_KEY": "a2", "DB_PASSWORD": "a3", "AWS_SECRET_ACCESS_KEY": "a4",
                  "MY_CREDENTIALS": "a5", "SMTP_PASS": "a6", "OPENAI_APIKEY": "a7"}
# plain names that look like secrets' (RAY_AUTH_* would be one, but ray.env may not set it: security.auth does)
PLAIN = {"TOKENIZERS_PARALLELISM": "false", "HF_TOKENIZERS_CACHE": "/p", "MAX_TOKEN_LEN": "8", "NCCL_DEBUG": "WARN"}


@pytest.fixture(autouse=True)
def _home(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))


def test_one_rule_for_up_submit_torchrun_and_import(tmp_path):
    env = {**SECRET_LOOKING, **PLAIN, "LISTED": "a8"}
    assert {k for k in env if is_secret_name(k, ["LISTED"])} == set(SECRET_LOOKING) | {"LISTED"}
    assert all(looks_secret(k) == is_secret_name(k) for k in env)  # import decides with the same rule
    p = tmp_path / "c.yaml"
    p.write_text("cluster_name: c\nhead: {host: localhost}\nray:\n  env: " + json.dumps(env) + "\n")
    up_shown = plan_start(load_cluster(p))[0].to_json()["env"]
    ray_shown = RayJobRequest("id", ["x"], {"env_vars": env}, {}, ("LISTED",)).describe()["runtime_env"]["env_vars"]
    tr_shown = TorchrunRequest("r", "h", 1, 1, [NodeLaunch("h", 0, ["x"], env)], secret_names=("LISTED",)
                               ).describe()["nodes"][0]["env"]
    assert up_shown["LISTED"] == "a8"  # a cluster file lists no secrets: the pattern alone
    for shown in (up_shown, ray_shown, tr_shown):
        for k in (*SECRET_LOOKING, *(["LISTED"] if shown is not up_shown else [])):
            assert shown[k] == MASK, (k, shown)
        for k, v in PLAIN.items():
            assert shown[k] == v
    assert masked_env({"LISTED": "x"}, ["LISTED"]) == {"LISTED": MASK}


def test_submit_dry_run_masks_pattern_names_it_was_not_told_about(tmp_path, capsys):
    from verl_cluster.cli import main

    job = tmp_path / "j.yaml"
    job.write_text("name: j\ncommand: [python, x.py]\nlauncher: torchrun\nenv: {DB_PASSWORD: hunter2, PLAIN: visible}\n")
    rc = main(["submit", str(job), "-c", str(ROOT / "cluster_configs/local.yaml"), "--dry-run", "--json"])
    out = capsys.readouterr().out
    assert rc == 0 and "hunter2" not in out and "visible" in out


def test_job_records_are_private(tmp_path):
    from verl_cluster.records import job_records

    old = os.umask(0o022)
    try:
        job_records.record("raysubmit_abc", str(tmp_path / "c.yaml"), "c", "j", overrides=["x=secretish"])
    finally:
        os.umask(old)
    rec = tmp_path / ".verl-cluster" / "jobs" / "raysubmit_abc.json"
    assert oct(rec.stat().st_mode & 0o777) == "0o600"
    assert oct(rec.parent.stat().st_mode & 0o777) == "0o700"


def _watch_modes(monkeypatch, folder: Path, seen: list):
    """Record the mode of every file under `folder` whenever a file is chmod-ed or renamed there."""
    real_chmod, real_replace = os.chmod, os.replace

    def snap():
        for f in folder.rglob("*"):
            seen.append((str(f), f.stat().st_mode & 0o777))

    def chmod(p, mode, *a, **kw):
        snap()
        return real_chmod(p, mode, *a, **kw)

    def replace(a, b, *x, **kw):
        snap()
        return real_replace(a, b, *x, **kw)

    monkeypatch.setattr(os, "chmod", chmod)
    monkeypatch.setattr(os, "replace", replace)


def test_custom_token_file_on_a_local_head_is_private_from_the_first_byte(tmp_path, monkeypatch):
    p = tmp_path / "c.yaml"
    p.write_text(f"cluster_name: c\nhead: {{host: localhost}}\nsecurity: {{token_file: {tmp_path}/t/a/b/token}}\n")
    spec = load_cluster(p)
    old = os.umask(0o022)
    try:
        token = ensure_token(spec)
        assert oct(token.stat().st_mode & 0o777) == "0o600"
        for d in (tmp_path / "t", tmp_path / "t/a", tmp_path / "t/a/b"):
            assert oct(d.stat().st_mode & 0o777) == "0o700", d
        # `up` puts it where the node's Ray reads it: never readable by others, not even before a chmod
        seen: list = []
        _watch_modes(monkeypatch, tmp_path / ".verl-cluster", seen)
        (tmp_path / ".verl-cluster").mkdir(mode=0o700)
        dst = LocalRunner().put_file(str(token), "~/.verl-cluster/c/auth_token", 0o600)
    finally:
        os.umask(old)
    assert seen and all(mode & 0o077 == 0 for _, mode in seen), seen
    assert Path(dst).read_text() == token.read_text()
    assert oct(Path(dst).stat().st_mode & 0o777) == "0o600"
    assert oct(Path(dst).parent.stat().st_mode & 0o777) == "0o700"


@pytest.mark.parametrize("expr", ["9**9**9", "2**64", "2**62 + 2**62", "(10**18) * (10**18)", "2**-1",
                                  "+".join(["1"] * 2000), "(" * 150 + "1" + ")" * 150])
def test_import_arithmetic_is_bounded(tmp_path, expr):
    """Arithmetic that would take minutes (or forever) to evaluate is refused; each case runs in a child so that a
    case which is not refused fails the test instead of hanging it."""
    script = tmp_path / "run.sh"
    script.write_text(f"export N=$(( {expr} ))\npython3 -m verl.trainer.main_ppo trainer.x=$N\n")
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "verl_cluster", "import", str(script)], capture_output=True, text=True,
                       timeout=20, env={**os.environ, "HOME": str(tmp_path)}, cwd=tmp_path)
    assert time.monotonic() - t0 < 10
    assert r.returncode == 2 and r.stderr.startswith(f"error: {script}:1: $((") and "Traceback" not in r.stderr


def test_import_arithmetic_still_computes_64_bit_values(tmp_path):
    from verl_cluster.verl_scripts.shell_words import read_script

    run = read_script("export N=$(( 2**62 - 1 + 2**62 ))\nexport M=$(( -7 / 2 ))\npython3 -m m x=$N y=$M\n",
                      "s.sh", {})
    assert run.exported["N"][0] == str(2**63 - 1) and run.exported["M"][0] == "-3"
