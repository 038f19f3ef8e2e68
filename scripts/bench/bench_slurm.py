#!/usr/bin/env python3
"""`verl-cluster up` inside a 3-node Slurm allocation vs over SSH on the same hosts.

Namespace hosts (tests/harness/netns.py: real sshd, real Ray) running a real Slurm (tests/harness/slurm.py:
slurmctld on the first host, one slurmd per host, munge). One `salloc -N 3 -c 2` holds the allocation; its
shell's environment is what the Slurm-mode commands run with. Each repetition runs, in turn (interleaved, so
both see the same background load), as a user would (fresh processes):

  * `verl-cluster up -c SSH.yaml [--no-check] --json`   over SSH (paramiko) to the three hosts
  * `verl-cluster up --slurm [--no-check] --json`       through srun, Ray held by one step per node

with `down` after each. Both clusters use the same Ray settings (object store 200 MiB, token auth); the ratio
is Slurm over SSH from the same run. Needs root.

  sudo .venv/bin/python scripts/bench/bench_slurm.py --reps 3 --json-out /var/tmp/bench_slurm.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts" / "bench"))
from bench_up import private_state_dirs  # noqa: E402
from tests.harness import NetnsLab, integration_ready  # noqa: E402
from tests.harness.slurm import SlurmLab, slurm_ready  # noqa: E402

OBJECT_STORE = "ray.object_store_memory=209715200"


def cli(args: list[str], env: dict, timeout: float = 300) -> tuple[float, subprocess.CompletedProcess]:
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "verl_cluster", *args], capture_output=True, text=True,
                       timeout=timeout, cwd=ROOT, env=env)
    return time.monotonic() - t0, r


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--json-out")
    a = ap.parse_args()
    why = integration_ready() or slurm_ready()
    if why:
        print(f"cannot run: {why}", file=sys.stderr)
        return 2
    results: dict[str, list[float]] = {}
    with NetnsLab() as lab:
        hosts = [lab.add_host(f"b{i}") for i in range(3)]
        private_state_dirs(lab, hosts)
        sl = SlurmLab(lab, hosts)
        envf = lab.dir / "alloc.env"
        slurm_env: dict[str, str] = {}
        salloc = subprocess.Popen(["salloc", "-N", "3", "-c", "2", "--", "sh", "-c",
                                   f"env > {envf}.tmp && mv {envf}.tmp {envf}; exec cat > /dev/null"],
                                  env={**os.environ, **sl.env}, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL)  # holds the allocation until its stdin closes
        try:
            for _ in range(300):
                if envf.exists():
                    break
                time.sleep(0.1)
            slurm_env = dict(line.split("=", 1) for line in envf.read_text().splitlines() if "=" in line)
            ssh_cfg = lab.cluster_yaml(hosts[0], hosts[1:], name=f"bssh{lab.n}")
            ssh_env = dict(os.environ)
            variants = {
                "ssh up": (["up", "-c", str(ssh_cfg), OBJECT_STORE, "--json"], ["down", "-c", str(ssh_cfg)], ssh_env),
                "slurm up": (["up", "--slurm", OBJECT_STORE, "--json"], ["down", "--slurm"], slurm_env),
                "ssh up --no-check": (["up", "-c", str(ssh_cfg), OBJECT_STORE, "--no-check", "--json"],
                                      ["down", "-c", str(ssh_cfg)], ssh_env),
                "slurm up --no-check": (["up", "--slurm", OBJECT_STORE, "--no-check", "--json"], ["down", "--slurm"],
                                        slurm_env),
            }
            for rep in range(a.reps):
                for name, (up_args, down_args, env) in variants.items():
                    secs, r = cli(up_args, env)
                    rep_ok = r.returncode == 0 and json.loads(r.stdout).get("healthy")
                    _, d = cli(down_args, env)
                    if not rep_ok or d.returncode != 0:
                        print(f"{name} rep {rep}: FAILED\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}\n{d.stdout[-1000:]}",
                              file=sys.stderr)
                        return 1
                    results.setdefault(name, []).append(secs)
                    print(f"rep {rep} {name}: {secs:.2f}s", flush=True)
        finally:
            if slurm_env:
                subprocess.run(["scancel", slurm_env.get("SLURM_JOB_ID", "0")], env={**os.environ, **sl.env},
                               capture_output=True, timeout=30)
            salloc.stdin.close()
            salloc.wait(30)
            sl.close()
    med = {k: statistics.median(v) for k, v in results.items()}
    print("\n| what (3 nodes) | median s | min–max s |\n|---|---|---|")
    for k, v in results.items():
        print(f"| `{k}` | {med[k]:.2f} | {min(v):.2f}–{max(v):.2f} |")
    for suffix in ("", " --no-check"):
        print(f"ratio slurm/ssh{suffix}: {med['slurm up' + suffix] / med['ssh up' + suffix]:.2f}")
    if a.json_out:
        Path(a.json_out).write_text(json.dumps({"date": time.strftime("%Y-%m-%d %H:%M"), "nproc": os.cpu_count(),
                                                "load": os.getloadavg(), "results": results, "median": med}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
