"""`submit` / `jobs` / `logs` / `stop` against a real Ray cluster (head + 1 worker) on namespace hosts.

The session's shared cluster (Ray's head costs ~1.6 GiB and ~10 s to start).
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.harness.cli import run_cli
from verl_cluster.config.cluster import load_cluster

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]


cli = run_cli


@pytest.fixture(scope="module")
def cluster(shared_cluster):
    return shared_cluster.lab, shared_cluster.path, shared_cluster.head, shared_cluster.worker


def job_file(lab, name, text):
    p = lab.dir / f"{name}.yaml"
    p.write_text(text)
    return p


def test_smoke_job_succeeds_on_every_node_with_backend_env(cluster):
    lab, path, head, worker = cluster
    r = cli("submit", ROOT / "launch/smoke.yaml", "env.SMOKE_MIN_NODES=2", "-c", path)
    assert r.returncode == 0, r.stderr[-3000:]
    report = json.loads(next(line for line in r.stdout.splitlines() if line.startswith("SMOKE-REPORT "))[13:])
    assert sorted(n["ip"] for n in report["nodes"]) == [head.ip, worker.ip]
    for node in report["nodes"]:
        assert node["resources"]["CPU"] >= 1
        assert node["env"]["GLOO_SOCKET_IFNAME"] and "eth0" in node["env"]["NCCL_SOCKET_IFNAME"]
        assert node["env"]["SMOKE_MIN_NODES"] == "<set>"
    assert report["problems"] == []
    assert "RUNNING" in r.stderr and "SUCCEEDED" in r.stderr


def test_failing_job_exits_1_with_its_last_lines(cluster):
    lab, path, _, _ = cluster
    job = job_file(lab, "fail", "name: fail\nlauncher: ray\ncommand: [python, -c, "
                                "\"import sys; print('about to fail: step 7'); sys.exit(3)\"]\n")
    r = cli("submit", job, "-c", path)
    assert r.returncode == 1, r.stderr[-2000:]
    assert "FAILED" in r.stderr
    tail = r.stderr[r.stderr.index("last lines:"):]
    assert "about to fail: step 7" in tail


def test_no_follow_then_jobs_logs_stop(cluster):
    lab, path, _, _ = cluster
    job = job_file(lab, "sleeper", "name: sleeper\nlauncher: ray\ncommand: [python, -u, -c, "
                                   "\"import time; print('sleeping now'); time.sleep(600)\"]\n")
    r = cli("submit", job, "--no-follow", "--json", "-c", path)
    assert r.returncode == 0, r.stderr[-2000:]
    sub = json.loads(r.stdout)
    sid = sub["submission_id"]
    assert sid.startswith("sleeper-") and sub["status"] == "RUNNING"
    jobs = json.loads(cli("jobs", path, "--json").stdout)["clusters"][0]["jobs"]
    assert any(j["submission_id"] == sid and j["status"] == "RUNNING" and j["job_name"] == "sleeper" for j in jobs)
    for _ in range(40):  # the driver's first line can take a moment to reach the log
        logs = cli("logs", sid, path)
        if "sleeping now" in logs.stdout:
            break
    assert "sleeping now" in logs.stdout
    r = cli("stop", sid, path, "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["status"] == "STOPPED"


def test_wrong_token_is_refused(cluster, tmp_path):
    lab, path, head, _ = cluster
    bad = tmp_path / "bad-token"
    bad.write_text("0" * 64 + "\n")
    text = Path(path).read_text()
    other = tmp_path / "c.yaml"
    other.write_text("\n".join(line if "token_file" not in line else f"  token_file: {bad}"
                               for line in text.splitlines()) + "\n")
    r = cli("submit", ROOT / "launch/smoke.yaml", "-c", other, "--no-follow")
    assert r.returncode == 1
    assert "refused our token" in r.stderr and "Traceback" not in r.stderr
    # and with no token at all, the Jobs API answers 401 (through a tunnel, as the CLI does)
    import requests

    from verl_cluster.launchers import runner_for

    spec = load_cluster(path)
    runner = runner_for(spec, spec.head)
    try:
        with runner.open_tunnel("127.0.0.1", spec.head.dashboard_port) as t:
            assert requests.get(f"{t.url}/api/jobs/", timeout=10).status_code == 401
    finally:
        runner.close()


def test_dry_run_masks_secrets(cluster):
    lab, path, _, _ = cluster
    job = job_file(lab, "secret", "name: secret\nlauncher: ray\ncommand: [python, -c, 'print(1)']\n"
                                  "secrets: [VC_TEST_SECRET]\nenv: {PLAIN: visible}\n")
    env = {"VC_TEST_SECRET": "supersecret-123"}
    r = cli("submit", job, "--dry-run", "-c", path, env=env)
    assert r.returncode == 0, r.stderr
    assert "supersecret-123" not in r.stdout + r.stderr
    assert "VC_TEST_SECRET=***" in r.stdout and "PLAIN=visible" in r.stdout
    assert "entrypoint" in r.stdout and "(dry run: nothing was submitted)" in r.stdout
    rj = cli("submit", job, "--dry-run", "--json", "-c", path, env=env)
    d = json.loads(rj.stdout)
    assert d["request"]["runtime_env"]["env_vars"]["VC_TEST_SECRET"] == "***"
    assert "supersecret-123" not in rj.stdout + rj.stderr
    environ = {k: v for k, v in os.environ.items() if k != "VC_TEST_SECRET"}
    missing = subprocess.run([sys.executable, "-m", "verl_cluster", "submit", str(job), "--dry-run", "-c", str(path)],
                             capture_output=True, text=True, cwd=ROOT, env=environ, timeout=120)
    assert missing.returncode == 2 and "secret VC_TEST_SECRET not set in this shell" in missing.stderr


def test_preflight_bad_columns_missing_file_gpus_short(cluster):
    import pyarrow as pa
    import pyarrow.parquet as pq

    lab, path, head, worker = cluster
    raw = lab.dir / "raw_train.parquet"  # /var/tmp is visible on both hosts
    pq.write_table(pa.Table.from_pylist([{"question": "q", "answer": "#### 1"}]), raw)
    # a file only the head has (each host's /tmp is private)
    head.run(["/bin/sh", "-c", f"cp {raw} /tmp/only_head.parquet"], check=True)
    job = job_file(lab, "ppo", "name: ppo\nentrypoint: verl.trainer.main_ppo\n"
                               f"data: {{train_files: [{raw}], val_files: [/tmp/only_head.parquet]}}\n")
    r = cli("submit", job, "trainer.n_gpus_per_node=1", "data.train_batch_sizee=4", "--dry-run", "-c", path)
    err = r.stderr
    assert r.returncode == 2, err  # the job's own data and keys are wrong: exit 2, whatever else (GPUs short)
    assert f"{raw}: missing columns `prompt`, `data_source`, `reward_model.ground_truth`" in err
    assert "extra columns: answer, question" in err
    assert f"/tmp/only_head.parquet: not found on {worker.ip}" in err
    assert "needs 1 node(s) x 1 GPU(s)" in err
    from verl_cluster.submit.verl_config import verl_available, verl_python

    if verl_available(verl_python()):
        assert "unknown verl key `data.train_batch_sizee`" in err and "did you mean `data.train_batch_size`" in err
    else:
        assert "skipped verl-config verl is not installed" in err  # here, nor on the head (where it ran)
    # without --dry-run the same problems stop the submit
    r2 = cli("submit", job, "trainer.n_gpus_per_node=1", "-c", path)
    assert r2.returncode == 2 and "nothing was submitted" in r2.stderr


HOLDER = """import ray, time
ray.init()

@ray.remote(num_cpus=0)
class TransferQueueController:  # stands in for verl 0.9's: same name, same fixed namespace
    def ping(self):
        return 1

q = TransferQueueController.options(name="TransferQueueController", namespace="transfer_queue").remote()
ray.get(q.ping.remote())
print("queue up", flush=True)
time.sleep(600)
"""


def test_a_second_verl_job_is_refused_while_another_holds_the_queue(cluster):
    """verl 0.9's TransferQueue controller is one per Ray cluster: a job holding it (a stand-in made the way verl
    makes it) turns a verl trainer's submit away naming that job; once it is stopped, the check passes."""
    lab, path, _, _ = cluster
    (lab.dir / "holder.py").write_text(HOLDER)
    holder = job_file(lab, "holder", f"name: holder\nlauncher: ray\nworking_dir: {lab.dir}\n"
                                     "command: [python, -u, holder.py]\n")
    r = cli("submit", holder, "--no-follow", "--json", "-c", path)
    assert r.returncode == 0, r.stderr[-2000:]
    sid = json.loads(r.stdout)["submission_id"]
    try:
        for _ in range(60):
            if "queue up" in cli("logs", sid, path).stdout:
                break
        job = job_file(lab, "grpo", "name: grpo\nentrypoint: verl.trainer.main_ppo\n")
        r = cli("submit", job, "--dry-run", "-c", path)
        assert r.returncode in (1, 2), r.stderr[-3000:]
        assert f"{sid} is running verl's TransferQueue on this cluster" in r.stderr, r.stderr[-3000:]
        assert f"verl-cluster stop {sid}" in r.stderr  # (trainer.use_v1=false, no queue: tests/unit/test_shared_queue.py)
    finally:
        assert cli("stop", sid, path).returncode == 0
    after = cli("submit", job, "--dry-run", "-c", path)  # the holder's actors went with it
    assert "TransferQueue on this cluster" not in after.stderr and "shared-queue" in after.stderr
