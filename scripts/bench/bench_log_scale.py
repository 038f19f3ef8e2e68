#!/usr/bin/env python3
"""Log-scale benchmark: what watching and following a job costs once its driver log is big (a long verl run's
steady state: verl's driver log carries every worker's output).

On a namespace host (tests/harness/netns.py: a head with real sshd and real Ray, reached through the SSH tunnel the
CLI opens) a job first writes SIZE MiB (worker-like lines with a verl step line every ~100 KB), prints a marker,
then a verl step line every --step-every seconds. Per log size and reader:

  * `verl-cluster watch JOB` and `verl-cluster logs JOB --follow` are started; attach = until each has caught up
    (the marker reached its output), measured apart;
  * before they start, --idle seconds of the head with nobody reading: its dashboard's and dashboard agent's CPU
    (process trees), the baseline;
  * then --window seconds of steady state: each reader's CPU per minute and RSS (steady: the largest VmRSS in the
    window; peak: VmHWM, the attach included), and the dashboard's and agent's CPU again;
  * then the job's driver is SIGKILLed: the watcher's `classified` event and the follower's exit, timed from the
    kill; --kill-reps - 1 more kills on fresh jobs of the same size with the watcher alone (the detection time
    varies with where in a poll the kill lands). Each job's log is removed from the head's /tmp after it.

`--peer` also runs the same with the code of a git commit (today's behaviour before the range reader: whole-log
polls, the log websocket from byte 0), unpacked with `git archive` into a temporary folder, at sizes up to
--peer-max MiB.

Needs root. `--json-out FILE` writes every figure.

  sudo .venv/bin/python scripts/bench/bench_log_scale.py --sizes 10,200,2048 --peer 4168cad --json-out bench.json
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from tests.harness import NetnsLab, integration_ready  # noqa: E402
from tests.harness.ray_cluster import running_cluster  # noqa: E402

MARKER = "BIGLOG DONE"
JOB = r'''
import random, sys, time
size, every, tag = int(float(sys.argv[1]) * 2**20), float(sys.argv[2]), sys.argv[3]
rnd = random.Random(0)
KEYS = ["timing_s/gen", "timing_s/old_log_prob", "timing_s/ref", "timing_s/adv", "timing_s/update_actor",
        "timing_s/update_weights", "timing_s/step", "timing_s/save_checkpoint", "perf/total_num_tokens",
        "perf/throughput", "perf/max_memory_allocated_gb", "perf/max_memory_reserved_gb", "perf/cpu_memory_used_gb",
        "actor/pg_loss", "actor/entropy", "actor/grad_norm", "actor/lr", "actor/ppo_kl", "actor/pg_clipfrac",
        "critic/score/mean", "critic/score/max", "critic/rewards/mean", "critic/advantages/mean",
        "response_length/mean", "response_length/max", "response_length/clip_ratio", "prompt_length/mean",
        "prompt_length/max", "timing_per_token_ms/gen", "timing_per_token_ms/update_actor"]
filler = "".join(f"(WorkerDict pid=4242) INFO worker.py:{i} -- rollout micro batch {i} done in {rnd.random():.4f}s, "
                 f"tokens={rnd.randint(100, 9999)}\n" for i in range(800))
def step(n):
    return f"(TaskRunner pid=4711) step:{n} - " + " - ".join(f"{k}:{rnd.uniform(0.1, 500):.4f}" for k in KEYS) + "\n"
written, n = 0, 0
while written < size:
    n += 1
    block = filler + step(n)
    sys.stdout.write(block)
    written += len(block)
sys.stdout.write(f"{tag} BIGLOG DONE\n")
sys.stdout.flush()
while True:
    time.sleep(every)
    n += 1
    sys.stdout.write(step(n))
    sys.stdout.flush()
'''


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def status_kib(pid: int, key: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    return 0


def tree(pid: int) -> list[int]:
    """pid and its descendants."""
    kids: dict[int, list[int]] = {}
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                ppid = int(p.joinpath("stat").read_text().rpartition(")")[2].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            kids.setdefault(ppid, []).append(int(p.name))
    out, todo = [], [pid]
    while todo:
        x = todo.pop()
        out.append(x)
        todo += kids.get(x, [])
    return out


def tree_cpu(pid: int) -> float:
    total = 0.0
    for p in tree(pid):
        try:
            total += cpu_s(p)
        except (OSError, IndexError, ValueError):
            pass
    return total


def find_pids(*needles: str) -> list[int]:
    out = []
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                cmd = p.joinpath("cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if all(n in cmd for n in needles):
                out.append(int(p.name))
    return out


def tail_has(path: Path, text: str, nbytes: int = 1 << 20) -> bool:
    try:
        with open(path, "rb") as f:
            f.seek(max(0, f.seek(0, 2) - nbytes))
            return text.encode() in f.read()
    except OSError:
        return False


def wait(pred, timeout: float, what: str, step: float = 0.2):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = pred()
        if got:
            return got
        time.sleep(step)
    raise TimeoutError(f"waited {timeout:g}s for {what}")


def submit(lab, path: Path, size_mb: float, impl: str, home: Path, a) -> tuple[str, str, Path, float, int]:
    """(submission id, tag, the job script, seconds to write the big part, the log's size once written)."""
    from verl_cluster.config.cluster import load_cluster
    from verl_cluster.verl_logs import job_log
    from verl_cluster.jobs import ray_jobs

    tag = f"bl{int(size_mb)}{impl}{int(time.time() * 10) % 1000000}"
    script = lab.dir / "biglog_job.py"
    script.write_text(JOB)
    job = lab.dir / f"{tag}.yaml"
    job.write_text(f"name: {tag}\ncommand: [{sys.executable}, {script}, '{size_mb}', '{a.step_every}', {tag}]\n"
                   f"launcher: ray\noverrides:\n  trainer.default_local_dir: {lab.dir}/ckpt-{tag}\n"
                   "watch:\n  max_restarts: 0\n  hang_after: 1h\n")
    env = {**os.environ, "HOME": str(home), "COLUMNS": "200"}
    r = subprocess.run([sys.executable, "-m", "verl_cluster", "submit", str(job), "-c", str(path), "--no-follow",
                        "--skip-preflight", "--json"], capture_output=True, text=True, cwd=ROOT, env=env, timeout=300)
    if r.returncode != 0:
        raise RuntimeError(f"submit failed: {r.stderr[-500:]}")
    sid = json.loads(r.stdout)["submission_id"]
    t0 = time.monotonic()
    with ray_jobs.connect(load_cluster(path)) as api:
        src = job_log.AgentLog(api, sid)
        wait(lambda: MARKER.encode() in (src.last(1 << 20)[0] or b""), 3600, f"the job to write {size_mb} MiB")
        size = src.last(1)[1]
    return sid, tag, script, time.monotonic() - t0, size


def start(name: str, argv: list[str], out: Path, impl: str, code: Path, home: Path) -> subprocess.Popen:
    env = {**os.environ, "HOME": str(home), "COLUMNS": "200"}
    cwd = ROOT
    if impl != "new":
        env["PYTHONPATH"], cwd = str(code), code
    return subprocess.Popen([sys.executable, "-m", "verl_cluster", *argv], stdout=open(out / f"{name}.out", "wb"),
                            stderr=open(out / f"{name}.err", "wb"), cwd=cwd, env=env)


def attach(procs: dict, out: Path, tag: str, timeout: float) -> dict[str, float]:
    """Seconds until each reader's output holds the marker (it has caught up with the log written before it)."""
    t0, done = time.monotonic(), {}
    while len(done) < len(procs):
        for name, p in procs.items():
            if name in done:
                continue
            if tail_has(out / f"{name}.out", f"{tag} {MARKER}"):
                done[name] = time.monotonic() - t0
            elif p.poll() is not None:
                raise RuntimeError(f"{name} exited {p.returncode}: {(out / f'{name}.err').read_text()[-800:]}")
        if time.monotonic() - t0 > timeout:
            raise TimeoutError(f"readers not caught up after {timeout:g}s: {sorted(set(procs) - set(done))}")
        time.sleep(0.2)
    return done


def kill_job(script: Path, tag: str) -> float:
    for v in find_pids(str(script), tag):
        os.kill(v, signal.SIGKILL)
    return time.time()


def classified(events: Path):
    try:
        rows = [json.loads(x) for x in events.read_text().splitlines()]
    except (OSError, ValueError):
        return None
    return next((e for e in rows if e.get("action") == "classified"), None)


def cleanup(path: Path, sid: str, procs: dict, home: Path) -> None:
    """The readers stopped, the job stopped, its driver log removed from the head's /tmp (a tmpfs)."""
    from verl_cluster.config.cluster import load_cluster
    from verl_cluster.launchers import runner_for

    for p in procs.values():
        if p.poll() is None:
            p.kill()
        p.wait()
    subprocess.run([sys.executable, "-m", "verl_cluster", "stop", sid, "-c", str(path)], capture_output=True,
                   cwd=ROOT, env={**os.environ, "HOME": str(home)}, timeout=120)
    spec = load_cluster(path)
    runner = runner_for(spec, spec.head)
    try:
        runner.run(["sh", "-c", f"rm -f {spec.temp_dir}/session_latest/logs/job-driver-{sid}.log"], timeout=60)
    finally:
        runner.close()


def one(lab, path: Path, size_mb: float, impl: str, code: Path, home: Path, a) -> dict:
    """Attach, steady state, a kill: the watcher and the follower on one job."""
    from verl_cluster.config.cluster import load_cluster

    spec = load_cluster(path)
    head_dash = find_pids("dashboard/dashboard.py", f"/{spec.cluster_name}")
    head_agent = find_pids("dashboard/agent.py", f"/{spec.cluster_name}")

    def dash_cpu() -> tuple[float, float]:
        return sum(tree_cpu(x) for x in head_dash), sum(tree_cpu(x) for x in head_agent)

    sid, tag, script, wrote_s, size = submit(lab, path, size_mb, impl, home, a)
    res: dict = {"size_mib": size_mb, "log_bytes": size, "impl": impl, "sid": sid, "wrote_s": round(wrote_s, 1)}
    d0, t_idle = dash_cpu(), time.monotonic()
    time.sleep(a.idle)  # the head with the job running and nobody reading its log
    d1 = dash_cpu()
    idle = time.monotonic() - t_idle
    res["dashboard_idle_cpu_per_min_s"] = round((d1[0] - d0[0]) / idle * 60, 2)
    res["agent_idle_cpu_per_min_s"] = round((d1[1] - d0[1]) / idle * 60, 2)
    out = lab.dir / tag
    out.mkdir()
    procs = {"watch": start("watch", ["watch", sid, "-c", str(path)], out, impl, code, home),
             "follow": start("follow", ["logs", sid, "-c", str(path), "--follow"], out, impl, code, home)}
    try:
        for name, t in attach(procs, out, tag, a.attach_timeout).items():
            res[f"{name}_attach_s"] = round(t, 1)
            res[f"{name}_attach_cpu_s"] = round(cpu_s(procs[name].pid), 1)
        time.sleep(2)  # past the attach's last poll
        c0 = {n: cpu_s(p.pid) for n, p in procs.items()}
        d0 = dash_cpu()
        rss = {n: 0 for n in procs}
        t_w = time.monotonic()
        while time.monotonic() - t_w < a.window:
            for n, p in procs.items():
                rss[n] = max(rss[n], status_kib(p.pid, "VmRSS"))
            time.sleep(1.0)
        span = time.monotonic() - t_w
        for n, p in procs.items():
            res[f"{n}_cpu_per_min_s"] = round((cpu_s(p.pid) - c0[n]) / span * 60, 2)
            res[f"{n}_rss_steady_mib"] = round(rss[n] / 1024, 1)
            res[f"{n}_rss_peak_mib"] = round(status_kib(p.pid, "VmHWM") / 1024, 1)
        d1 = dash_cpu()
        res["dashboard_cpu_per_min_s"] = round((d1[0] - d0[0]) / span * 60, 2)
        res["agent_cpu_per_min_s"] = round((d1[1] - d0[1]) / span * 60, 2)
        t_kill = kill_job(script, tag)
        events = home / ".verl-cluster" / spec.cluster_name / "runs" / sid / "events.jsonl"
        ev = wait(lambda: classified(events), 300, "the watcher's classified event")
        res["detect_s"] = [round(ev["time"] - t_kill, 2)]
        res["watch_class"] = ev["class"]
        wait(lambda: procs["follow"].poll() is not None, 300, "the follower to end")
        res["follow_end_s"] = round(time.time() - t_kill, 2)
    finally:
        cleanup(path, sid, procs, home)
        for f in out.glob("*.out"):
            f.unlink()  # up to the log's size each: not kept
    return res


def detect_only(lab, path: Path, size_mb: float, impl: str, code: Path, home: Path, a) -> float:
    """One more kill: the watcher alone attaches, then the job's driver is killed; seconds to `classified`."""
    from verl_cluster.config.cluster import load_cluster

    spec = load_cluster(path)
    sid, tag, script, _, _ = submit(lab, path, size_mb, impl, home, a)
    out = lab.dir / tag
    out.mkdir()
    procs = {"watch": start("watch", ["watch", sid, "-c", str(path)], out, impl, code, home)}
    try:
        attach(procs, out, tag, a.attach_timeout)
        time.sleep(2 + (time.time() % 1))  # the kill lands anywhere in a poll period
        t_kill = kill_job(script, tag)
        events = home / ".verl-cluster" / spec.cluster_name / "runs" / sid / "events.jsonl"
        return round(wait(lambda: classified(events), 300, "the watcher's classified event")["time"] - t_kill, 2)
    finally:
        cleanup(path, sid, procs, home)
        for f in out.glob("*.out"):
            f.unlink()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="10,200,2048", help="log sizes in MiB, comma-separated")
    ap.add_argument("--window", type=float, default=60.0, help="seconds of steady state measured")
    ap.add_argument("--step-every", type=float, default=5.0, help="seconds between step lines after the big part")
    ap.add_argument("--peer", help="a git commit whose code runs as the peer (today's behaviour)")
    ap.add_argument("--peer-max", type=float, default=200.0, help="largest size (MiB) the peer is run at")
    ap.add_argument("--attach-timeout", type=float, default=1800.0)
    ap.add_argument("--idle", type=float, default=30.0, help="seconds the head is measured with nobody reading")
    ap.add_argument("--kill-reps", type=int, default=3, help="kills per size and reader (the first after the window)")
    ap.add_argument("--json-out")
    a = ap.parse_args()
    why = integration_ready()
    if why:
        print(f"cannot run: {why}", file=sys.stderr)
        return 2
    import ray

    rows = []
    with NetnsLab("bl") as lab, tempfile.TemporaryDirectory() as home, tempfile.TemporaryDirectory() as peer:
        if a.peer:
            subprocess.run(f"git -C {ROOT} archive {a.peer} | tar -x -C {peer}", shell=True, check=True)
        head = lab.add_host("head")
        with running_cluster(lab, head, [], name=f"blog{lab.n}") as path:
            for size in [float(x) for x in a.sizes.split(",")]:
                impls = ["new"] + (["peer"] if a.peer and size <= a.peer_max else [])
                for impl in impls:
                    try:
                        r = one(lab, path, size, impl, Path(peer), Path(home), a)
                        for _ in range(a.kill_reps - 1):
                            r["detect_s"].append(detect_only(lab, path, size, impl, Path(peer), Path(home), a))
                        r["detect_median_s"] = statistics.median(r["detect_s"])
                    except Exception as e:  # noqa: BLE001 - one size's failure is that row's, the others still run
                        r = {"size_mib": size, "impl": impl, "error": f"{type(e).__name__}: {e}"[:600]}
                    rows.append(r)
                    print(json.dumps(r), flush=True)
    summary = {"date": time.strftime("%Y-%m-%d %H:%M"), "ray": ray.__version__, "cpus": os.cpu_count(),
               "peer": a.peer, "window_s": a.window, "step_every_s": a.step_every, "rows": rows}
    if a.json_out:
        Path(a.json_out).write_text(json.dumps(summary, indent=1))
    return 0 if all("error" not in r for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
