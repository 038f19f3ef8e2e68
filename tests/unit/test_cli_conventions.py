"""docs/cli.md, held for every command of the registry (verl_cluster/cli COMMANDS): `--help` works; bad input exits 2
with `error:` on stderr, nothing on stdout and no traceback; under `--json` the same failure is also a JSON error
object on stdout; output piped has no colour codes. Then the shapes: `jobs --json` is {"clusters": [...]} with -c as
without, a job's `plan` an object; and the exit code when the user's own input and the cluster are both wrong."""

import json
from pathlib import Path

import pytest

from tests.harness.json_server import JsonServer
from verl_cluster.cli import COMMANDS, build_parser, main
from verl_cluster.config.cluster import load_cluster
from verl_cluster.nodes.auth import ensure_token

MISSING = "/nonexistent/verl-cluster-test/cluster.yaml"
JOB = "/nonexistent/verl-cluster-test/job.yaml"

# each command with input of the user's own that is wrong, found before anything is reached (no cluster, no network)
BAD_INPUT = {
    "up": ["-c", MISSING],
    "down": ["-c", MISSING],
    "status": ["-c", MISSING],
    "forget": ["no-such-cluster"],
    "env": ["-c", MISSING],
    "check": ["-c", MISSING],
    "doctor": ["--no-such-flag"],  # takes no input but its flags
    "plan": [JOB, "--gpus", "1x8xH100-80GB"],
    "submit": [JOB, "--dry-run"],
    "import": ["/nonexistent/verl-cluster-test/run.sh"],
    "jobs": ["--timeout", "0"],
    "logs": ["x-1", "-c", MISSING],
    "stop": ["x-1", "-c", MISSING],
    "watch": ["no-such-run"],
    "sbatch": [JOB, "--dry-run"],
    "dashboard": ["-c", MISSING],
    "completion": ["fish"],
    "reshard": ["/nonexistent/verl-cluster-test/ckpt", "--world-size", "8"],
}


@pytest.fixture(autouse=True)
def home(tmp_path, monkeypatch):
    h = tmp_path / "home"
    h.mkdir()
    monkeypatch.setenv("HOME", str(h))
    monkeypatch.delenv("VERL_CLUSTER", raising=False)
    monkeypatch.chdir(tmp_path)
    return h


def subparsers() -> dict:
    p = build_parser()
    return next(a for a in p._actions if a.__class__.__name__ == "_SubParsersAction").choices


def offers_json(command: str) -> bool:
    return any("--json" in a.option_strings for a in subparsers()[command]._actions)


def run(capsys, *argv):
    rc = main(list(argv))
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


def error_doc(out: str) -> dict:
    """The one JSON document on stdout, an error object (json.loads fails on anything more)."""
    doc = json.loads(out)
    assert set(doc) == {"error"} and set(doc["error"]) == {"message", "hint", "exit_code"}, doc
    assert isinstance(doc["error"]["message"], str) and doc["error"]["message"]
    return doc["error"]


def said(err: str) -> list[str]:
    """stderr without the `cluster:` line every command starts with."""
    return [ln for ln in err.splitlines() if not ln.startswith("cluster: ")]


def test_the_table_names_every_command_of_the_registry():
    assert set(BAD_INPUT) == set(COMMANDS) == set(subparsers())  # a new command gets a line above


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_help(command, capsys):
    rc, out, err = run(capsys, command, "--help")
    assert rc == 0 and out.startswith(f"usage: verl-cluster {command}") and err == "", (out[:300], err)


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_bad_input_is_exit_2_one_error_line_and_nothing_on_stdout(command, capsys):
    rc, out, err = run(capsys, command, *BAD_INPUT[command])
    assert rc == 2, (rc, err[-500:])
    assert out == "" and "Traceback" not in err and "\x1b[" not in err, err
    lines = said(err)
    if lines[0].startswith("usage: "):  # argparse: usage, then `verl-cluster CMD: error: ...`
        assert len(lines) == 2 and lines[1].startswith(f"verl-cluster {command}: error: "), lines
    else:
        assert lines[0].startswith("error: ") and len(lines) <= 2, lines
        assert all(ln.startswith("hint: ") for ln in lines[1:]), lines


@pytest.mark.parametrize("command", sorted(c for c in COMMANDS if offers_json(c)))
def test_bad_input_under_json_is_an_error_object_on_stdout(command, capsys):
    rc, out, err = run(capsys, command, *BAD_INPUT[command], "--json")
    got = error_doc(out)
    assert rc == 2 == got["exit_code"] and "Traceback" not in err and "\x1b[" not in out + err, err
    assert got["message"] in err or got["message"].split(": ", 1)[1] in err  # the same words on stderr
    if got["hint"]:
        assert got["hint"] in err or got["hint"].startswith("see `verl-cluster ")


@pytest.mark.parametrize("command", sorted(c for c in COMMANDS if offers_json(c)))
def test_a_bad_flag_under_json_is_an_error_object_naming_the_command(command, capsys):
    rc, out, err = run(capsys, command, "--no-such-flag", "--json")
    got = error_doc(out)
    assert rc == 2 == got["exit_code"] and "Traceback" not in err
    assert got["message"].startswith(f"verl-cluster {command}: ")  # the flag, or a required argument missing
    assert got["hint"] == f"see `verl-cluster {command} --help`"


def test_json_after_double_dash_is_the_jobs_not_ours(capsys):
    """`submit -- python train.py --json`: the job's flag; an error then is said as without --json."""
    rc, out, err = run(capsys, "submit", "-c", MISSING, "--", "python", "train.py", "--json")
    assert rc == 2 and out == "" and "error: " in err


def test_an_internal_error_under_json_is_an_object_too(capsys, monkeypatch):
    import verl_cluster.cli.doctor_cmd as doctor_cmd

    def boom(args):
        raise ValueError("a bug")

    def add_parsers(sub, common):  # doctor, its run a bug
        p = sub.add_parser("doctor", parents=[common])
        p.add_argument("--json", action="store_true")
        p.set_defaults(func=boom)

    monkeypatch.setattr(doctor_cmd, "add_parsers", add_parsers)
    rc, out, err = run(capsys, "doctor", "--json")
    got = error_doc(out)
    assert rc == 1 == got["exit_code"] and got["message"] == "internal error: ValueError: a bug"
    assert "--debug" in got["hint"] and "internal error: ValueError: a bug" in err and "Traceback" not in err


# ---- jobs --json: one shape, with -c as without ----

class JobsApi(JsonServer):
    """A Ray Jobs API on a local port that lists `jobs` and stops x1."""

    def __init__(self, jobs: list[dict]):
        replies = {"/api/version": {"version": "4", "ray_version": "2.60.0", "ray_commit": "x"},
                   "/api/jobs/x1/stop": {"stopped": True}, "/api/jobs/x1": jobs[0], "/api/jobs/": jobs}
        super().__init__(replies, match=lambda path, key: path.rstrip("/") == key.rstrip("/"))


PLAN = {"feasible": True, "overrides": {"trainer.nnodes": 1}, "note": "placement planned"}


def ray_job(sid: str, status: str, plan: str | None) -> dict:
    meta = {"verl_cluster.job": "smoke"} | ({"verl_cluster.plan": plan} if plan is not None else {})
    return {"type": "SUBMISSION", "job_id": None, "submission_id": sid, "status": status, "entrypoint": "python x.py",
            "message": "", "metadata": meta, "start_time": 1000, "end_time": 2000}


@pytest.fixture
def api(tmp_path):
    srv = JobsApi([ray_job("x1", "STOPPED", json.dumps(PLAN)), ray_job("x2", "SUCCEEDED", None),
                   ray_job("x3", "FAILED", "not json")])
    p = tmp_path / "mine.yaml"
    p.write_text(f"cluster_name: mine\nhead: {{host: 127.0.0.1, dashboard_port: {srv.port}}}\n"
                 "security: {dashboard_host: all}\n")
    ensure_token(load_cluster(p))
    yield p
    srv.close()


def test_jobs_json_with_c_is_the_clusters_object_and_plan_is_an_object(api, capsys):
    rc, out, err = run(capsys, "jobs", "-c", str(api), "--json")
    assert rc == 0, err
    doc = json.loads(out)
    assert list(doc) == ["clusters"] and len(doc["clusters"]) == 1, doc
    (c,) = doc["clusters"]
    assert (c["cluster"], c["cluster_file"], c["answered"], c["down"]) == ("mine", str(Path(api).resolve()), True,
                                                                          False)
    jobs = {j["submission_id"]: j for j in c["jobs"]}
    assert jobs["x1"]["plan"] == PLAN  # an object, not JSON inside a string
    assert jobs["x2"]["plan"] is None and jobs["x3"]["plan"] is None  # none kept; not ours to read
    assert err.startswith("cluster: mine (")


def test_stop_json_prints_the_job_as_jobs_does(api, capsys):
    rc, out, err = run(capsys, "stop", "x1", "-c", str(api), "--json")
    assert rc == 0, err
    job = json.loads(out)
    assert job["submission_id"] == "x1" and job["status"] == "STOPPED" and job["plan"] == PLAN


def test_jobs_json_of_a_cluster_that_does_not_answer_is_exit_1_and_an_error_object(tmp_path, capsys):
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))  # bound, never listening: refused for the whole test
    try:
        p = tmp_path / "gone.yaml"
        p.write_text(f"cluster_name: gone\nhead: {{host: localhost, dashboard_port: {s.getsockname()[1]}}}\n")
        ensure_token(load_cluster(p))
        rc, out, err = run(capsys, "jobs", "-c", str(p), "--json")
    finally:
        s.close()
    got = error_doc(out)
    assert rc == 1 == got["exit_code"] and "cannot reach the Ray Jobs API" in got["message"], got


# ---- exit codes: the user's own input first ----

def test_preflight_with_a_missing_data_file_is_bad_input_whatever_else_the_cluster_lacks():
    from verl_cluster.submit.preflight import Finding, PreflightReport
    from verl_cluster.submit.pipeline import preflight_exit_code

    missing = Finding("error", "data", "/d/train.parquet: not found on localhost")
    key = Finding("error", "verl-config", "unknown verl key `data.train_batch_sizee`")
    rejected = Finding("error", "verl-config", "verl rejects the config: Please set at least one of "
                                               "'actor.ppo_micro_batch_size' or 'actor.ppo_micro_batch_size_per_gpu'")
    gpus = Finding("error", "resources", "the job needs 1 node(s) x 8 GPU(s); the cluster has localhost=0")
    plan = Finding("error", "placement", "the placement planner finds no feasible plan: no GPUs")
    assert preflight_exit_code(PreflightReport([missing, gpus])) == 2
    assert preflight_exit_code(PreflightReport([gpus, key])) == 2
    assert preflight_exit_code(PreflightReport([gpus])) == 1
    assert preflight_exit_code(PreflightReport([rejected])) == 2
    # what the failed plan would have set (micro batch sizes) is not the user's to fix: the cluster's problem
    assert preflight_exit_code(PreflightReport([plan, rejected, gpus])) == 1


def test_a_refused_connection_on_a_port_with_403_in_it_is_not_a_refused_token():
    """The cause named is the real one: `127.0.0.1:40373` refusing the connection read as 'refused our token'."""
    from verl_cluster.jobs.ray_jobs import _explain

    where = "http://127.0.0.1:40373"
    got = _explain(ConnectionError(f"Failed to connect to Ray at address: {where}."), where)
    assert got.message.startswith(f"cannot reach the Ray Jobs API at {where}"), got.message
    assert _explain(RuntimeError("Request failed with status code 403: Forbidden"), where).message == \
        f"the Jobs API at {where} refused our token"
    assert "refused our token" in _explain(RuntimeError("HTTP 401"), where).message


def test_submit_shows_preflight_running_on_a_terminal_only(monkeypatch):
    """Preflight takes seconds (half a minute on a GPU box): a transient line on a terminal's stderr says what runs;
    piped or --json, nothing is added to the output."""
    import io

    from rich.console import Console

    import verl_cluster.cli.submit_cmd as submit_cmd

    tty = Console(file=io.StringIO(), force_terminal=True, width=120)
    monkeypatch.setattr(submit_cmd, "err", tty)
    with submit_cmd.preflight_progress(enabled=True):
        pass
    shown = tty.file.getvalue()
    assert "preflight: probing the nodes, planning the placement" in shown
    piped = Console(file=io.StringIO(), force_terminal=False)
    monkeypatch.setattr(submit_cmd, "err", piped)
    with submit_cmd.preflight_progress(enabled=False):
        pass
    assert piped.file.getvalue() == ""


def test_an_unknown_job_id_is_bad_input_exit_2():
    """The Jobs API's 404 for a job ID (`logs`/`stop`/`status JOB`): the user's input, exit 2 (README's exit
    codes), with the way to list the real ones; still a ClusterError to the code that catches those."""
    from verl_cluster.errors import EXIT_BAD_INPUT, ClusterError, NoSuchJob
    from verl_cluster.jobs.ray_jobs import JobsApi

    def gone(job_id):
        raise RuntimeError(f"Request failed with status code 404: Job {job_id} does not exist.")

    api = JobsApi(client=None, where="http://127.0.0.1:8265")
    try:
        api.call(gone, "nosuchjob-1")
    except NoSuchJob as e:
        assert isinstance(e, ClusterError) and e.exit_code == EXIT_BAD_INPUT
        assert "nosuchjob-1 does not exist" in str(e) and "verl-cluster jobs" in e.hint
    else:
        raise AssertionError("no error")
