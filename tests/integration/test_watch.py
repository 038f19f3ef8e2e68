"""`submit --watch` / `watch` on real hosts: head + 2 workers (namespace hosts, real sshd, real Ray) running
launch/resumable_job.py. One cluster for the module; the test that leaves a worker dead runs last."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.harness.cli import ROOT, run_cli
from tests.harness.wait import wait_for

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def lab3(module_lab, tmp_path_factory):
    from tests.harness.ray_cluster import running_cluster

    lab = module_lab
    head, w1, w2 = lab.add_host("head"), lab.add_host("w1"), lab.add_host("w2")
    home = tmp_path_factory.mktemp("home")  # job records and run folders of this module only
    # interface auto: up detects it and gives it to every node, as the CLI does
    with running_cluster(lab, head, [w1, w2], name=f"watch{lab.n}", backend_env=True) as path:
        yield lab, path, (head, w1, w2), home


def cli(lab3, *args, timeout=240):
    _, _, _, home = lab3
    return run_cli(*args, env={"HOME": str(home)}, timeout=timeout)


def popen_cli(lab3, *args):
    _, _, _, home = lab3
    return subprocess.Popen([sys.executable, "-m", "verl_cluster", *map(str, args)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=ROOT,
                            env={**os.environ, "HOME": str(home)})


def settle(lab3) -> None:
    """`up`, and then no old registration still listed alive (the GCS marks a dead one only after its health check
    fails): `up` itself waits for that when it started a node again under a running head, so a job submitted next
    does not land on the dead one (here: a test before may have left w2 down)."""
    _, path, _, home = lab3
    r = cli(lab3, "up", path)
    assert r.returncode == 0, r.stderr[-2000:]
    probe = ("import sys; from verl_cluster.launchers import load_cluster; from verl_cluster.watch.detect import "
             "NodeMonitor; print(','.join(NodeMonitor(load_cluster(sys.argv[1])).stale()))")

    def clean() -> bool:
        q = subprocess.run([sys.executable, "-c", probe, str(path)], capture_output=True, text=True, timeout=60,
                           env={**os.environ, "HOME": str(home)}, cwd=ROOT)
        assert q.returncode == 0, q.stderr[-2000:]
        return not q.stdout.strip()
    assert clean(), f"up returned with an old registration still listed alive: {r.stdout[-1500:]}"


def job(lab3, name, steps=10, save_freq=3, step_s=0.4, watch="", **knobs):
    lab = lab3[0]
    ckpt = lab.dir / f"ckpt-{name}"
    extra = "".join(f"  resumable.{k}: {v}\n" for k, v in knobs.items())
    p = lab.dir / f"{name}.yaml"
    p.write_text(f"name: {name}\ncommand: [python, resumable_job.py]\nlauncher: ray\nworking_dir: {ROOT / 'launch'}\n"
                 "overrides:\n"
                 f"  trainer.total_training_steps: {steps}\n  trainer.save_freq: {save_freq}\n"
                 f"  trainer.default_local_dir: {ckpt}\n  resumable.step_s: {step_s}\n{extra}"
                 f"watch:\n  backoff_s: 0.2\n  max_restarts: 2\n{watch}")
    return p, ckpt


def steps_by_attempt(ckpt):
    order, by = [], {}
    for line in (ckpt / "steps.log").read_text().splitlines():
        jid, step = line.split()
        if jid not in by:
            order.append(jid)
            by[jid] = []
        by[jid].append(int(step))
    return [by[j] for j in order]


def run_state(lab3, sid):
    home = lab3[3]
    found = list(Path(home, ".verl-cluster").glob(f"*/runs/{sid}/run.json"))
    assert found, f"no run folder for {sid}"
    st = json.loads(found[0].read_text())
    events = [json.loads(x) for x in (found[0].parent / "events.jsonl").read_text().splitlines()]
    return st, events


def show(events):
    return "\n".join(f"{e['time']:.1f} {e['class']} {e['node']} {e['action']} | {e['evidence']}" for e in events)


BACKEND_VARS = ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME")


def raylet_env(ip):
    """The environment of the raylet serving `ip` (namespace hosts share this machine's /proc)."""
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            flag = [a for a in cmd if a.endswith(f"node_ip_address={ip}".encode())
                    or a.endswith(f"node-ip-address={ip}".encode())]
            if cmd and cmd[0].endswith(b"raylet") and flag:
                raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
                return dict(x.decode(errors="replace").split("=", 1) for x in raw if b"=" in x)
        except OSError:
            continue
    raise AssertionError(f"no raylet for {ip}")


def first_sid(stderr):
    return next(line.split()[1].rstrip(";") for line in stderr.splitlines() if line.startswith("submitted "))


def test_user_error_is_not_retried(lab3):
    path = lab3[1]
    j, _ = job(lab3, "usererr", raise_at=3, step_s=0.2)
    r = cli(lab3, "submit", j, "-c", path, "--watch")
    assert r.returncode == 1, r.stderr[-3000:]
    assert "user-code" in r.stderr and "not retried" in r.stderr
    assert "ValueError: bad value at step 3" in r.stderr  # the traceback's last lines are shown
    assert "Traceback" in r.stderr
    st, events = run_state(lab3, first_sid(r.stderr))
    assert st["restarts"] == 0 and st["state"] == "failed" and len(st["attempts"]) == 1
    assert {e["class"] for e in events} >= {"user-code"}
    assert "is shared by all 3 nodes" in r.stderr  # preflight: the checkpoint folder is one for every node


def test_an_oom_is_retried_and_says_what_it_did_about_the_plan(lab3):
    path = lab3[1]
    j, ckpt = job(lab3, "oom", steps=6, oom_at=4, step_s=0.2)
    r = cli(lab3, "submit", j, "-c", path, "--watch")
    assert r.returncode == 0, r.stderr[-3000:]
    st, events = run_state(lab3, first_sid(r.stderr))
    assert st["state"] == "succeeded" and st["restarts"] == 1, show(events)
    assert st["attempts"][0]["class"] == "oom"
    oom = [e for e in events if e["class"] == "oom" and e["action"] in ("same settings", "re-planned with room")]
    assert len(oom) == 1 and oom[0]["action"] == "same settings", show(events)
    assert oom[0]["evidence"].startswith("not a verl trainer")  # no plan to change; a verl trainer's is unit-tested
    done = [s for steps in steps_by_attempt(ckpt) for s in steps]
    assert sorted(set(done)) == list(range(1, 7))  # resumed from global_step_3, nothing lost


def test_preflight_finds_a_node_local_checkpoint_dir(lab3):
    path, (head, w1, w2) = lab3[1], lab3[2]
    j, _ = job(lab3, "localck")
    r = cli(lab3, "submit", j, "-c", path, "--watch", "--dry-run", "trainer.default_local_dir=/tmp/ck")
    assert "trainer.default_local_dir /tmp/ck is local to the head" in r.stderr, r.stderr[-2000:]
    assert w1.ip in r.stderr and w2.ip in r.stderr
    r = cli(lab3, "submit", j, "-c", path, "--watch", "watch.hang_after=soon")
    assert r.returncode == 2 and "`watch.hang_after` must be a duration" in r.stderr and "Traceback" not in r.stderr


def test_restart_budget_spent(lab3):
    path = lab3[1]
    j, _ = job(lab3, "budget", die_at=2, step_s=0.2)
    r = cli(lab3, "submit", j, "-c", path, "--watch")
    assert r.returncode == 1, r.stderr[-3000:]
    sid = first_sid(r.stderr)
    assert "restart budget spent (2/2)" in r.stderr
    st, events = run_state(lab3, sid)
    assert st["state"] == "gave-up" and st["restarts"] == 2
    ids = [a["submission_id"] for a in st["attempts"]]
    assert ids == [sid, f"{sid}-r1", f"{sid}-r2"]
    assert all(a["status"] == "FAILED" for a in st["attempts"])
    for i in ids:  # every attempt listed at the end
        assert f"  {i}: FAILED" in r.stderr
    # `jobs` shows the chain
    jobs = json.loads(cli(lab3, "jobs", "-c", path, "--json").stdout)["clusters"][0]["jobs"]
    chain = {j["submission_id"]: j for j in jobs if j["submission_id"] in ids}
    assert chain[f"{sid}-r2"].get("previous") == f"{sid}-r1" and chain[f"{sid}-r1"].get("run") == sid


def test_hang_is_stopped_and_resumed(lab3):
    path = lab3[1]
    j, ckpt = job(lab3, "hang", steps=8, save_freq=2, step_s=0.3, hang_at=5, watch="  hang_after: 12s\n")
    t0 = time.monotonic()
    r = cli(lab3, "submit", j, "-c", path, "--watch")
    assert r.returncode == 0, r.stderr[-3000:]
    sid = first_sid(r.stderr)
    st, events = run_state(lab3, sid)
    hang = [e for e in events if e["class"] == "hang" and "no new log line" in e["evidence"]]
    assert len(hang) == 1
    assert any("hanging at step 5" in x for x in hang[0]["lines"])  # the last lines are kept
    bundle = next(e for e in events if e["action"] == "bundle collected")  # py-spy comes with ray[default]
    assert any("resumable_job.py" in x for x in bundle["lines"]), show(events)  # the stuck process's top frames
    assert "stuck:" in bundle["evidence"] and "(driver, S)" in bundle["evidence"], bundle["evidence"]
    folder = Path(st["attempts"][0]["submission_id"]).name
    folder = next(Path(lab3[3], ".verl-cluster").glob(f"*/runs/{sid}/bundle-{folder}"))
    dump = (folder / "stacks.txt").read_text()
    assert "(driver, state S" in dump and "resumable_job.py" in dump
    actors = json.loads((folder / "actors.json").read_text())  # Ray's table for the job (its tasks hold none)
    assert isinstance(actors, list)
    assert json.loads((folder / "nvml.json").read_text())[0]["gpus"] == []  # namespace hosts have no GPU
    assert (folder / "worker-logs.txt").exists()
    tail = (folder / "driver-log-tail.txt").read_text()  # the driver log's last lines, from the watcher's reader
    assert "hanging at step 5" in tail and len(tail.splitlines()) <= 500
    clean = next(e for e in events if e["action"] == "clean slate")  # nothing of the hung attempt was left
    assert clean["evidence"].startswith("clean after"), clean["evidence"]
    assert st["restarts"] == 1 and st["attempts"][0]["status"] == "HANG" and st["state"] == "succeeded"
    a, b = steps_by_attempt(ckpt)
    assert a == [1, 2, 3, 4] and b == [5, 6, 7, 8]
    assert time.monotonic() - t0 < 120


def test_worker_killed_and_back(lab3):
    lab, path, (head, w1, w2), _ = lab3
    j, ckpt = job(lab3, "kill", steps=14, save_freq=3, step_s=0.5)
    p = popen_cli(lab3, "submit", j, "-c", path, "--watch")
    try:
        wait_for(lambda: (ckpt / "steps.log").exists() and len((ckpt / "steps.log").read_text().split("\n")) > 5,
                 90, "step 5")
        after_up = {k: raylet_env(w2.ip).get(k) for k in BACKEND_VARS}  # as the module's `up` started it
        lab.stop(w2)  # SIGKILL of the whole host
        killed = time.time()
        time.sleep(3)
        lab.start(w2)  # the host comes back with sshd, without Ray
        back = time.time()
        out, err = p.communicate(timeout=240)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 0, err[-4000:]
    sid = first_sid(err)
    st, events = run_state(lab3, sid)
    assert st["state"] == "succeeded" and st["restarts"] == 1 and len(st["attempts"]) == 2, show(events)
    lost = [e for e in events if e["class"] == "node-lost"]
    assert lost and lost[0]["node"] == w2.ip and lost[0]["time"] - killed < 15
    assert any("restarted" in e["evidence"] and w2.ip in e["evidence"] for e in events)
    resubmitted = next(e["time"] for e in events if e["action"] == "watching the new attempt")
    print(f"\nWATCH-BENCH detect_s={lost[0]['time'] - killed:.1f} resubmitted_after_host_back_s="
          f"{resubmitted - back:.1f}")
    a, b = steps_by_attempt(ckpt)
    assert a == list(range(1, len(a) + 1))  # no step lost before the crash
    last_ckpt = (a[-1] // 3) * 3
    assert b == list(range(last_ckpt + 1, 15))  # resumed right after the newest checkpoint, each step once
    assert "Resuming from %s, setting global step to %d" % (ckpt / f"global_step_{last_ckpt}", last_ckpt) in out
    # the job's workers get the backend env `up` chose (NCCL takes "=eth0" as "exactly eth0"), and so does the
    # healed node's raylet itself: watch heals through bring_up, as the CLI's `up` starts it
    first, resumed = out[:out.rindex("starting")], out[out.rindex("starting"):]
    assert f"env {w2.ip} NCCL_SOCKET_IFNAME==eth0 GLOO_SOCKET_IFNAME=eth0" in first, first[-2000:]
    assert f"env {w2.ip} NCCL_SOCKET_IFNAME==eth0 GLOO_SOCKET_IFNAME=eth0" in resumed, resumed[:2000]
    healed = {k: raylet_env(w2.ip).get(k) for k in BACKEND_VARS}  # the old raylet died with its host
    assert all(after_up.values()) and healed == after_up, (after_up, healed)
    assert raylet_env(w1.ip).get("NCCL_SOCKET_IFNAME") == "=eth0"  # started by `up`
    assert raylet_env(w2.ip).get("NCCL_SOCKET_IFNAME") == "=eth0"  # restarted by watch
    assert any(e["action"] == "first step %d" % (last_ckpt + 1) and "resumed from step %d" % last_ckpt
               in e["evidence"] for e in events), show(events)


@pytest.mark.parametrize("form", ["command", "script"])
def test_every_submit_form_resumes(lab3, form):
    """`submit [key=value...] --watch -- python3 -m MODULE ...` and `submit SCRIPT.sh key=value --watch`: the run
    record keeps the form, so the resubmission after a failure runs the same command with resume on."""
    lab, path = lab3[0], lab3[1]
    ckpt = lab.dir / f"ckpt-form-{form}"
    words = ["trainer.total_training_steps=6", "trainer.save_freq=2", f"trainer.default_local_dir={ckpt}",
             "resumable.step_s=0.2", "resumable.oom_at=4"]
    pre = ["watch.backoff_s=0.2", "watch.max_restarts=2", f"env.PYTHONPATH={ROOT / 'launch'}"]
    if form == "command":
        r = cli(lab3, "submit", "-c", path, *pre, "--watch", "--", "python3", "-m", "resumable_job", *words)
    else:
        script = lab.dir / "run_resumable.sh"
        script.write_text(f"#!/bin/bash\nset -x\nexport PYTHONPATH={ROOT / 'launch'}\n"
                          f"python3 -m resumable_job {' '.join(words)} \"$@\"\n")
        r = cli(lab3, "submit", script, "-c", path, "watch.backoff_s=0.2", "watch.max_restarts=2", "--watch")
    assert r.returncode == 0, r.stderr[-3000:]
    st, events = run_state(lab3, first_sid(r.stderr))
    assert st["input"]["kind"] == form and st["state"] == "succeeded" and st["restarts"] == 1, show(events)
    assert [a["status"] for a in st["attempts"]] == ["FAILED", "SUCCEEDED"]
    assert st["attempts"][1]["resumed_from"] == 2 and st["attempts"][1]["first_step"] == 3
    a, b = steps_by_attempt(ckpt)
    assert a == [1, 2, 3] and b == [3, 4, 5, 6]


def test_watcher_killed_reattaches_without_duplicate(lab3):
    lab, path = lab3[0], lab3[1]
    j, ckpt = job(lab3, "reattach", steps=14, save_freq=3, step_s=0.4)
    r = cli(lab3, "submit", j, "-c", path, "--watch", "--detach", "--json")
    assert r.returncode == 0, r.stderr[-3000:]
    info = json.loads(r.stdout)
    sid, pid = info["run"], info["pid"]
    wait_for(lambda: (ckpt / "steps.log").exists(), 60, "the first step")
    second = cli(lab3, "watch", sid)  # one watcher per run
    assert second.returncode == 1 and "already watched" in second.stderr and f"pid {pid}" in second.stderr
    os.kill(pid, signal.SIGKILL)
    r = cli(lab3, "watch", sid)
    assert r.returncode == 0, r.stderr[-3000:]
    st, _ = run_state(lab3, sid)
    assert st["restarts"] == 0 and len(st["attempts"]) == 1 and st["state"] == "succeeded"
    jobs = json.loads(cli(lab3, "jobs", "-c", path, "--json").stdout)["clusters"][0]["jobs"]
    assert [x["submission_id"] for x in jobs if x["submission_id"].startswith(sid)] == [sid]
    (attempt,) = steps_by_attempt(ckpt)
    assert attempt == list(range(1, 15))


def test_fewer_nodes_refused_when_the_checkpoint_is_node_local(lab3):
    """Each rank saves its own files (verl's FSDP manager does; so does the stand-in, each on its node): with the
    checkpoint folder under each node's private /tmp, a node lost for good takes its ranks' files with it, and the
    run is not resubmitted on the nodes left — the error names the folder, what the head holds and the node gone."""
    lab, path, (head, w1, w2), _ = lab3
    ck = f"/tmp/ck-local-{lab.n}"
    j, _ = job(lab3, "localfew", steps=30, save_freq=2, step_s=0.4, rank_files=1,
               watch="  allow_fewer_nodes: true\n  node_wait_s: 4\n  node_grace_s: 1\n")
    j.write_text(j.read_text().replace("overrides:\n", f"overrides:\n  trainer.n_gpus_per_node: 1\n"
                                       f"  trainer.default_local_dir: {ck}\n", 1).replace(
        f"  trainer.default_local_dir: {lab.dir / 'ckpt-localfew'}\n", ""))
    p = popen_cli(lab3, "submit", j, "-c", path, "--watch")
    try:
        wait_for(lambda: head.run(["cat", f"{ck}/latest_checkpointed_iteration.txt"]).stdout.strip() not in ("", "0"),
                 90, "the first checkpoint")
        lab.stop(w2)  # for good: its /tmp (and the rank files in it) is gone with it
        out, err = p.communicate(timeout=240)
    finally:
        if p.poll() is None:
            p.kill()
        lab.start(w2)
    assert p.returncode != 0, err[-3000:]
    st, events = run_state(lab3, first_sid(err))
    assert len(st["attempts"]) == 1 and st["restarts"] == 0, show(events)  # never resubmitted
    refusals = [e for e in events if "is not storage every node reads" in e["action"] + e["evidence"]]
    assert refusals, show(events)
    text = refusals[0]["action"] + refusals[0]["evidence"]
    assert ck in text and w2.ip in text and "rank(s)" in text and f"on the head ({head.ip})" in text


def test_node_does_not_come_back_fewer_nodes(lab3):
    """3 nodes, one rank each, checkpoints saved per rank and world size as verl's FSDP manager does: a node lost
    for good, the run goes on on 2 from the newest checkpoint resharded for 2 ranks (without which it cannot load)."""
    lab, path, (head, w1, w2), _ = lab3
    j, ckpt = job(lab3, "fewer", steps=10, save_freq=2, step_s=0.4, rank_files=1,
                  watch="  allow_fewer_nodes: true\n  node_wait_s: 30\n  node_grace_s: 3\n")
    # the world as a user line states it: the resumed attempt must not ask for the node that is gone
    j.write_text(j.read_text().replace("overrides:\n", "overrides:\n  trainer.n_gpus_per_node: 1\n"
                                       "  trainer.nnodes: 3\n"))
    settle(lab3)  # a test before this one may have left w2 down, or its old registration listed alive
    p = popen_cli(lab3, "submit", j, "-c", path, "--watch")
    try:
        wait_for(lambda: (ckpt / "steps.log").exists() and len((ckpt / "steps.log").read_text().split("\n")) > 3,
                 90, "step 3")
        lab.stop(w2)  # and it stays down
        out, err = p.communicate(timeout=240)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 0, err[-4000:]
    st, events = run_state(lab3, first_sid(err))
    assert st["state"] == "succeeded" and st["restarts"] == 1 and st["nodes"] == 2, show(events)
    assert any(e["action"].startswith("continue on 2 node(s)") for e in events)
    grace = [e for e in events if "watch.node_grace_s" in e["action"]]  # a lost node gets its grace first
    assert grace and grace[0]["time"] < next(e["time"] for e in events if e["action"].startswith("continue on 2"))
    assert out.count("nodes 3") == 1 and out.count("nodes 2") == 1
    a, b = steps_by_attempt(ckpt)
    assert b[-1] == 10 and b[0] == (a[-1] // 2) * 2 + 1
    resumed_from = b[0] - 1
    assert any(e["action"].startswith("continue on 2 node(s)") and "resharded the newest checkpoint to 2 GPUs"
               in e["evidence"] + e["action"] for e in events), show(events)
    actor = ckpt / f"global_step_{resumed_from}" / "actor"
    assert (actor / "model_world_size_2_rank_1.pt").is_file() and (actor / "model_world_size_3_rank_2.pt").is_file()
    assert f"loaded {actor} on world size 2: every piece equal" in out + err
