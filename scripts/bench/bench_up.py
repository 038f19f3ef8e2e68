#!/usr/bin/env python3
"""Cluster start-up benchmark: `verl-cluster up` vs Ray's own cluster launcher.

On namespace hosts (tests/harness/netns.py: real sshd, real Ray, one PID namespace and private /tmp per
host; this script also gives each host its own ~/.verl-cluster, see private_state_dirs) this times, as a
user would run them (fresh processes):

  * `verl-cluster up CFG --json` for head+2 and head+6 workers (default `--workers 2,6`), `--reps` times
    each, with `verl-cluster down` between; plus the no-op `up` on the healthy cluster right after;
  * `ray up -y --no-config-cache CONFIG` with `provider: {type: local, head_ip, worker_ips}` over the same
    sshd hosts (head+2 by default, `--ray-workers`), timed until the head's GCS lists every node ALIVE
    (a poller inside the head host), limit `--ray-limit` s; `ray down` plus `ray stop` inside each
    namespace host (confined by its PID namespace) between repetitions.

Ray's launcher passes `-o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null` to every ssh it runs
(local and on the head, for the workers); this script gives it an `ssh` wrapper, first on PATH, that drops
those two options and checks host keys against the lab's known_hosts instead, so both tools run with
host-key checking on. `ray up` runs with its own temporary HOME. Token auth is on for both (Ray's launcher:
the token goes to every node through `file_mounts`, `RAY_AUTH_MODE=token` on every `ray start`).

Needs root (network namespaces). Prints a table; `--json-out FILE` writes everything measured.

  sudo /work/venv/bin/python scripts/bench/bench_up.py --reps 3 --workers 2,6 --json-out bench_up.json
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


sys.path.insert(0, str(ROOT))  # tests/ is a regular package, so it wins over a site-packages `tests`
from tests.harness import Host, NetnsLab, integration_ready  # noqa: E402

BIN = Path(sys.executable).parent
VERL_CLUSTER = str(BIN / "verl-cluster")
RAY = str(BIN / "ray")
PY = sys.executable
OBJECT_STORE = 209715200  # same as the harness's cluster.yaml, on both sides
RAY_TOKEN_ON_NODE = "/tmp/vcb-ray-token"  # /tmp is private per namespace host

SSH_WRAPPER = """#!/bin/bash
# bench_up: Ray's launcher disables host-key checking on the ssh command line; keep it on, against
# the lab's known_hosts (only for the processes this benchmark starts: this file is first on their PATH).
out=()
while [ $# -gt 0 ]; do
  if [ "$1" = "-o" ] && [[ "${2-}" == StrictHostKeyChecking=* || "${2-}" == UserKnownHostsFile=* ]]; then
    shift 2; continue
  fi
  out+=("$1"); shift
done
exec /usr/bin/ssh -o StrictHostKeyChecking=yes -o UserKnownHostsFile=%(known_hosts)s "${out[@]}"
"""

# Runs inside the head host: wait until the GCS lists `want` ALIVE nodes, print one JSON line per change.
GCS_POLLER = """
import json, sys, time
want, addr, limit = int(sys.argv[1]), sys.argv[2], float(sys.argv[3])
from ray._raylet import GcsClient
t0 = time.monotonic(); last = None; client = None
while time.monotonic() - t0 < limit:
    try:
        client = client or GcsClient(address=addr)
        nodes = client.get_all_node_info(timeout=2)
        alive = sorted(i.node_manager_address for i in nodes.values() if i.state == 0)
    except Exception as e:
        client, alive = None, None
    if alive is not None and alive != last:
        last = alive
        print(json.dumps({"t": round(time.monotonic() - t0, 2), "alive": alive}), flush=True)
        if len(alive) >= want:
            sys.exit(0)
    time.sleep(0.25)
sys.exit(3)
"""


# ---------------------------------------------------------------- small helpers


@dataclass
class Timed:
    seconds: float
    rc: int | None  # None: timed out (killed)
    stdout: str = ""
    stderr: str = ""


def run_timed(argv: list[str], timeout: float, env: dict | None = None, log: Path | None = None) -> Timed:
    """Run argv as a fresh process in its own session; kill its whole group on timeout."""
    t0 = time.monotonic()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            stdin=subprocess.DEVNULL, env=env, start_new_session=True)
    try:
        so, se = proc.communicate(timeout=timeout)
        rc = proc.returncode
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        so, se = proc.communicate()
        rc = None
    dt = time.monotonic() - t0
    if log:
        log.write_text(f"$ {shlex.join(argv)}\n# rc={rc} {dt:.2f}s\n--- stdout\n{so}\n--- stderr\n{se}\n")
    return Timed(dt, rc, so, se)


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # the group of a process we started (start_new_session)
    except ProcessLookupError:
        pass


def load_snapshot() -> dict:
    la = os.getloadavg()
    mine = 0
    try:
        ns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=10).stdout
        mine = len([ln for ln in ns.splitlines() if ln.strip()])
    except Exception:
        pass
    return {"time": time.strftime("%H:%M:%S"), "load1": la[0], "load5": la[1], "load15": la[2], "netns_total": mine}


def stats(xs: list[float]) -> dict:
    return ({"median": round(statistics.median(xs), 2), "min": round(min(xs), 2), "max": round(max(xs), 2),
             "n": len(xs)} if xs else {"median": None, "min": None, "max": None, "n": 0})


def say(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


# ---------------------------------------------------------------- verl-cluster up


OURS_VARIANTS = {"default": [], "no-check": ["--no-check"]}


def bench_ours(lab: NetnsLab, hosts: list[Host], n_workers: int, reps: list[int], outdir: Path,
               res: dict | None = None, variant: str = "default") -> dict:
    """Time `verl-cluster up` for the repetitions `reps`, adding to `res` (the result of earlier calls)."""
    name = f"vcb{lab.n}w{n_workers}"
    cfg = lab.dir / f"{name}.yaml"
    extra = OURS_VARIANTS[variant]
    if res is None:
        if not cfg.exists():
            cfg = lab.cluster_yaml(hosts[0], hosts[1:1 + n_workers], name=name)
        res = {"workers": n_workers, "variant": variant, "extra_args": extra, "config": str(cfg),
               "config_text": cfg.read_text(), "runs": [], "noop_runs": [], "failures": []}
    name = f"{name}-{variant}"
    for rep in reps:
        d = run_timed([VERL_CLUSTER, "down", str(cfg)], 120, log=outdir / f"{name}-r{rep}-predown.log")
        t = run_timed([VERL_CLUSTER, "up", str(cfg), "--json", *extra], 300, log=outdir / f"{name}-r{rep}-up.log")
        report = _json_tail(t.stdout)
        healthy = bool(report and report.get("healthy")) and t.rc == 0
        actions = [n.get("action") for n in (report or {}).get("nodes", [])]
        run = {"rep": rep, "seconds": round(t.seconds, 2), "rc": t.rc, "healthy": healthy, "actions": actions,
               "report_seconds": (report or {}).get("seconds"),  # inside up() only
               "check_seconds": ((report or {}).get("check") or {}).get("seconds"),
               "node_seconds": {n["host"]: n.get("seconds") for n in (report or {}).get("nodes", [])}}
        say(f"verl-cluster up {shlex.join(extra)} head+{n_workers} rep {rep}: {t.seconds:.2f}s rc={t.rc} "
            f"healthy={healthy} (in up(): {run['report_seconds']}s, check: {run['check_seconds']}s) {actions}")
        if healthy:
            res["runs"].append(run)
            noop = run_timed([VERL_CLUSTER, "up", str(cfg), "--json", *extra], 120,
                             log=outdir / f"{name}-r{rep}-noop.log")
            nrep = _json_tail(noop.stdout) or {}
            nacts = [n.get("action") for n in nrep.get("nodes", [])]
            ok = noop.rc == 0 and all(a == "kept" for a in nacts)
            say(f"  no-op up: {noop.seconds:.2f}s rc={noop.rc} {nacts}")
            (res["noop_runs"] if ok else res["failures"]).append(
                {"rep": rep, "seconds": round(noop.seconds, 2), "rc": noop.rc, "actions": nacts, "noop": True})
        else:
            run["stderr_tail"] = t.stderr[-2000:]
            res["failures"].append(run)
        d = run_timed([VERL_CLUSTER, "down", str(cfg)], 120, log=outdir / f"{name}-r{rep}-down.log")
        if d.rc != 0:
            say(f"  down rc={d.rc} (see {outdir}/{name}-r{rep}-down.log)")
    res["stats"] = stats([r["seconds"] for r in res["runs"]])
    res["noop_stats"] = stats([r["seconds"] for r in res["noop_runs"]])
    return res


def _json_tail(text: str) -> dict | None:
    text = text.strip()
    if not text:
        return None
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        i = text.find("{")
        try:
            return json.loads(text[i:]) if i >= 0 else None
        except json.JSONDecodeError:
            return None


# ---------------------------------------------------------------- ray up (Ray's cluster launcher)

# Configurations of Ray's launcher that were tried. "v2-default": Ray 2.60's defaults (autoscaler v2) with
# only what namespace hosts strictly need (absolute `ray`, --node-ip-address: no default route).
# "v1": autoscaler v1 (`RAY_enable_autoscaler_v2=0`), the configuration of DESIGN.md's measurement.
# "v1-fast": v1 plus the launcher's own tuning knobs: autoscaler update and SSH-retry intervals 1 s
# (default 5 s), upscaling_speed 100, no `ray stop` before `ray start` (the nodes are clean).
RAY_CONFIGS = {
    "v2-default": {"v2": True, "stop_first": True, "env": {}, "upscaling_speed": 1.0},
    "v1": {"v2": False, "stop_first": True, "env": {}, "upscaling_speed": 1.0},
    "v1-fast": {"v2": False, "stop_first": False, "upscaling_speed": 100.0,
                "env": {"AUTOSCALER_UPDATE_INTERVAL_S": "1", "AUTOSCALER_NODE_SSH_INTERVAL_S": "1"}},
}


def ray_config(lab: NetnsLab, head: Host, workers: list[Host], name: str, kind: str, shim: Path,
               token: Path) -> str:
    c = RAY_CONFIGS[kind]
    env = {"PATH": f"{shim}:{BIN}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
           "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": RAY_TOKEN_ON_NODE, **c["env"]}
    if not c["v2"]:
        env["RAY_enable_autoscaler_v2"] = "0"
    exports = "export " + " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items()) + "; "
    node_ip = "$(hostname -I | cut -d' ' -f1)"  # the worker command is shared by all workers
    common = f"--object-store-memory {OBJECT_STORE} --disable-usage-stats"
    stop = [exports + f"{RAY} stop"] if c["stop_first"] else []
    head_cmds = stop + [exports + f"ulimit -c unlimited; {RAY} start --head --port=6379 "
                        f"--autoscaling-config=~/ray_bootstrap_config.yaml --node-ip-address={head.ip} {common}"]
    worker_cmds = stop + [exports + f"{RAY} start --address=$RAY_HEAD_IP:6379 --node-ip-address={node_ip} {common}"]
    cfg = {
        "cluster_name": name,
        "provider": {"type": "local", "head_ip": head.ip, "worker_ips": [w.ip for w in workers]},
        "auth": {"ssh_user": "root", "ssh_private_key": str(lab.client_key)},
        "min_workers": len(workers), "max_workers": len(workers),
        "upscaling_speed": c["upscaling_speed"], "idle_timeout_minutes": 5,
        "file_mounts": {RAY_TOKEN_ON_NODE: str(token)},
        "setup_commands": [], "head_setup_commands": [], "worker_setup_commands": [],
        "head_start_ray_commands": head_cmds, "worker_start_ray_commands": worker_cmds,
    }
    return json.dumps(cfg, indent=2)  # JSON is YAML


def bench_ray_up(lab: NetnsLab, hosts: list[Host], n_workers: int, kind: str, reps: list[int], limit: float,
                 outdir: Path, res: dict | None = None) -> dict:
    """Time `ray up` until all nodes registered, for the repetitions `reps`, adding to `res`."""
    head, workers = hosts[0], hosts[1:1 + n_workers]
    base = lab.dir / "rayup"
    shim, home = base / "bin", base / "home"
    shim.mkdir(parents=True, exist_ok=True)
    (home / ".ssh").mkdir(parents=True, exist_ok=True, mode=0o700)
    (shim / "ssh").write_text(SSH_WRAPPER % {"known_hosts": lab.known_hosts})
    os.chmod(shim / "ssh", 0o755)
    token = base / "token"
    if not token.exists():
        token.write_text(subprocess.run([PY, "-c", "import secrets;print(secrets.token_hex(32))"],
                                        capture_output=True, text=True, check=True).stdout)
        os.chmod(token, 0o600)
    env = {"HOME": str(home), "PATH": f"{shim}:{BIN}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
           "LANG": os.environ.get("LANG", "C.UTF-8"), "RAY_USAGE_STATS_ENABLED": "0"}
    res = res or {"workers": n_workers, "config_kind": kind, "runs": [], "failures": []}
    for rep in reps:
        name = f"vcb{lab.n}-{kind}-w{n_workers}-r{rep}"  # fresh launcher state per repetition
        cfgp = outdir / f"{name}.yaml"
        cfgp.write_text(ray_config(lab, head, workers, name, kind, shim, token))
        if "config" not in res:
            res["config"] = json.loads(cfgp.read_text())
        for h in [head] + workers:  # start clean: no Ray in any of these hosts (PID namespace: confined)
            h.run([RAY, "stop", "--force"], timeout=60)
        poller = subprocess.Popen(
            ["nsenter", "-t", str(head.init_pid), "-n", "-p", "-m", "--", PY, "-c", GCS_POLLER,
             str(1 + n_workers), f"{head.ip}:6379", str(limit)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
            env={**os.environ, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": RAY_TOKEN_ON_NODE})
        time.sleep(1.5)  # let the poller import ray before the clock starts (it cannot see the GCS yet)
        t0 = time.monotonic()
        up = subprocess.Popen([RAY, "up", "-y", "--no-config-cache", str(cfgp)], env=env,
                              stdout=open(outdir / f"{name}-up.log", "w"), stderr=subprocess.STDOUT,
                              stdin=subprocess.DEVNULL, start_new_session=True)
        up_rc, up_s, all_s, progress = None, None, None, []
        while time.monotonic() - t0 < limit:
            if up_rc is None and up.poll() is not None:
                up_rc, up_s = up.returncode, time.monotonic() - t0
                if up_rc != 0:
                    break
            if poller.poll() is not None:
                if poller.returncode == 0:
                    all_s = time.monotonic() - t0
                break
            time.sleep(0.05)
        if up.poll() is None and up_rc is None:
            try:
                up.wait(max(1.0, limit - (time.monotonic() - t0)))
                up_rc, up_s = up.returncode, time.monotonic() - t0
            except subprocess.TimeoutExpired:
                _kill_group(up)
                up.wait()
        _kill_group(poller)
        so, se = poller.communicate()
        progress = [json.loads(ln) for ln in so.splitlines() if ln.startswith("{")]
        run = {"rep": rep, "seconds": round(all_s, 2) if all_s else None,
               "ray_up_returned_s": round(up_s, 2) if up_s else None, "ray_up_rc": up_rc,
               "registration_progress": progress}
        say(f"ray up [{kind}] head+{n_workers} rep {rep}: all registered "
            f"{'%.2fs' % all_s if all_s else 'NOT within %.0fs' % limit}; `ray up` returned "
            f"{'%.2fs' % up_s if up_s else '-'} rc={up_rc}; alive counts {[len(p['alive']) for p in progress]}")
        if all_s:
            res["runs"].append(run)
        else:
            run["poller_stderr"] = se[-1500:]
            res["failures"].append(run)
        d = run_timed([RAY, "down", "-y", str(cfgp)], 120, env=env, log=outdir / f"{name}-down.log")
        if d.rc != 0:
            say(f"  ray down rc={d.rc}")
        for h in [head] + workers:
            h.run([RAY, "stop", "--force"], timeout=60)
    res["stats"] = stats([r["seconds"] for r in res["runs"]])
    return res


class RootFiles:
    """`ray up` syncs ~/ray_bootstrap_config.yaml and ~/ray_bootstrap_key.pem to the head; the namespace
    hosts share /root with this machine, so keep what was there and put it back afterwards."""

    NAMES = ("ray_bootstrap_config.yaml", "ray_bootstrap_key.pem")

    def __enter__(self):
        self.saved = {n: (Path("/root") / n).read_bytes() for n in self.NAMES if (Path("/root") / n).exists()}
        return self

    def __exit__(self, *exc):
        for n in self.NAMES:
            p = Path("/root") / n
            if n in self.saved:
                p.write_bytes(self.saved[n])
            else:
                p.unlink(missing_ok=True)


def add_host(lab: NetnsLab, name: str, tries: int = 3) -> Host:
    """lab.add_host, retried: one `ip link add ... netns` failed once here (rc 2) and worked right after."""
    for attempt in range(tries):
        try:
            return lab.add_host(name)
        except subprocess.CalledProcessError as e:
            say(f"add_host {name} failed ({shlex.join(e.cmd)}: {(e.stderr or '').strip()}); retrying")
            i = len(lab.hosts)  # the partial host was not recorded: remove what it left
            subprocess.run(["ip", "link", "del", f"{lab.prefix}v{i}"], capture_output=True, timeout=30)
            subprocess.run(["ip", "netns", "del", f"{lab.prefix}-{name}"], capture_output=True, timeout=30)
            shutil.rmtree(lab.dir / name, ignore_errors=True)
            if attempt == tries - 1:
                raise
            time.sleep(1)
    raise AssertionError("unreachable")


def private_state_dirs(lab: NetnsLab, hosts: list[Host]) -> None:
    """Namespace hosts share this machine's /root (Python lives under it), so every node's
    ~/.verl-cluster would be one folder, written by all nodes at once (up's token copy races: "size
    mismatch in put"). Give each host its own, bind-mounted in its own mount namespace only, as on
    separate machines."""
    shared = Path("/root/.verl-cluster")
    shared.mkdir(mode=0o700, exist_ok=True)
    for h in hosts:
        d = lab.dir / h.name / "dot-verl-cluster"
        d.mkdir(mode=0o700, exist_ok=True)
        r = h.run(["mount", "--bind", str(d), str(shared)], timeout=30)
        if r.returncode != 0:
            raise RuntimeError(f"{h.name}: bind mount of {shared} failed: {r.stderr.strip()}")
    if str(shared) in Path("/proc/self/mountinfo").read_text():
        raise RuntimeError(f"the bind mount of {shared} leaked into this machine's mount namespace")


def cleanup_local_ray_state(prefix: str) -> None:
    """The local provider keeps cluster-NAME.state/.lock in this machine's Ray temp dir: remove ours."""
    d = Path(tempfile.gettempdir()) / "ray"
    for p in d.glob(f"cluster-{prefix}*"):
        p.unlink(missing_ok=True)


# ---------------------------------------------------------------- report


def table(results: dict) -> str:
    rows = [("what", "median s", "min s", "max s", "ok/reps")]
    for r in results["ours"]:
        s = r["stats"]
        label = " ".join(["verl-cluster up", *r["extra_args"]])
        rows.append((f"{label} head+{r['workers']}", s["median"], s["min"], s["max"],
                     f"{s['n']}/{s['n'] + len([f for f in r['failures'] if not f.get('noop')])}"))
        inner = stats([x["report_seconds"] for x in r["runs"] if x.get("report_seconds")])
        rows.append(("  of which inside up() (start+register)", inner["median"], inner["min"], inner["max"], ""))
        chk = stats([x["check_seconds"] for x in r["runs"] if x.get("check_seconds")])
        if chk["n"]:
            rows.append(("  of which quick check after up", chk["median"], chk["min"], chk["max"], ""))
        ns = r["noop_stats"]
        rows.append((f"  no-op {label} (healthy) head+{r['workers']}", ns["median"], ns["min"], ns["max"],
                     f"{ns['n']}/{s['n']}"))
    for r in results["ray_up"]:
        s = r["stats"]
        rows.append((f"ray up [{r['config_kind']}] head+{r['workers']}", s["median"], s["min"], s["max"],
                     f"{s['n']}/{s['n'] + len(r['failures'])}"))
        ret = [x["ray_up_returned_s"] for x in r["runs"] if x["ray_up_returned_s"]]
        if ret:
            rs = stats(ret)
            rows.append(("  (`ray up` command returned)", rs["median"], rs["min"], rs["max"], ""))
    w = [max(len(str(row[i])) for row in rows) for i in range(5)]
    lines = ["| " + " | ".join(str(c).ljust(w[i]) for i, c in enumerate(row)) + " |" for row in rows]
    lines.insert(1, "|" + "|".join("-" * (x + 2) for x in w) + "|")
    out = "\n".join(lines)
    if results.get("ratios"):
        out += "\n\n" + "\n".join(f"- {k}: {v}" for k, v in results["ratios"].items())
    return out


def ratios(results: dict) -> dict:
    out = {}
    for variant in OURS_VARIANTS:
        ours = {r["workers"]: r["stats"]["median"] for r in results["ours"]
                if r["stats"]["median"] and r["variant"] == variant}
        out.update(_ratios(results, ours, " ".join(["up", *OURS_VARIANTS[variant]])))
    return out


def _ratios(results: dict, ours: dict, label: str) -> dict:
    out = {}
    best = None
    for r in results["ray_up"]:
        m = r["stats"]["median"]
        if m and r["stats"]["n"] == r["stats"]["n"] + len(r["failures"]) and r["workers"] in ours:
            if best is None or m < best[1]:
                best = (r["config_kind"], m, r["workers"])
    if best:
        kind, m, w = best
        x = ours[w] / m
        out[f"{label} head+{w} / ray up [{kind}] head+{w} (target <= 0.33)"] = \
            f"{ours[w]:.2f} / {m:.2f} = {x:.2f}x {'MET' if x <= 0.33 else 'NOT MET'}"
        out["best_ray_up_config"] = kind
    if 2 in ours and 6 in ours:
        x = ours[6] / ours[2]
        out[f"{label} head+6 / head+2 (target <= 1.3)"] = \
            f"{ours[6]:.2f} / {ours[2]:.2f} = {x:.2f}x {'MET' if x <= 1.3 else 'NOT MET'}"
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--workers", default="2,6", help="worker counts for verl-cluster up (comma list)")
    ap.add_argument("--ray-workers", default="2", help="worker counts for ray up (comma list)")
    ap.add_argument("--ray-configs", default="v1,v1-fast",
                    help=f"ray up configurations to time, of {','.join(RAY_CONFIGS)}")
    ap.add_argument("--ray-limit", type=float, default=150.0, help="seconds until all nodes must be registered")
    ap.add_argument("--skip-ray-up", action="store_true")
    ap.add_argument("--ours-variants", default="default,no-check",
                    help=f"verl-cluster up variants to time, of {','.join(OURS_VARIANTS)}")
    ap.add_argument("--skip-ours", action="store_true")
    ap.add_argument("--json-out", type=Path)
    ap.add_argument("--keep-logs", type=Path, help="folder for every command's log (default: a temp folder)")
    a = ap.parse_args(argv)
    why = integration_ready()
    if why:
        print(f"bench_up: cannot run: {why}", file=sys.stderr)
        return 2
    workers = sorted({int(x) for x in a.workers.split(",") if x.strip()})
    ray_workers = sorted({int(x) for x in a.ray_workers.split(",") if x.strip()}) if not a.skip_ray_up else []
    kinds = [k.strip() for k in a.ray_configs.split(",") if k.strip()]
    bad = [k for k in kinds if k not in RAY_CONFIGS]
    if bad:
        print(f"bench_up: unknown --ray-configs {bad}; choose from {list(RAY_CONFIGS)}", file=sys.stderr)
        return 2
    bad_v = [v.strip() for v in a.ours_variants.split(",") if v.strip() and v.strip() not in OURS_VARIANTS]
    if bad_v:
        print(f"bench_up: unknown --ours-variants {bad_v}; choose from {list(OURS_VARIANTS)}", file=sys.stderr)
        return 2
    outdir = a.keep_logs or Path(tempfile.mkdtemp(prefix="bench_up-", dir="/var/tmp"))
    outdir.mkdir(parents=True, exist_ok=True)
    results: dict = {"date": time.strftime("%Y-%m-%d %H:%M:%S"), "argv": sys.argv, "nproc": os.cpu_count(),
                     "ray_version": _ray_version(), "ours": [], "ray_up": [], "load": [load_snapshot()],
                     "logs": str(outdir), "git": _git_state()}
    say(f"load before: {results['load'][0]}; logs in {outdir}")
    n_hosts = 1 + max(workers + ray_workers)
    t_all = time.monotonic()
    with NetnsLab(tag="bench") as lab:
        hosts = [add_host(lab, "head")] + [add_host(lab, f"w{i}") for i in range(1, n_hosts)]
        say(f"lab {lab.subnet}.0/24: {len(hosts)} hosts")
        private_state_dirs(lab, hosts)
        try:
            # Repetitions interleaved (rep 0 of everything, then rep 1, ...): on a shared 2-core machine the
            # background load drifts over minutes, and this way every tool sees the same drift.
            variants = [v.strip() for v in a.ours_variants.split(",") if v.strip()]
            ours: dict = {(w, v): None for w in ([] if a.skip_ours else workers) for v in variants}
            theirs: dict = {(w, k): None for w in ray_workers for k in kinds}
            with RootFiles():
                try:
                    for rep in range(a.reps):
                        for (w, v) in ours:
                            ours[(w, v)] = bench_ours(lab, hosts, w, [rep], outdir, ours[(w, v)], v)
                        for (w, k) in theirs:
                            theirs[(w, k)] = bench_ray_up(lab, hosts, w, k, [rep], a.ray_limit, outdir, theirs[(w, k)])
                        results["load"].append(load_snapshot())
                        say(f"after rep {rep}: load {results['load'][-1]}")
                finally:
                    cleanup_local_ray_state(f"vcb{lab.n}-")
                    results["ours"] = [r for r in ours.values() if r]
                    results["ray_up"] = [r for r in theirs.values() if r]
        finally:
            for h in hosts:  # whatever is left dies with the hosts; this only stops it politely first
                if h.alive:
                    try:
                        h.run([RAY, "stop", "--force"], timeout=30)
                    except Exception:
                        pass
    results["total_s"] = round(time.monotonic() - t_all, 1)
    results["ratios"] = ratios(results)
    say(f"load after: {results['load'][-1]}")
    if a.json_out:
        a.json_out.write_text(json.dumps(results, indent=2, default=str))
        say(f"wrote {a.json_out}")
    print()
    print(table(results))
    return 0


def _git_state() -> dict:
    """Which product code was measured: HEAD and whether verl_cluster/ had uncommitted changes."""
    def git(*args):
        r = subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True, timeout=30)
        return r.stdout.strip()
    return {"head": git("rev-parse", "--short", "HEAD"),
            "verl_cluster_dirty": git("status", "--short", "--", "verl_cluster")}


def _ray_version() -> str:
    r = subprocess.run([PY, "-c", "import ray;print(ray.__version__)"], capture_output=True, text=True, timeout=60)
    return r.stdout.strip()


if __name__ == "__main__":
    sys.exit(main())
