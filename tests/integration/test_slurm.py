"""verl-cluster on a REAL Slurm: slurmctld on the first namespace host, one slurmd per host (each in its own
network namespace), munge with a key made here. One Slurm for the module.

salloc -N 3 -> up --slurm -> status (3 alive) -> submit the smoke job -> a node drained mid-allocation is
reported by status and check -> down (no Ray left) -> up again and the allocation's end leaves no Ray;
sbatch of a generated script runs the smoke job end to end and the batch job COMPLETES.
"""

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from tests.harness.cli import ROOT, run_cli
from tests.harness.slurm import SlurmLab, slurm_ready

pytestmark = pytest.mark.integration


def _ray_left(hosts) -> dict[str, list[str]]:
    """Live Ray processes per host (zombies are dead: they only wait for the host's init to reap them)."""
    left = {}
    pat = ("gcs_server", "raylet", "ray start", "ray::", "dashboard", "log_monitor", "runtime_env")
    for h in hosts:
        r = h.run(["ps", "-eo", "stat=,args="])
        lines = [ln for ln in r.stdout.splitlines() if not ln.lstrip().startswith("Z") and any(p in ln for p in pat)]
        if lines:
            left[h.name] = lines
    return left


def _wait_for(pred, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = pred()
        if v:
            return v
        time.sleep(0.3)
    raise AssertionError(f"{what}: not within {timeout:.0f}s")


@pytest.fixture(scope="module")
def slurm(module_lab):
    why = slurm_ready()
    if why:
        if os.environ.get("VC_REQUIRE_INTEGRATION") == "1":
            pytest.fail(f"Slurm prerequisites missing: {why}")
        pytest.skip(why)
    hosts = [module_lab.add_host(f"s{i}") for i in range(3)]  # sshd: the bench compares with SSH
    lab = SlurmLab(module_lab, hosts)
    try:
        yield module_lab, lab, hosts
    finally:
        lab.close()


class Allocation:
    """`salloc` running a shell that records its environment and waits: the commands then run with exactly
    the variables a user's salloc shell has."""

    def __init__(self, lab: SlurmLab, where: Path, *args: str):
        envf = where / f"alloc-{time.monotonic_ns()}.env"
        # the shell holds the allocation until its stdin closes (end(), or this process dying)
        self.proc = subprocess.Popen(["salloc", *args, "--", "sh", "-c", f"env > {envf}.tmp && mv {envf}.tmp {envf}; "
                                      "exec cat > /dev/null"], env={**os.environ, **lab.env}, stdin=subprocess.PIPE,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        _wait_for(envf.exists, 30, "salloc")
        self.env = dict(line.split("=", 1) for line in envf.read_text().splitlines() if "=" in line)
        self.job_id = self.env["SLURM_JOB_ID"]
        self.lab = lab

    def end(self) -> None:
        if self.proc.poll() is not None:
            return
        self.lab.run(["scancel", self.job_id])
        self.proc.stdin.close()  # the shell ends, and salloc with it
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)


def test_salloc_up_status_submit_drain_down(slurm):
    lab, sl, hosts = slurm
    alloc = Allocation(sl, lab.dir, "-N", "3", "-c", "2")
    env = alloc.env
    names = [sl.node(h) for h in hosts]
    ovr = "ray.object_store_memory=209715200"
    try:
        assert alloc.env["SLURM_JOB_NODELIST"]
        dry = run_cli("up", "--slurm", ovr, "--dry-run", "--json", env=env)
        assert dry.returncode == 0, dry.stderr[-2000:]
        plan = json.loads(dry.stdout)
        assert [n["host"] for n in plan["nodes"]] == names and plan["nodes"][0]["role"] == "head"
        assert all("--block" in n["argv"] for n in plan["nodes"])
        text = run_cli("up", "--slurm", ovr, "--dry-run", env=env).stdout
        assert f"--nodelist={names[1]}" in text and "--overlap" in text and "--job-name=vc-ray" in text

        t0 = time.monotonic()
        up = run_cli("up", "--slurm", ovr, "--json", env=env, timeout=240)
        assert up.returncode == 0, up.stdout[-3000:] + up.stderr[-3000:]
        rep = json.loads(up.stdout)
        print(f"up --slurm, 3 nodes: {time.monotonic() - t0:.1f}s")
        assert [n["action"] for n in rep["nodes"]] == ["started"] * 3
        assert [n["ip"] for n in rep["nodes"]] == [h.ip for h in hosts]
        # Ray is held by one srun step per node
        steps = sl.run(["squeue", "-h", "-s", "-j", alloc.job_id, "-o", "%j %N"]).stdout.split("\n")
        assert sorted(s.split()[1] for s in steps if s.startswith("vc-ray")) == sorted(names)

        again = run_cli("up", "--slurm", ovr, "--json", env=env)  # idempotent: verifies, starts nothing
        assert again.returncode == 0 and [n["action"] for n in json.loads(again.stdout)["nodes"]] == ["kept"] * 3

        st = run_cli("status", "--slurm", "--json", env=env)
        assert st.returncode == 0, st.stderr[-2000:]
        s = json.loads(st.stdout)
        assert s["healthy"] and [n["alive"] for n in s["nodes"]] == [True] * 3 and not s["problems"]

        sub = run_cli("submit", ROOT / "launch/smoke.yaml", "--slurm", "env.SMOKE_MIN_NODES=3", env=env, timeout=240)
        assert sub.returncode == 0, sub.stderr[-3000:]
        assert "SUCCEEDED" in sub.stderr and "SMOKE OK: 3 node(s)" in sub.stdout

        # the full check: port servers on every node through srun, links, a gloo all-reduce through Ray
        ck = run_cli("check", "--slurm", "--json", env=env, timeout=240)
        rep = json.loads(ck.stdout)
        assert ck.returncode == 0 and rep["collectives"] and all(c["ok"] for c in rep["collectives"]), rep["problems"]

        # too few nodes for the job: one line, the fix, before anything runs
        short = run_cli("submit", ROOT / "launch/smoke.yaml", "--slurm", "trainer.nnodes=4", env=env)
        assert short.returncode == 2 and "has 3 node(s), but job smoke needs 4" in short.stderr
        assert "--nodes=4" in short.stderr and "Traceback" not in short.stderr

        # a worker's Ray dies: its step ends with it, and `up` heals that node alone (after the job: Ray keeps the dead
        # registration ALIVE until its health check fails it, and a job started meanwhile may pick it)
        hosts[2].run(["pkill", "-9", "-f", "raylet"])
        _wait_for(lambda: names[2] not in sl.run(["squeue", "-h", "-s", "-j", alloc.job_id, "-o", "%N"]).stdout, 30,
                  "the dead worker's step ends")
        heal = run_cli("up", "--slurm", ovr, "--no-check", "--json", env=env, timeout=240)
        assert heal.returncode == 0, heal.stdout[-3000:]
        assert [n["action"] for n in json.loads(heal.stdout)["nodes"]][:2] == ["kept", "kept"]
        # a node drained mid-allocation: still in the job, reported by status and check
        assert sl.scontrol("update", f"nodename={names[2]}", "state=drain", "reason=vc-test-drain").returncode == 0
        st = json.loads(run_cli("status", "--slurm", "--json", env=env).stdout)
        assert any(names[2] in p and "DRAIN" in p and "vc-test-drain" in p for p in st["problems"]), st["problems"]
        ck = run_cli("check", "--slurm", "--quick", "--json", env=env, timeout=180)
        probs = json.loads(ck.stdout)["problems"]
        assert any(p["node"] == names[2] and "DRAIN" in p["what"] and p["severity"] == "warning"
                   for p in probs), probs

        down = run_cli("down", "--slurm", "--json", env=env)
        assert down.returncode == 0 and json.loads(down.stdout)["ok"], down.stdout[-2000:]
        assert _ray_left(hosts) == {}
        _wait_for(lambda: "vc-ray" not in sl.run(["squeue", "-h", "-s", "-j", alloc.job_id, "-o", "%j"]).stdout,
                  20, "the Ray steps end after down")

        # up again, then end the allocation: Slurm ends the Ray steps and nothing of Ray is left anywhere
        again = run_cli("up", "--slurm", ovr, "--no-check", "--json", env=env, timeout=240)
        assert again.returncode == 0, again.stdout[-2000:]
        assert _ray_left(hosts)
        alloc.end()
        _wait_for(lambda: _ray_left(hosts) == {}, 40, "no Ray after the allocation ended")
    finally:
        alloc.end()
        sl.scontrol("update", f"nodename={names[2]}", "state=resume")


def test_bad_input_outside_allocation(slurm):
    lab, sl, hosts = slurm
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_JOB")} | sl.env
    r = run_cli("status", "--slurm", env={**env, "SLURM_JOB_ID": ""})
    assert r.returncode == 2 and "not inside a Slurm allocation" in r.stderr and "salloc" in r.stderr
    # an allocation without GPUs, and a job that runs on GPUs (verl's PPO trainer)
    alloc = Allocation(sl, lab.dir, "-N", "1")
    try:
        r = run_cli("submit", ROOT / "launch/gsm8k.yaml", "--slurm", env=alloc.env)
        assert r.returncode == 2 and "has no GPUs, but job gsm8k-ppo runs on GPUs" in r.stderr, r.stderr[-2000:]
        assert "--gpus-per-node=" in r.stderr
    finally:
        alloc.end()


def test_sbatch_generated_script_completes(slurm):
    lab, sl, hosts = slurm
    logs = lab.dir / "sbatch-logs"
    env = {**sl.env, "HOME": os.environ.get("HOME", "/root")}
    # a job with no checkpoint folder gets plain submit, and says why
    dry = run_cli("sbatch", ROOT / "launch/smoke.yaml", "--dry-run", "--json", env=env)
    d = json.loads(dry.stdout)
    assert not d["watch"] and "trainer.default_local_dir" in d["note"] and "--watch" not in d["script"]
    # the resumable CPU trainer (saves like verl): the script runs up, check, submit --watch, down
    ckpt = lab.dir / "ckpt"  # /var/tmp is one folder for every namespace host, as shared storage is
    r = run_cli("sbatch", ROOT / "launch/resumable.yaml", "trainer.total_training_steps=3", "resumable.step_s=0.3",
                f"trainer.default_local_dir={ckpt}", "--nodes", "2", "--cpus-per-node", "2", "--time", "10",
                "--cluster-set", "ray.object_store_memory=209715200", "--log-dir", logs, "--submit", "--json",
                env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    out = json.loads(r.stdout)
    jid = out["job_id"]
    assert jid.isdigit() and Path(out["script"]).is_file() and out["watch"]

    def state():
        rec = sl.scontrol("show", "job", "-o", jid).stdout
        s = next((w.split("=", 1)[1] for w in rec.split() if w.startswith("JobState=")), "")
        return s if s in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL") else None

    final = _wait_for(state, 240, f"batch job {jid}")
    job_logs = logs / jid
    text = {p.name: p.read_text(errors="replace") for p in job_logs.glob("*.log")}
    main = (logs / f"slurm-{jid}.out").read_text(errors="replace")
    slurm_logs = "".join(f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}" for p in sl.dir.glob("slurm*.log"))
    assert final == "COMPLETED", main + "\n".join(f"--- {k}\n{v[-2000:]}" for k, v in text.items()) + slurm_logs
    assert {"up.log", "check.log", "submit.log", "down.log"} <= set(text)
    assert "SUCCEEDED" in text["submit.log"] and "step 3" in text["submit.log"], text["submit.log"][-3000:]
    assert "stopped" in text["down.log"]
    assert _ray_left(hosts) == {}


def test_a_daemonised_ray_outlives_its_allocation(slurm):
    """Why verl-cluster holds Ray in a step: under proctrack/linuxproc a `ray start` without --block leaves the
    step that started it, and even the allocation's end does not stop it."""
    import sys

    from verl_cluster.slurm.runner import SlurmRunner

    lab, sl, hosts = slurm
    alloc = Allocation(sl, lab.dir, "-N", "1", "-w", sl.node(hosts[0]))
    ray = str(Path(sys.executable).with_name("ray"))
    try:
        r = SlurmRunner(sl.node(hosts[0]), alloc.job_id).run(
            [ray, "start", "--head", "--port", "6390", "--node-ip-address", hosts[0].ip, "--temp-dir", "/tmp/vc-escape",
             "--object-store-memory", "209715200", "--include-dashboard=false", "--disable-usage-stats"],
            env=sl.env, timeout=120)
        assert r.ok, r.tail()
    finally:
        alloc.end()
    try:
        time.sleep(3)
        assert any("gcs_server" in ln for ln in _ray_left([hosts[0]]).get(hosts[0].name, []))
    finally:
        # only this Ray runs on the host now (the other tests stopped theirs); its workers renamed themselves
        hosts[0].run(["pkill", "-9", "-f", "/tmp/vc-escape|gcs_server|raylet|ray::|dashboard|log_monitor|runtime_env"])
        _wait_for(lambda: _ray_left([hosts[0]]) == {}, 30, "the escaped Ray stopped by hand")
