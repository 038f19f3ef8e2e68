"""What this machine keeps under ~/.verl-cluster is read as untrusted input: a record can only lead to the cluster
file it names, a token goes only to the head it was made for, every reply of a Jobs API is checked before use, and
a record, a cluster record or collective.json is read within bounds, from a regular file only."""

import json
import math
import os
import threading
import time
import tracemalloc
from pathlib import Path

import pytest

from tests.harness.json_server import JsonServer
from verl_cluster.cli import main
from verl_cluster.config.cluster import load_cluster
from verl_cluster.nodes.auth import ensure_token
from verl_cluster.records import job_records


TOKEN = "ab" * 32


class Listener(JsonServer):
    """An HTTP server that records every Authorization header it is sent and answers `replies[path prefix]`."""


VERSION = {"version": "4", "ray_version": "2.60.0", "ray_commit": "x"}


@pytest.fixture
def listener():
    made = []

    def make(replies=None):
        lst = Listener({"/api/version": VERSION, **(replies or {})})
        made.append(lst)
        return lst

    yield make
    for lst in made:
        lst.close()


def prod_cluster(tmp_path: Path) -> Path:
    """The user's real cluster, brought up from here: its token made and bound by `up`'s first step."""
    p = tmp_path / "prod.yaml"
    p.write_text("cluster_name: prod\nhead: {host: 10.255.0.1}\n")
    ensure_token(load_cluster(p))
    return p


def plant(tmp_path: Path, text: str, sid: str = "planted-1") -> Path:
    evil = tmp_path / "evil.yaml"
    evil.write_text(text)
    job_records.jobs_dir().mkdir(parents=True, exist_ok=True)
    (job_records.jobs_dir() / f"{sid}.json").write_text(json.dumps(
        {"submission_id": sid, "cluster_file": str(evil), "cluster": "evil", "job": "x", "submitted_at": time.time()}))
    return evil


def run(capsys, *argv) -> tuple[int, str]:
    rc = main(list(argv))
    cap = capsys.readouterr()
    return rc, cap.out + cap.err


@pytest.mark.parametrize("evil", [
    # another cluster's token named outright, the head a listener, plain HTTP
    "cluster_name: evil\nhead: {{host: 127.0.0.1, dashboard_port: {port}}}\n"
    "security: {{token_file: ~/.verl-cluster/prod/auth_token, dashboard_host: all}}\n",
    # the same through a symlink in the planted cluster's own folder
    "cluster_name: evil\nhead: {{host: 127.0.0.1, dashboard_port: {port}}}\n"
    "security: {{token_file: {link}, dashboard_host: all}}\n",
    # the planted file takes the other cluster's name: its token by default, a head of its own
    "cluster_name: prod\nhead: {{host: 127.0.0.1, dashboard_port: {port}}}\nsecurity: {{dashboard_host: all}}\n",
])
def test_a_planted_record_never_sends_the_token_elsewhere(home, tmp_path, listener, capsys, evil):
    prod_cluster(tmp_path)
    token = (home / ".verl-cluster/prod/auth_token").read_text().strip()
    lst = listener()
    link = home / ".verl-cluster/evil/auth_token"
    link.parent.mkdir(parents=True)
    link.symlink_to(home / ".verl-cluster/prod/auth_token")
    plant(tmp_path, evil.format(port=lst.port, link=link))
    for argv in (["logs", "planted-1"], ["stop", "planted-1"], ["jobs"], ["jobs", "--json"]):
        rc, text = run(capsys, *argv)
        # `jobs` without -c reports every recorded cluster, a refused one as a line (exit 0, issue 32 item 6)
        assert rc in ((0,) if argv[0] == "jobs" else (1, 2)), (argv, rc, text)
        assert "Traceback" not in text and "internal error" not in text, (argv, text)
        assert "refusing to send" in text or "another cluster's folder" in text, (argv, text)
    assert not any(token in auth for _, auth in lst.seen), lst.seen


def test_the_users_own_cluster_still_gets_its_token(home, tmp_path, listener, capsys):
    lst = listener({"/api/jobs/": []})
    p = tmp_path / "mine.yaml"
    p.write_text(f"cluster_name: mine\nhead: {{host: 127.0.0.1, dashboard_port: {lst.port}}}\n"
                 "security: {dashboard_host: all}\n")
    ensure_token(load_cluster(p))  # as `up` does
    rc, text = run(capsys, "jobs", "-c", str(p))
    token = (home / ".verl-cluster/mine/auth_token").read_text().strip()
    assert rc == 0 and "no jobs" in text
    assert ("/api/jobs/", f"Bearer {token}") in lst.seen


def test_an_unbound_token_in_its_clusters_folder_is_not_sent(home, tmp_path, listener, capsys):
    lst = listener({"/api/jobs/": []})
    p = tmp_path / "old.yaml"
    p.write_text(f"cluster_name: old\nhead: {{host: 127.0.0.1, dashboard_port: {lst.port}}}\n"
                 "security: {dashboard_host: all}\n")
    (home / ".verl-cluster/old").mkdir(parents=True)
    (home / ".verl-cluster/old/auth_token").write_text(TOKEN + "\n")  # made before tokens were bound
    rc, text = run(capsys, "jobs", "-c", str(p))
    assert rc == 1 and "does not say which head" in text and f"verl-cluster up -c {p}" in text
    assert lst.seen == []
    (home / ".verl-cluster/old/auth_token").unlink()  # never brought up: said as before
    rc, text = run(capsys, "jobs", "-c", str(p))
    assert rc == 1 and "no auth token for cluster `old`" in text and lst.seen == []


HOSTILE = [
    {"/api/jobs/": [{"submission_id": 5, "status": [1], "metadata": "zz", "start_time": "x"}]},
    {"/api/jobs/": {"not": "a list"}},
    {"/api/jobs/": [1, "two", None]},
    {"/api/jobs/": [{"job_id": "j", "submission_id": "s", "type": "SUBMISSION", "status": "RUNNING",
                     "entrypoint": "x", "metadata": {"verl_cluster.job": ["not", "text"]}}]},
]


@pytest.mark.parametrize("replies", HOSTILE + [
    {"/api/jobs/": [], "/api/jobs/x1/logs": ["a list"], "/api/jobs/x1/stop": ["a list"], "/api/jobs/x1": [7]},
    {"/api/jobs/": [], "/api/jobs/x1/logs": {"logs": 5}, "/api/jobs/x1/stop": {"stopped": "maybe"},
     "/api/jobs/x1": {"status": {"a": 1}}},
])
def test_hostile_replies_are_clear_errors(home, tmp_path, listener, capsys, replies):
    lst = listener(replies)
    p = tmp_path / "mine.yaml"
    p.write_text(f"cluster_name: mine\nhead: {{host: 127.0.0.1, dashboard_port: {lst.port}}}\n"
                 "security: {dashboard_host: all}\n")
    ensure_token(load_cluster(p))
    for argv in (["jobs", "-c", str(p)], ["jobs", "-c", str(p), "--json"], ["logs", "x1", "-c", str(p)],
                 ["stop", "x1", "-c", str(p)]):
        rc, text = run(capsys, *argv)
        assert "internal error" not in text and "Traceback" not in text, (argv, text)
        if rc != 0:
            assert f"127.0.0.1:{lst.port}" in text, (argv, text)  # which server answered so


# ---- bounded reads of regular files ----

def test_a_huge_record_is_not_read_whole(home):
    job_records.record("real-1", "/x/c.yaml", "c", "j")
    big = job_records.jobs_dir() / "big-1.json"
    with open(big, "wb") as f:  # 300 MB, sparse: costs no disk, would cost the memory if read
        f.truncate(300 * 1024 * 1024)
    tracemalloc.start()
    try:
        assert job_records.lookup("big-1") is None
        assert [k.name for k in job_records.known_clusters()] == ["c"]
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 16 * 2**20, f"{peak / 2**20:.0f} MiB held to read the records"


@pytest.mark.parametrize("where", ["jobs", "clusters"])
def test_a_fifo_or_a_dev_zero_link_among_records_neither_hangs_nor_fills_memory(home, where):
    job_records.record("real-1", "/x/c.yaml", "c", "j")
    folder = job_records.jobs_dir() if where == "jobs" else job_records.clusters_dir()
    folder.mkdir(parents=True, exist_ok=True)
    os.mkfifo(folder / "fifo.json")
    (folder / "zero.json").symlink_to("/dev/zero")
    result = []
    t = threading.Thread(target=lambda: result.append((job_records.known_clusters(), job_records.lookup("fifo"),
                                                       job_records.lookup("zero"))), daemon=True)
    t.start()
    t.join(10)
    assert result, "reading the records hung"
    known, fifo, zero = result[0]
    assert [k.name for k in known] == ["c"] and fifo is None and zero is None


def test_a_record_another_user_could_write_is_ignored(home):
    job_records.record("real-1", "/x/c.yaml", "c", "j")
    path = job_records.jobs_dir() / "real-1.json"
    os.chmod(path, 0o666)
    assert job_records.lookup("real-1") is None
    os.chmod(path, 0o600)
    assert job_records.lookup("real-1")["cluster"] == "c"


@pytest.mark.parametrize("at", ["NaN", "Infinity", "1e308", "-1e308", '"soon"', "[1]"])
def test_a_record_with_a_strange_time_is_a_record_without_one(home, at):
    job_records.clusters_dir().mkdir(parents=True)
    (job_records.clusters_dir() / "c.json").write_text(
        f'{{"cluster": "c", "cluster_file": "/x/c.yaml", "overrides": [], "at": {at}, "down_at": {at}}}')
    (k,) = job_records.known_clusters()
    assert math.isfinite(k.last_used) and math.isfinite(k.down_at) and k.last_used >= 0


def bus_record(**over) -> dict:
    rec = {"cluster": "c", "backend": "nccl", "nodes": 2, "ranks": 16, "gpus": 16, "busbw_gbs": 40.0,
           "size_bytes": 2**30, "measured_at": 1.7e9}
    return {"nccl": rec | over}


@pytest.mark.parametrize("over", [{"measured_at": float("nan")}, {"measured_at": 1e308}, {"measured_at": -5.0},
                                  {"busbw_gbs": float("inf")}, {"busbw_gbs": 1e308}, {"nodes": float("nan")}])
def test_collective_json_with_a_strange_number_is_no_measurement(home, over):
    from verl_cluster.facts import measured_bus

    path = measured_bus.state_file("c")
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(bus_record(**over)))  # json writes NaN/Infinity as Python reads them back
    for m in measured_bus.recorded("c"):
        m.source()  # raised ValueError (NaN) / OverflowError (1e308) in time.gmtime
    assert measured_bus.recorded("c") == ()
    path.write_text(json.dumps(bus_record()))
    assert len(measured_bus.recorded("c")) == 1


def test_collective_json_is_read_within_bounds_from_a_regular_file_only(home):
    from verl_cluster.facts import measured_bus

    path = measured_bus.state_file("c")
    path.parent.mkdir(parents=True)
    os.mkfifo(path)
    result = []
    t = threading.Thread(target=lambda: result.append(measured_bus.recorded("c")), daemon=True)
    t.start()
    t.join(10)
    assert result == [()], "reading a FIFO hung"
    path.unlink()
    path.symlink_to("/dev/zero")
    assert measured_bus.recorded("c") == ()
    path.unlink()
    with open(path, "wb") as f:
        f.truncate(300 * 2**20)
    tracemalloc.start()
    try:
        assert measured_bus.recorded("c") == ()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 16 * 2**20


def test_a_run_json_that_is_a_fifo_or_a_link_is_no_run(home):
    from verl_cluster.watch.runs import RunState, run_dir

    folder = run_dir("c", "r1")
    folder.mkdir(parents=True)
    os.mkfifo(folder / "run.json")
    result = []
    t = threading.Thread(target=lambda: result.append(RunState.load("c", "r1")), daemon=True)
    t.start()
    t.join(10)
    assert result == [None], "reading run.json hung"
    (folder / "run.json").unlink()
    (folder / "run.json").symlink_to("/dev/zero")
    assert RunState.load("c", "r1") is None


@pytest.mark.parametrize("entry", [{"factor": float("nan")}, {"factor": 1e308}, {"factor": 0.01}, {"factor": True},
                                   {"recorded_at": float("nan")}, {"recorded_at": 1e308}, {"machines": ["k"]}])
def test_host_speed_json_with_a_strange_entry_teaches_no_plan(home, entry):
    from verl_cluster.records import host_speed

    good = {"machines": "k", "submission_id": "r1", "factor": 0.7, "recorded_at": 1.7e9}
    host_speed.store_path().parent.mkdir(parents=True, exist_ok=True)
    host_speed.store_path().write_text(json.dumps({"runs": [good | entry | {"submission_id": "r2"}, good]}))
    assert [e["submission_id"] for e in host_speed.for_machines("k", 3)] == ["r1"]


def test_host_speed_json_is_read_within_bounds_from_a_regular_file_only(home):
    from verl_cluster.records import host_speed

    path = host_speed.store_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    os.mkfifo(path)
    result = []
    t = threading.Thread(target=lambda: result.append(host_speed.entries()), daemon=True)
    t.start()
    t.join(10)
    assert result == [[]], "reading a FIFO hung"
    path.unlink()
    path.symlink_to("/dev/zero")
    assert host_speed.entries() == []
    assert host_speed.record("k", "r1", 0.7)  # written through a new file, never through the link it replaced
    assert not path.is_symlink() and oct(path.stat().st_mode & 0o777) == "0o600"
