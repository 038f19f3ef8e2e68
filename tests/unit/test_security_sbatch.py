"""The generated sbatch script: no value can start a script line of its own."""

import subprocess

import pytest

from verl_cluster.cli import main
from verl_cluster.errors import ConfigError
from verl_cluster.slurm.batch import BatchRequest, script

JOB = "name: smoke\ncommand: [python, smoke_job.py]\nlauncher: ray\n"


@pytest.fixture
def job_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "job.yaml").write_text(JOB)
    return tmp_path


def _sbatch(capsys, *argv):
    rc = main(["sbatch", *argv, "--dry-run"])
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


@pytest.mark.parametrize("extra", [
    ["--log-dir", "/tmp/l\ntouch /tmp/PWNED2"],
    ["--sbatch-arg", "--constraint=h100\ntouch /tmp/PWNED3"],
    ["--sbatch-arg", "--constraint=h100\rtouch /tmp/PWNED3"],
    ["--sbatch-arg", "touch /tmp/PWNED4"],
])
def test_newlines_in_sbatch_lines_are_refused(job_dir, capsys, extra):
    rc, out, err = _sbatch(capsys, "job.yaml", *extra)
    assert rc == 2 and out == "" and "PWNED" not in out
    assert err.startswith("error: ") and len(err.strip().splitlines()) <= 2, err


def test_job_path_with_newline_is_refused(job_dir, capsys):
    evil = job_dir / "evil\ntouch PWNED1\n.yaml"
    evil.write_text(JOB)
    rc, out, err = _sbatch(capsys, str(evil))
    assert rc == 2 and "job file's path" in err and out == ""


def test_odd_but_legal_values_stay_inside_their_lines(tmp_path):
    """Spaces, quotes, `$()` and `;` in the log folder and overrides: the header keeps one line per #SBATCH, and
    bash reads the body without running any of it (`bash -n`), and a marker is never created."""
    marker = tmp_path / "PWNED"
    log = str(tmp_path / f"a b'c $(touch {marker});`touch {marker}`")
    req = BatchRequest(job_file=str(tmp_path / "job.yaml"), job_name="x;y", nodes=1, log_dir=log,
                       overrides=[f"trainer.x=$(touch {marker})"], sbatch_args=["--constraint=h100"])
    text = script(req)
    head = [ln for ln in text.splitlines() if ln.startswith("#SBATCH")]
    assert f"#SBATCH --output={log}/slurm-%j.out" in head and "#SBATCH --constraint=h100" in head
    assert subprocess.run(["bash", "-n"], input=text, text=True).returncode == 0
    # the lines that use the values, run for real with the steps stubbed out
    probe = text.replace("step up", "true").replace("step check", "true").replace("step submit", "true") \
        .replace("step down", "true").replace('tail -n 5 "$LOG/submit.log"', "true")
    r = subprocess.run(["bash", "-c", probe], capture_output=True, text=True, env={"SLURM_JOB_ID": "1",
                                                                                   "SLURM_JOB_NODELIST": "n",
                                                                                   "PATH": "/usr/bin:/bin"})
    assert r.returncode == 0, r.stderr
    assert not marker.exists()
    assert (tmp_path / f"a b'c $(touch {marker});`touch {marker}`" / "1").is_dir()


def test_script_refuses_control_characters_directly(tmp_path):
    with pytest.raises(ConfigError, match="new line of the batch script"):
        script(BatchRequest(job_file="/j\n.yaml", job_name="j", nodes=1, log_dir="/tmp/l"))


def _write(capsys, *argv):
    rc = main(["sbatch", *argv, "--json"])
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


def test_a_job_name_never_puts_the_script_outside_the_log_dir(job_dir, capsys):
    (job_dir / "job.yaml").write_text(JOB.replace("name: smoke", "name: ../../x"))
    logs = job_dir / "a" / "b" / "logs"
    rc, out, err = _write(capsys, "job.yaml", "--log-dir", str(logs))
    assert rc == 0, err
    import json

    written = json.loads(out)["script"]
    assert written.startswith(str(logs) + "/") and "/" not in written[len(str(logs)) + 1:], written
    assert not (job_dir / "x.sbatch").exists() and not (job_dir / "a" / "x.sbatch").exists()


def test_a_symlink_at_the_script_path_is_not_followed(job_dir, capsys):
    logs = job_dir / "logs"
    logs.mkdir()
    victim = job_dir / "victim"
    victim.write_text("keep me\n")
    victim.chmod(0o600)
    (logs / "smoke.sbatch").symlink_to(victim)
    rc, out, err = _write(capsys, "job.yaml", "--log-dir", str(logs))
    assert victim.read_text() == "keep me\n" and oct(victim.stat().st_mode & 0o777) == "0o600"
    assert rc == 2 and "symbolic link" in err and "Traceback" not in err, err
