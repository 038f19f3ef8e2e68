"""One way to say things: `-c/--cluster` and positional key=value in every cluster command, job records that
name a job's cluster, and the shell completion script (run in a real bash)."""

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.harness.cli import run_cli
from verl_cluster.cli import build_parser, main
from verl_cluster.cli.cluster_args import is_override, packaged_default, resolve_cluster
from verl_cluster.errors import ConfigError
from verl_cluster.records import job_records

ROOT = Path(__file__).resolve().parents[2]
LOCAL = str(ROOT / "cluster_configs/local.yaml")
CLUSTER_COMMANDS = ["up", "down", "status", "check", "jobs", "logs", "stop", "dashboard"]


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    return tmp_path


def ns(cluster=None, pos=None, overrides=()):
    return argparse.Namespace(cluster=cluster, cluster_pos=pos, overrides=list(overrides))


@pytest.mark.parametrize("word,expected", [("ssh.user=me", True), ("ray.start_args=[a,b]", True),
                                           ("x.yaml", False), ("./a=b.yaml", False), ("/tmp/c=1.yaml", False)])
def test_is_override(word, expected):
    assert is_override(word) is expected


def test_resolve_cluster_sorts_positional_words(home, monkeypatch):
    monkeypatch.chdir(home)
    monkeypatch.delenv("VERL_CLUSTER", raising=False)
    (home / "my.yaml").write_text("cluster_name: my\n")
    a = ns(pos="a.b=1", overrides=["c.d=2"])  # argparse put the first override in the FILE slot
    assert resolve_cluster(a) == packaged_default() and a.overrides == ["a.b=1", "c.d=2"]
    assert resolve_cluster(a) == packaged_default() and a.overrides == ["a.b=1", "c.d=2"]  # sorted once
    a = ns(pos="my.yaml", overrides=["c.d=2"])
    assert resolve_cluster(a) == "my.yaml" and a.overrides == ["c.d=2"]
    a = ns(cluster="my.yaml", pos="my.yaml")  # the same file both ways is fine
    assert resolve_cluster(a) == "my.yaml"
    assert resolve_cluster(ns(), fallback=False) is None
    with pytest.raises(ConfigError, match="two clusters given: `a.yaml` and `b.yaml`"):
        resolve_cluster(ns(cluster="a.yaml", pos="b.yaml"))


@pytest.mark.parametrize("cmd", CLUSTER_COMMANDS)
def test_every_cluster_command_takes_dash_c_and_key_value(cmd, capsys, home):
    job = ["some-job-1"] if cmd in ("logs", "stop") else []
    # a misspelt override reaches the config loader (which names it) before anything touches the network
    rc = main([cmd, *job, "-c", LOCAL, "ssh.conect_timeout_s=3"])
    err = capsys.readouterr().err
    assert rc == 2 and "conect_timeout_s" in err and "connect_timeout_s" in err, err
    rc = main([cmd, *job, LOCAL, "ssh.conect_timeout_s=3"])  # the positional FILE, kept as an alias
    assert rc == 2 and "conect_timeout_s" in capsys.readouterr().err


def test_plan_and_submit_take_dash_c():
    parser = build_parser()
    assert parser.parse_args(["plan", "j.yaml", "-c", "x.yaml"]).cluster == "x.yaml"
    assert parser.parse_known_args(["submit", "j.yaml", "-c", "x.yaml", "a=1"])[0].cluster == "x.yaml"


def test_check_set_is_a_deprecated_alias_that_still_applies():
    r = run_cli("check", "-c", LOCAL, "--set", "ssh.conect_timeout_s=3")
    assert r.returncode == 2, r.stderr
    assert "`--set` is deprecated" in r.stderr and "check ssh.conect_timeout_s=3" in r.stderr
    assert "conect_timeout_s" in r.stderr.split("deprecated", 1)[1] and "Traceback" not in r.stderr
    r = run_cli("check", "--set", "foo")
    assert r.returncode == 2 and "--set foo: expected key=value" in r.stderr


def test_job_records_name_the_cluster(home):
    job_records.record("smoke-1", LOCAL, "local", "smoke")
    job_records.record("../evil", LOCAL, "local", "x")  # never a path
    assert job_records.lookup("smoke-1")["cluster_file"] == LOCAL
    assert job_records.lookup("../evil") is None and job_records.lookup("nope") is None
    assert job_records.recent_ids() == ["smoke-1"]
    assert [(k.name, k.cluster_file) for k in job_records.known_clusters()] == [("local", LOCAL)]
    assert json.loads((home / ".verl-cluster/jobs/smoke-1.json").read_text())["job"] == "smoke"


def test_logs_and_stop_find_the_cluster_from_the_job_record(home, tmp_path, monkeypatch):
    from verl_cluster.cli.jobs_cmds import load_for_job

    monkeypatch.delenv("VERL_CLUSTER", raising=False)
    other = tmp_path / "c.yaml"
    other.write_text(Path(LOCAL).read_text().replace("cluster_name: local", "cluster_name: recorded"))
    job_records.record("smoke-2", str(other), "recorded", "smoke")
    assert load_for_job(ns(), "smoke-2").cluster_name == "recorded"
    assert load_for_job(ns(cluster=LOCAL), "smoke-2").cluster_name == "local"  # -c wins
    assert load_for_job(ns(), "unknown-job").source == packaged_default()


# ---- shell completion ----

@pytest.fixture(scope="module")
def bash_script(tmp_path_factory):
    path = tmp_path_factory.mktemp("completion") / "vc.bash"
    path.write_text(run_cli("completion", "bash").stdout)
    return path


def complete(script, *words, home=None):
    """COMPREPLY of the generated bash function for the words typed so far (the last one is being completed)."""
    code = ('source "$1"; shift; COMP_WORDS=(verl-cluster "$@"); COMP_CWORD=$((${#COMP_WORDS[@]}-1)); '
            '_verl_cluster; printf "%s\\n" "${COMPREPLY[@]}"')
    env = {"PATH": "/usr/bin:/bin", "HOME": str(home or "/nonexistent")}
    r = subprocess.run(["bash", "-c", code, "_", str(script), *words], capture_output=True, text=True, cwd=ROOT,
                       env=env, timeout=30)
    assert r.returncode == 0, r.stderr
    return [w for w in r.stdout.splitlines() if w]


@pytest.mark.skipif(not shutil.which("bash"), reason="bash not installed")
def test_bash_completion(bash_script, home):
    assert {"dashboard", "logs", "completion", "submit"} <= set(complete(bash_script, ""))
    assert complete(bash_script, "da") == ["dashboard"]
    assert complete(bash_script, "submit", "--dr") == ["--dry-run"]
    assert complete(bash_script, "submit", "--launcher", "") == ["auto", "ray", "torchrun"]
    assert complete(bash_script, "completion", "") == ["bash", "zsh"]
    assert complete(bash_script, "dashboard", "-c", "cluster_configs/loc") == ["cluster_configs/local.yaml"]
    assert complete(bash_script, "status", "cluster_configs/loc") == ["cluster_configs/local.yaml"]
    assert complete(bash_script, "dashboard", "--port", "") == []  # a number: nothing to offer
    assert "--set" not in complete(bash_script, "check", "--")  # deprecated: not offered
    job_records.record("smoke-20261125-1", LOCAL, "local", "smoke")
    job_records.record("gsm8k-20261125-2", LOCAL, "local", "gsm8k")
    assert complete(bash_script, "logs", "sm", home=home) == ["smoke-20261125-1"]
    assert sorted(complete(bash_script, "stop", "-c", "x.yaml", "", home=home)) == [
        "gsm8k-20261125-2", "smoke-20261125-1"]
    # after the job id comes the cluster file (the positional alias of -c)
    assert complete(bash_script, "logs", "smoke-20261125-1", "cluster_configs/loc", home=home) == [
        "cluster_configs/local.yaml"]


def test_zsh_script_completes_job_ids_in_zsh(home):
    text = run_cli("completion", "zsh").stdout
    assert text.startswith("autoload -U +X bashcompinit && bashcompinit")
    assert "complete -F _verl_cluster verl-cluster" in text
    if not shutil.which("zsh"):
        return
    job_records.record("smoke-20261125-3", LOCAL, "local", "smoke")
    # as zsh's bashcompinit calls it: COMP_WORDS/COMP_CWORD set, the function run through its compgen -F
    code = ('autoload -U compinit && compinit -u -d "$HOME/zcd"; eval "$1"; '
            'COMP_WORDS=(verl-cluster logs ""); COMP_CWORD=2; _verl_cluster; print -l -- "${COMPREPLY[@]}"')
    r = subprocess.run(["zsh", "-c", code, "_", text], capture_output=True, text=True, timeout=30,
                       env={"PATH": "/usr/bin:/bin", "HOME": str(home)})
    assert "smoke-20261125-3" in r.stdout.split(), r.stdout + r.stderr


def test_completion_rejects_other_shells():
    r = run_cli("completion", "fish")
    assert r.returncode == 2 and "invalid choice: 'fish'" in r.stderr


def test_cli_imports_only_the_chosen_command():
    code = ("import sys; from verl_cluster.cli import build_parser; build_parser('{m}'); "
            "print(sorted(m for m in ('ray', 'paramiko', 'verl_cluster.cli.submit_cmd') if m in sys.modules))")
    for module in ("dashboard_cmd", "completion_cmd"):
        r = subprocess.run([sys.executable, "-c", code.format(m=module)], capture_output=True, text=True, cwd=ROOT,
                           timeout=60)
        assert r.stdout.strip() == "[]", (module, r.stdout, r.stderr)
