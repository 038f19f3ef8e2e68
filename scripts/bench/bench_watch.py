#!/usr/bin/env python3
"""Watch benchmark: how fast `submit --watch` notices a lost node and has the run going again.

On namespace hosts (tests/harness/netns.py: head + 2 workers, real sshd, real Ray) this runs
launch/resumable_job.py under `verl-cluster submit --watch`, SIGKILLs one worker's whole host mid-run, brings
it back `--down-s` seconds later (sshd only, no Ray: `watch` heals it), and times, per repetition:

  * detect      fault -> the watcher's node-lost event (target <= 10 s);
  * ray_dead    fault -> Ray's own GCS marks the node dead (its health check; the peer: what a user
                watching `ray status` would see), and the ratio detect / ray_dead;
  * resumed     host back -> the resubmitted attempt RUNNING in the Jobs API (target <= 60 s);
  * the run's end state and restarts (1 expected).

Needs root. `--json-out FILE` writes every figure.

  sudo .venv/bin/python scripts/bench/bench_watch.py --reps 3 --json-out bench_watch.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from tests.harness import NetnsLab, integration_ready  # noqa: E402
from tests.harness.ray_cluster import running_cluster  # noqa: E402
from tests.harness.wait import wait_for  # noqa: E402


def write_job(lab: NetnsLab, name: str, steps: int) -> tuple[Path, Path]:
    ckpt = lab.dir / f"ckpt-{name}"
    p = lab.dir / f"{name}.yaml"
    p.write_text(f"name: {name}\ncommand: [python, resumable_job.py]\nlauncher: ray\n"
                 f"working_dir: {ROOT / 'launch'}\noverrides:\n"
                 f"  trainer.total_training_steps: {steps}\n  trainer.save_freq: 3\n"
                 f"  trainer.default_local_dir: {ckpt}\n  resumable.step_s: 0.5\n"
                 "watch:\n  backoff_s: 0.2\n  max_restarts: 2\n")
    return p, ckpt


def steps_done(ckpt: Path) -> int:
    f = ckpt / "steps.log"
    return len(f.read_text().splitlines()) if f.exists() else 0


class RayDeathClock(threading.Thread):
    """Polls the head's GCS until the registration of `ip` that was alive at the start is marked dead."""

    def __init__(self, spec, ip: str):
        super().__init__(daemon=True)
        from verl_cluster.watch.detect import NodeMonitor

        self.mon, self.ip, self.dead_at, self.stop_flag = NodeMonitor(spec), ip, None, False
        self.node_id = next(x.get("node_id") for x in self.mon._gcs_table() if x["ip"] == ip and x["alive"])

    def run(self) -> None:
        while not self.stop_flag and self.dead_at is None:
            try:
                for x in self.mon._gcs_table():
                    if x.get("node_id") == self.node_id and not x["alive"]:
                        self.dead_at = time.time()
            except Exception:  # noqa: BLE001 - the head is busy healing; look again
                pass
            time.sleep(0.25)
        self.mon.close()


def one_rep(lab: NetnsLab, path: Path, w2, k: int, home: Path, down_s: float) -> dict:
    from verl_cluster.config.cluster import load_cluster
    from verl_cluster.jobs import ray_jobs

    spec = load_cluster(path)
    j, ckpt = write_job(lab, f"bench{k}", steps=16)
    env = {**os.environ, "HOME": str(home), "COLUMNS": "200"}
    p = subprocess.Popen([sys.executable, "-m", "verl_cluster", "submit", str(j), "-c", str(path), "--watch"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=ROOT, env=env)
    try:
        wait_for(lambda: steps_done(ckpt) >= 5, 120, "step 5")
        clock = RayDeathClock(spec, w2.ip)
        clock.start()
        lab.stop(w2)
        killed = time.time()
        time.sleep(down_s)
        lab.start(w2)
        back = time.time()
        runs = home / ".verl-cluster"

        def events() -> list[dict]:
            out = []
            for f in runs.glob(f"*/runs/{j.stem}-*/events.jsonl"):
                out += [json.loads(x) for x in f.read_text().splitlines()]
            return out

        wait_for(lambda: any(e["action"] == "watching the new attempt" for e in events()), 180, "the resubmission")
        sid = next(e["submission_id"] for e in events() if e["action"] == "watching the new attempt")
        running = None
        with ray_jobs.connect(spec) as api:
            while running is None:
                if ray_jobs.job_info(api, sid).status in ("RUNNING", "SUCCEEDED"):
                    running = time.time()
                time.sleep(0.1)
        _, err = p.communicate(timeout=240)
        clock.stop_flag = True
        clock.join(5)
    finally:
        if p.poll() is None:
            p.kill()
    ev = events()
    lost = next(e for e in ev if e["class"] == "node-lost")
    st = json.loads(next(runs.glob(f"*/runs/{j.stem}-*/run.json")).read_text())
    detect = lost["time"] - killed
    ray_dead = (clock.dead_at - killed) if clock.dead_at else None
    return {"rc": p.returncode, "state": st["state"], "restarts": st["restarts"], "detect_s": round(detect, 2),
            "ray_dead_s": round(ray_dead, 2) if ray_dead else None,
            "detect_over_ray": round(detect / ray_dead, 3) if ray_dead else None,
            "resumed_after_back_s": round(running - back, 2), "down_s": down_s, "evidence": lost["evidence"]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--down-s", type=float, default=3.0, help="how long the killed host stays down")
    ap.add_argument("--json-out")
    a = ap.parse_args()
    why = integration_ready()
    if why:
        print(f"cannot run: {why}", file=sys.stderr)
        return 2
    import ray

    rows = []
    with NetnsLab("bw") as lab, tempfile.TemporaryDirectory() as home:
        head, w1, w2 = lab.add_host("head"), lab.add_host("w1"), lab.add_host("w2")
        with running_cluster(lab, head, [w1, w2], name=f"bw{lab.n}",
                             extra="network:\n  interface: eth0\n") as path:
            for k in range(a.reps):
                r = one_rep(lab, path, w2, k, Path(home), a.down_s)
                rows.append(r)
                print(f"rep {k + 1}: detect {r['detect_s']:.1f}s (Ray's GCS: {r['ray_dead_s']}s), "
                      f"RUNNING again {r['resumed_after_back_s']:.1f}s after the host was back; "
                      f"{r['state']}, {r['restarts']} restart(s)", flush=True)

    def med(key):
        xs = [r[key] for r in rows if r[key] is not None]
        return round(statistics.median(xs), 2) if xs else None

    summary = {"date": time.strftime("%Y-%m-%d"), "ray": ray.__version__, "cpus": os.cpu_count(), "reps": rows,
               "median_detect_s": med("detect_s"), "median_ray_dead_s": med("ray_dead_s"),
               "median_detect_over_ray": med("detect_over_ray"),
               "median_resumed_after_back_s": med("resumed_after_back_s")}
    print(f"median: detect {summary['median_detect_s']} s (target <= 10), Ray's GCS {summary['median_ray_dead_s']} s "
          f"(ratio {summary['median_detect_over_ray']}), RUNNING again {summary['median_resumed_after_back_s']} s "
          "after the host was back (target <= 60)")
    if a.json_out:
        Path(a.json_out).write_text(json.dumps(summary, indent=1))
    ok = all(r["state"] == "succeeded" for r in rows)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
