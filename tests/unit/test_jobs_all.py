"""`jobs` with no cluster named: every cluster this machine brought up or submitted to, asked in parallel with a
deadline, the silent ones named. Real config loading and a real Jobs API client against local ports; each test
has its own HOME."""

import json
import os
import socket
import threading
import time
from pathlib import Path

import pytest

from verl_cluster.cli import main
from verl_cluster.config.cluster import load_cluster
from verl_cluster.job_list import all_jobs
from verl_cluster.records import job_records

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    return tmp_path / "home"


_HELD: list[socket.socket] = []


@pytest.fixture(autouse=True)
def _release_ports():
    yield
    while _HELD:
        _HELD.pop().close()


def closed_port() -> int:
    """A port that refuses connections for the whole test: bound here and never listened on, so no other process
    (other tests run Ray on this machine) can take it."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    _HELD.append(s)
    return s.getsockname()[1]


def local_cluster(tmp_path, name, port=None) -> Path:
    """A one-node cluster on this machine whose dashboard port nothing listens on (it was never started)."""
    token = tmp_path / f"{name}-token"
    token.write_text("ab" * 32 + "\n")
    p = tmp_path / f"{name}.yaml"
    p.write_text(f"cluster_name: {name}\nhead:\n  host: localhost\n  dashboard_port: {port or closed_port()}\n"
                 f"security:\n  token_file: {token}\n")
    return p


def test_known_clusters_merge_up_and_job_records(home, tmp_path):
    a, b = local_cluster(tmp_path, "alpha"), local_cluster(tmp_path, "beta")
    job_records.record_cluster("alpha", str(a), ["ray.object_store_memory=2e8"])
    time.sleep(0.01)
    job_records.record("j-1", str(b), "beta", "smoke")
    time.sleep(0.01)
    job_records.record("j-2", str(a), "alpha", "smoke")  # a later job on alpha: alpha is the most recent
    job_records.record_cluster("../evil", str(a))  # a name is never a path
    (job_records.clusters_dir() / "broken.json").write_text("{not json")
    known = job_records.known_clusters()
    assert [k.name for k in known] == ["alpha", "beta"]
    assert known[0].overrides == ("ray.object_store_memory=2e8",)  # up's overrides survive a job record
    assert known[0].cluster_file == str(a.resolve()) and known[1].overrides == ()
    assert sorted(p.name for p in job_records.clusters_dir().iterdir()) == ["alpha.json", "broken.json"]
    assert oct((job_records.clusters_dir() / "alpha.json").stat().st_mode & 0o777) == "0o600"


def test_every_cluster_is_asked_and_the_silent_ones_say_why(home, tmp_path):
    gone = local_cluster(tmp_path, "gone")
    missing = tmp_path / "deleted.yaml"
    known = [job_records.KnownCluster("gone", str(gone)), job_records.KnownCluster("deleted", str(missing))]
    found = all_jobs.jobs_everywhere(known, load_cluster, timeout_s=30)
    assert [c.cluster for c in found] == ["gone", "deleted"] and not any(c.answered for c in found)
    assert "cannot reach the Ray Jobs API at http://127.0.0.1:" in found[0].error, found[0]
    assert "deleted.yaml" in found[1].error
    assert found[0].to_json()["answered"] is False and "jobs" not in found[0].to_json()


def test_a_cluster_that_hangs_is_cut_at_the_deadline_and_does_not_hold_up_the_others(home, tmp_path):
    gone = local_cluster(tmp_path, "gone")
    release = threading.Event()

    def load(path, overrides):
        if path == "hangs.yaml":
            release.wait(60)  # e.g. a scheduler command or a TCP connect that never answers
        return load_cluster(path, overrides)

    known = [job_records.KnownCluster("slow", "hangs.yaml"), job_records.KnownCluster("gone", str(gone))]
    t0 = time.monotonic()
    try:
        found = all_jobs.jobs_everywhere(known, load, timeout_s=2)
    finally:
        release.set()
    assert time.monotonic() - t0 < 10
    assert found[0].error == "no answer within 2s" and "status -c hangs.yaml" in found[0].hint
    assert "cannot reach the Ray Jobs API" in found[1].error  # answered (with its error) within the deadline


def test_jobs_without_c_reports_every_recorded_cluster_and_exits_0_when_none_answers(home, tmp_path, capsys):
    """Listing what this machine knows is `jobs`' work: clusters that do not answer are lines, not a failure (it
    exited 1 when every recorded cluster was unreachable). With -c, the one cluster named not answering is 1."""
    a, b = local_cluster(tmp_path, "alpha"), local_cluster(tmp_path, "beta")
    job_records.record_cluster("alpha", str(a))
    job_records.record("j-1", str(b), "beta", "smoke")
    rc = main(["jobs", "--json", "--timeout", "30"])
    doc = json.loads(capsys.readouterr().out)
    assert rc == 0
    assert {c["cluster"] for c in doc["clusters"]} == {"alpha", "beta"}
    assert all(not c["answered"] and c["error"] for c in doc["clusters"])
    rc = main(["jobs"])  # captured output is 80 columns wide: the lines must not wrap
    text = capsys.readouterr().err
    assert rc == 0 and "Traceback" not in text
    lines = [x for x in text.splitlines() if "did not answer" in x]
    assert len(lines) == 2 and any(x.startswith("alpha") for x in lines) and any(x.startswith("beta") for x in lines)
    assert all("cannot reach the Ray Jobs API" in x and "hint: is the cluster up?" in x for x in lines), lines
    assert any("gone for good? verl-cluster forget alpha" in x for x in lines), lines
    assert main(["jobs", "-c", "alpha"]) == 1  # the one cluster named did not answer
    for bad in ("0", "inf", "nan"):
        rc = main(["jobs", "--timeout", bad])
        assert rc == 2 and f"--timeout {bad}" in capsys.readouterr().err


def test_jobs_help_says_what_the_exit_status_means(capsys):
    assert main(["jobs", "--help"]) == 0
    text = capsys.readouterr().out
    assert "0 once every recorded cluster has been reported" in text and "1 when it did not" in text


def test_a_dashboard_that_never_answers_does_not_hold_up_the_other_clusters(home, tmp_path):
    """A Jobs API whose port takes the connection and never answers (a head wedged, a firewall that drops) keeps
    its client waiting; the other clusters' clients open at the same time, not after it."""
    with socket.socket() as wedged:
        wedged.bind(("127.0.0.1", 0))
        wedged.listen(8)  # the kernel completes the handshake; nobody ever reads the request
        silent = local_cluster(tmp_path, "silent", port=wedged.getsockname()[1])
        gone = local_cluster(tmp_path, "gone")
        known = [job_records.KnownCluster("silent", str(silent)), job_records.KnownCluster("gone", str(gone))]
        found = all_jobs.jobs_everywhere(known, load_cluster, timeout_s=4)
    assert found[0].error == "no answer within 4s", found[0]
    assert "cannot reach the Ray Jobs API" in found[1].error, found[1]


def test_a_cluster_taken_down_here_is_named_down_and_not_asked(home, tmp_path, capsys):
    """`down` (done) marks the cluster's record: `jobs` says it is down instead of that it did not answer, and keeps
    what was recorded about it (its file, its jobs' records) for when it comes back."""
    name = f"downed-{os.getpid()}"  # its temp dir /tmp/vc-<name> holds no Ray: `down` finds nothing to stop
    downed, other = local_cluster(tmp_path, name), local_cluster(tmp_path, "other")
    job_records.record_cluster(name, str(downed), ["ray.object_store_memory=200000000"])  # as `up` records it
    job_records.record("j-1", str(downed), name, "smoke")
    job_records.record_cluster("other", str(other))
    assert main(["down", "-c", str(downed)]) == 0
    capsys.readouterr()
    t0 = time.monotonic()
    rc = main(["jobs", "--json", "--timeout", "30"])
    by = {c["cluster"]: c for c in json.loads(capsys.readouterr().out)["clusters"]}
    assert rc == 0  # `other` was asked and did not answer: said, not a failure
    assert by[name] == {"cluster": name, "cluster_file": str(downed.resolve()), "answered": False, "down": True,
                        "down_at": pytest.approx(time.time(), abs=60)}
    assert by["other"]["down"] is False and "cannot reach the Ray Jobs API" in by["other"]["error"]
    rc = main(["jobs"])
    text = capsys.readouterr().err
    assert rc == 0 and "Traceback" not in text
    assert [x.split()[0] for x in text.splitlines() if "did not answer" in x] == ["other"], text
    [line] = [x for x in text.splitlines() if x.startswith(name)]
    # the way back is the `up` that was recorded, its overrides too
    assert "is down" in line and f"verl-cluster up -c {downed.resolve()} ray.object_store_memory=200000000" in line, line
    assert time.monotonic() - t0 < 20
    [k] = [k for k in job_records.known_clusters() if k.name == name]
    assert k.down and k.overrides == ("ray.object_store_memory=200000000",) and k.cluster_file == str(downed.resolve())
    assert job_records.lookup("j-1")["cluster"] == name  # its jobs' history stays


def test_down_marks_a_known_cluster_once_it_succeeded_until_up_or_submit_uses_it_again(home, tmp_path, capsys):
    name = f"downed-{os.getpid()}"
    downed = local_cluster(tmp_path, name)
    job_records.record_cluster(name, str(downed))
    assert main(["down", "-c", str(downed)]) == 0
    capsys.readouterr()
    rc = main(["jobs", "--json", "--timeout", "30"])  # the only cluster known here is down: nothing failed
    [c] = json.loads(capsys.readouterr().out)["clusters"]
    assert rc == 0 and c["down"] and "error" not in c
    time.sleep(0.01)
    job_records.record("j-2", str(downed), name, "smoke")  # submitted to after the down: someone brought it back
    assert not job_records.known_clusters()[0].down
    assert main(["down", "-c", str(downed)]) == 0 and job_records.known_clusters()[0].down
    time.sleep(0.01)
    job_records.record_cluster(name, str(downed))  # `up` again
    assert not job_records.known_clusters()[0].down

    stranger = local_cluster(tmp_path, f"stranger-{os.getpid()}")  # never brought up nor submitted to from here
    assert main(["down", "-c", str(stranger)]) == 0
    assert [k.name for k in job_records.known_clusters()] == [name]
    submitted = local_cluster(tmp_path, f"submitted-{os.getpid()}")  # known only through a job sent to it
    job_records.record("j-3", str(submitted), f"submitted-{os.getpid()}", "smoke")
    assert main(["down", "-c", str(submitted)]) == 0
    [k] = [k for k in job_records.known_clusters() if k.name == f"submitted-{os.getpid()}"]
    assert k.down and k.cluster_file == str(submitted.resolve()) and k.last_used > 0

    far = tmp_path / "far.yaml"  # a head that cannot be reached: `down` fails and the cluster is still asked
    far.write_text(f"cluster_name: far\nhead:\n  host: nonexistent.invalid\n"
                   f"security:\n  token_file: {tmp_path / f'{name}-token'}\n")
    job_records.record_cluster("far", str(far))
    capsys.readouterr()
    assert main(["down", "-c", str(far)]) == 1
    assert not [k for k in job_records.known_clusters() if k.name == "far"][0].down
