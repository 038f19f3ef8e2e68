"""`submit --working-dir DIR`: the job field working_dir, as Ray users type it; the request ships DIR."""

import json
import os

import pytest

from verl_cluster.cli import build_parser, split_command
from verl_cluster.cli.submit_cmd import job_input_of
from verl_cluster.config.cluster import load_cluster
from verl_cluster.errors import ConfigError
from verl_cluster.submit.job_input import JobInput
from verl_cluster.jobs.request import build_ray_request


@pytest.fixture
def cluster(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("cluster_name: c1\nhead: {host: 10.0.0.1, gpus: 2}\nray: {ray_executable: /opt/venv/bin/ray}\n")
    return load_cluster(p)


def parse(*argv):
    """As main() parses: the key=value words before `--` taken out, then argparse."""
    words, before = split_command(list(argv))
    args = build_parser().parse_args(words)
    args.before = before
    return args


def test_working_dir_flag_ships_the_folder_and_is_kept_absolute(tmp_path, cluster, monkeypatch):
    code = tmp_path / "code"
    code.mkdir()
    (code / "mymod.py").write_text("print('hi')\n")
    monkeypatch.chdir(code)
    ji = job_input_of(parse("submit", "--working-dir", ".", "watch.max_restarts=1", "--", "python", "-m", "mymod"))
    assert ji.kind == "command" and ji.argv == ("python", "-m", "mymod")
    req = build_ray_request(ji.job(), cluster, {}, {}, {})
    assert req.runtime_env["working_dir"] == str(code.resolve())
    assert req.argv == ["/opt/venv/bin/python", "-m", "mymod"]
    # a watcher loads the recorded job from wherever it runs: the same folder is shipped
    monkeypatch.chdir(tmp_path)
    again = JobInput.from_json(json.loads(json.dumps(ji.to_json())))
    assert build_ray_request(again.job(), cluster, {}, {}, {}).runtime_env["working_dir"] == str(code.resolve())


def test_working_dir_word_before_the_command_is_recorded_absolute(tmp_path, cluster, monkeypatch):
    monkeypatch.chdir(tmp_path)
    ji = job_input_of(parse("submit", "working_dir=.", "--", "python", "-m", "mymod"))
    assert f"working_dir={tmp_path.resolve()}" in ji.overrides
    monkeypatch.chdir(os.path.expanduser("~"))
    assert build_ray_request(ji.job(), cluster, {}, {}, {}).runtime_env["working_dir"] == str(tmp_path.resolve())


def test_working_dir_flag_wins_over_the_job_files(tmp_path, cluster):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    job = tmp_path / "j.yaml"
    job.write_text("name: j\ncommand: [python, run.py]\nlauncher: ray\nworking_dir: a\n")
    ji = job_input_of(parse("submit", str(job), "--working-dir", str(tmp_path / "b")))
    assert build_ray_request(ji.job(), cluster, {}, {}, {}).runtime_env["working_dir"] == str(tmp_path / "b")


def test_working_dir_that_is_not_a_folder_is_bad_input(tmp_path):
    (tmp_path / "f.py").write_text("")
    for bad in (tmp_path / "nope", tmp_path / "f.py"):
        with pytest.raises(ConfigError, match=r"--working-dir .*: not a directory"):
            job_input_of(parse("submit", "--working-dir", str(bad), "--", "python", "-m", "f"))


def test_help_says_what_it_does(capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["submit", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--working-dir DIR" in text and "to every node" in text and "runs inside it" in text


def test_gc_flags_set_the_job_field_and_exclude_each_other(tmp_path, cluster, monkeypatch, capsys):
    """No flag: python_gc auto (the workers freeze); --no-gc-freeze: Python's own collector; both: a usage error."""
    monkeypatch.chdir(tmp_path)
    got = {flag: job_input_of(parse("submit", *flag, "--", "python", "-m", "m")).job().python_gc
           for flag in ((), ("--gc-freeze",), ("--no-gc-freeze",))}
    assert got == {(): "auto", ("--gc-freeze",): "freeze", ("--no-gc-freeze",): "default"}
    req = build_ray_request(job_input_of(parse("submit", "--no-gc-freeze", "--", "python", "-m", "m")).job(),
                            cluster, {}, {}, {})
    assert "worker_process_setup_hook" not in req.runtime_env
    with pytest.raises(SystemExit) as e:
        parse("submit", "--gc-freeze", "--no-gc-freeze", "--", "python", "-m", "m")
    assert e.value.code == 2 and "not allowed with" in capsys.readouterr().err
