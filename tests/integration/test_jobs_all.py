"""`jobs` with no cluster named, on namespace hosts: the session's shared cluster (up, with a job submitted from
here) is listed while two recorded clusters that are gone — one whose head host is switched off, one a Slurm
allocation long ended — are each named in one line with why; once `down` has stopped the first, it is named down
and no longer asked. Runs with a HOME of its own."""

import json
import time

import pytest

from tests.harness.cli import run_cli
from verl_cluster.records import job_records

pytestmark = pytest.mark.integration


def test_jobs_lists_every_cluster_that_answers_and_names_the_gone_ones(shared_cluster, home, tmp_path, real_home):
    lab, path = shared_cluster.lab, shared_cluster.path
    env = {"HOME": str(home), "COLUMNS": "250"}
    job = tmp_path / "sleeper.yaml"
    job.write_text("name: sleeper\nlauncher: ray\ncommand: [python, -c, \"import time; time.sleep(600)\"]\n")
    r = run_cli("submit", job, "--no-follow", "--json", "-c", path, env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    sid = json.loads(r.stdout)["submission_id"]
    try:
        gone = lab.add_host("jobsgone")  # a cluster brought up from here (`up` records it) whose head is now off
        gone_path = lab.cluster_yaml(gone, [], name=f"gone{lab.n}")
        r = run_cli("up", "-c", gone_path, "--no-check", env=env)
        assert r.returncode == 0, r.stderr[-2000:]
        assert [k.cluster_file for k in job_records.known_clusters() if k.name == f"gone{lab.n}"] == [str(gone_path)]
        lab.stop(gone)
        alloc = tmp_path / "cluster-4242.yaml"  # what `--slurm` wrote inside an allocation that has ended
        alloc.write_text("cluster_name: slurm-4242\nlauncher: slurm\nslurm:\n  job_id: \"4242\"\n")
        job_records.record("smoke-old", str(alloc), "slurm-4242", "smoke")

        t0 = time.monotonic()
        r = run_cli("jobs", "--json", "--timeout", "60", env=env, timeout=120)
        took = time.monotonic() - t0
        assert r.returncode == 0, r.stderr[-2000:]
        by = {c["cluster"]: c for c in json.loads(r.stdout)["clusters"]}
        assert set(by) == {f"shared{lab.n}", f"gone{lab.n}", "slurm-4242"}, by.keys()
        up = by[f"shared{lab.n}"]
        assert up["answered"] and any(j["submission_id"] == sid and j["status"] == "RUNNING" for j in up["jobs"])
        assert not by[f"gone{lab.n}"]["answered"] and gone.ip in by[f"gone{lab.n}"]["error"]
        assert not by["slurm-4242"]["answered"] and "scontrol" in by["slurm-4242"]["error"]

        r = run_cli("jobs", env=env, timeout=120)
        assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr[-2000:]
        assert sid in r.stdout and f"shared{lab.n}" in r.stdout
        silent = [x for x in r.stderr.splitlines() if "did not answer" in x]
        assert len(silent) == 2, r.stderr
        assert any(x.startswith(f"gone{lab.n} ") and gone.ip in x for x in silent), silent
        assert any(x.startswith("slurm-4242 ") and "scontrol" in x for x in silent), silent
        print(f"\nJOBS-ALL three clusters (one up, two gone) answered in {took:.1f}s\n" + "\n".join(silent))

        lab.start(gone)  # switched on again (sshd, no Ray): `down` reaches it, and from then on it is down, not gone
        r = run_cli("down", "-c", gone_path, env=env)
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
        r = run_cli("jobs", "--json", "--timeout", "60", env=env, timeout=120)
        assert r.returncode == 0, r.stderr[-2000:]
        by = {c["cluster"]: c for c in json.loads(r.stdout)["clusters"]}
        assert by[f"gone{lab.n}"]["down"] and "error" not in by[f"gone{lab.n}"], by[f"gone{lab.n}"]
        assert by[f"shared{lab.n}"]["answered"] and not by["slurm-4242"]["down"]
        r = run_cli("jobs", env=env, timeout=120)
        assert r.returncode == 0 and sid in r.stdout, r.stderr[-2000:]
        assert [x.split()[0] for x in r.stderr.splitlines() if "did not answer" in x] == ["slurm-4242"], r.stderr
        assert any(x.startswith(f"gone{lab.n} ") and "is down" in x for x in r.stderr.splitlines()), r.stderr
    finally:
        run_cli("stop", sid, "-c", path, env=env)
    assert not (real_home / ".verl-cluster/clusters" / f"gone{lab.n}.json").exists()
    assert not (real_home / ".verl-cluster/jobs" / f"{sid}.json").exists()
