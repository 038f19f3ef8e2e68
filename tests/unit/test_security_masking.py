"""What is masked: secret names (with *_PAT and *WEBHOOK*), credentials inside URLs, and in `import` every value
derived from a secret, through any chain of assignments, or holding a secret's value. Plain values stay readable."""

import json
from pathlib import Path

import pytest

from verl_cluster.cli import main
from verl_cluster.config.names import MASK, is_secret_name, mask_url_credentials, masked_env
from verl_cluster.errors import ConfigError
from verl_cluster.verl_scripts.script_import import import_script
from verl_cluster.verl_scripts.shell_words import looks_secret

TOKEN = "hf_SeCrEt0123456789"
PAT = "ghp_PaT0123456789abcdef"
ENV = {"HOME": "/home/me", "HF_TOKEN": TOKEN, "GITHUB_PAT": PAT, "USER": "me"}
PY = "python3 -m verl.trainer.main_ppo"


@pytest.fixture(autouse=True)
def _home(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))


def imported(tmp_path: Path, text: str, environ=None):
    p = tmp_path / "run.sh"
    p.write_text(text)
    imp = import_script(p, environ=ENV if environ is None else environ)
    return imp, imp.to_yaml(), json.dumps(imp.data)


@pytest.mark.parametrize("name", ["GITHUB_PAT", "GITLAB_PAT", "SLACK_WEBHOOK_URL", "DISCORD_WEBHOOK", "WEBHOOK"])
def test_pat_and_webhook_names_are_secret(name):
    assert is_secret_name(name) and looks_secret(name)
    assert masked_env({name: "v"}) == {name: MASK}


@pytest.mark.parametrize("name", ["PATH", "PYTHONPATH", "SPATIAL_DIM", "PATIENCE", "WEBHOOK_FILE"])
def test_plain_names_stay_plain(name):
    assert not is_secret_name(name)


@pytest.mark.parametrize("value, shown", [
    ("postgres://u:p@h", "postgres://***@h"),
    ("postgresql://admin:hunter2@db.example.org:5432/x", "postgresql://***@db.example.org:5432/x"),
    ("https://ghp_abc@github.com/o/r.git", "https://***@github.com/o/r.git"),
    ("redis://:pw@10.0.0.1:6379/0", "redis://***@10.0.0.1:6379/0"),
    ("http://example.org/a@b", "http://example.org/a@b"),  # an @ in the path is no credential
    ("/home/me/data", "/home/me/data"), ("a@b.org", "a@b.org"),
])
def test_credentials_in_urls_are_masked(value, shown):
    assert mask_url_credentials(value) == shown
    assert masked_env({"DATABASE_URL": value})["DATABASE_URL"] == shown


def test_submit_dry_run_masks_a_url_password(tmp_path, capsys):
    job = tmp_path / "j.yaml"
    job.write_text("name: j\ncommand: [python, x.py]\nlauncher: torchrun\n"
                   "env: {DATABASE_URL: 'postgres://u:hunter2@h/db', PLAIN: visible}\n")
    root = Path(__file__).resolve().parents[2]
    rc = main(["submit", str(job), "-c", str(root / "cluster_configs/local.yaml"), "--dry-run", "--json"])
    out = capsys.readouterr().out
    assert rc == 0 and "hunter2" not in out and "postgres://***@h/db" in out and "visible" in out


def test_import_masks_a_value_derived_from_a_secret_through_assignments(tmp_path):
    imp, text, data = imported(tmp_path, f"TAG=$HF_TOKEN\nB=run-$TAG\nexport C=\"x-${{B}}\"\n"
                                         f"{PY} trainer.experiment_name=run-$TAG trainer.project_name=$B\n")
    for shown in (text, data):
        assert TOKEN not in shown
    over = imp.data["overrides"]
    # verl resolves these on the cluster from the job's secret, so the job still runs as the script did
    assert over["trainer.experiment_name"] == "run-${oc.env:HF_TOKEN}"
    assert over["trainer.project_name"] == "run-${oc.env:HF_TOKEN}"
    assert "HF_TOKEN" in imp.data["secrets"] and "C" in imp.data["secrets"]  # C holds the token: a secret itself
    assert "C" not in imp.data.get("env", {})
    assert imp.secret_values["HF_TOKEN"] == TOKEN and imp.secret_values["C"] == f"x-run-{TOKEN}"


def test_import_masks_a_pat_and_a_literal_copy_of_a_secret(tmp_path):
    imp, text, data = imported(tmp_path, f"N=\"name-{TOKEN}\"\n{PY} +x.pat=$GITHUB_PAT trainer.experiment_name=$N\n")
    for shown in (text, data):
        assert PAT not in shown and TOKEN not in shown
    assert imp.data["overrides"]["+x.pat"] == "${oc.env:GITHUB_PAT}"
    assert imp.data["overrides"]["trainer.experiment_name"] == "name-${oc.env:HF_TOKEN}"
    assert set(imp.data["secrets"]) == {"GITHUB_PAT", "HF_TOKEN"}


def test_import_keeps_plain_paths_readable(tmp_path):
    imp, text, _ = imported(tmp_path, f"DATA=$HOME/data\nexport RUN=run-$USER\n{PY} data.train_files=$DATA/t.parquet "
                                      "trainer.default_local_dir=$HOME/ckpt\n")
    assert imp.data["data"]["train_files"] == ["/home/me/data/t.parquet"]
    assert imp.data["overrides"]["trainer.default_local_dir"] == "/home/me/ckpt"
    assert imp.data["env"] == {"RUN": "run-me"} and "secrets" not in imp.data
    assert "/home/me/data/t.parquet" in text


def test_import_never_prints_a_secret_in_notes_or_shell_comments(tmp_path):
    imp, text, _ = imported(tmp_path, f"echo \"token $HF_TOKEN\"\nexport DATABASE_URL=$DB\n{PY} +a=$DB\n",
                            {**ENV, "DB": "postgres://u:hunter2@h/db"})
    assert TOKEN not in text and "hunter2" not in text
    assert "DATABASE_URL" in imp.data["secrets"] and "hunter2" not in json.dumps(imp.data)


def test_import_refuses_a_derived_value_it_cannot_write_without_the_secret(tmp_path):
    with pytest.raises(ConfigError) as e:
        imported(tmp_path, f"export T=$HF_TOKEN\nS=${{T:+on}}\n{PY} +a=$S\n")
    assert "HF_TOKEN" in e.value.message and TOKEN not in e.value.message
    assert "run.sh:3" in e.value.message and "line 2" in e.value.message
