"""grid2.py's device phases (start, chain, run): on the GPU machine, as root, after scripts/gpu/gpu_stage_verl.sh's
parts were unpacked (/root/stage/verl/site). scripts/gpu/gpu_multinode.py's `setup` makes the site, wrappers, the
0.5B shape and synthetic GSM8K under /srv/vc; this module adds flash-attn (moved in and out of the site per run),
a one-node cluster per GPU set (each GPU, aligned pairs) and `up` for each, then submits the batches' lines through
`verl-cluster submit`, side by side on free GPU sets (verl 0.9's TransferQueue is one per Ray cluster: runs side by
side need clusters of their own).
Everything goes to /srv/vc/out: steps.log (what ran, what was skipped and why), grid2-RUN.json (card, verl's
per-step metrics, the product's own verl summary), grid2-submit-RUN.log (the job's log), nvml-RUN.jsonl.
BUDGET_S (default 1320, from `start`) stops starting runs that would not finish inside it.
"""

from __future__ import annotations

import concurrent.futures as cf
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Optional

import gc_pauses  # beside this module (scripts/calibration, the chain's sys.path[0])
import grid2
from grid2 import OUT, REPO, VC, Run

T0 = float(os.environ.get("GRID2_T0") or time.time())
BUDGET_S = float(os.environ.get("BUDGET_S", "1320"))  # setup ~120 s + grid2.SESSION_RUNS_S
STARTUP_MARGIN_S = 60.0  # over grid2.STARTUP_S (300): start-up took 250-335 s a run on the 2026-11-28 H200 runs
STAGGER_S = 2.0  # submits a moment apart: each preflight sees the one before it placed
FLASH_OFF = VC / "flash-off"  # flash-attn's files while a padded run runs (out of the site)
UTC = "%Y-%m-%dT%H:%M:%SZ"
SUBMITTED = re.compile(r"submitted (\S+) to ")  # submit's line on stderr: the job's submission id


def gm():
    """scripts/gpu/gpu_multinode.py, loaded by path (its setup, wrappers, paths and environment)."""
    if "gpu_multinode" not in sys.modules:
        spec = importlib.util.spec_from_file_location("gpu_multinode", REPO / "scripts" / "gpu" / "gpu_multinode.py")
        mod = importlib.util.module_from_spec(spec)
        sys.modules["gpu_multinode"] = mod
        spec.loader.exec_module(mod)
    return sys.modules["gpu_multinode"]


def log(msg: str) -> None:
    line = f"{time.strftime('%H:%M:%S')} +{time.time() - T0:5.0f}s {msg}"
    print(line, flush=True)
    OUT.mkdir(parents=True, exist_ok=True)
    with open(OUT / "steps.log", "a") as fh:  # beside gpu_multinode's lines: gpu_poll.sh's summary shows it
        fh.write(line + "\n")


def vc(*args: str) -> list[str]:
    return [str(gm().BIN / "python3"), "-m", "verl_cluster", *args]


def sh(name: str, argv: list[str], limit: float) -> subprocess.CompletedProcess:
    """argv with stderr in OUT/grid2-NAME.log, stdout returned; rc 124 past LIMIT seconds."""
    with open(OUT / f"grid2-{name}.log", "w") as fh:
        fh.write("$ " + " ".join(argv) + "\n")
        fh.flush()
        try:
            r = subprocess.run(argv, stdout=subprocess.PIPE, stderr=fh, text=True, timeout=max(limit, 1),
                               env=gm().env(), cwd=REPO)
        except subprocess.TimeoutExpired:
            r = subprocess.CompletedProcess(argv, 124, "", "")
    log(f"{name} rc={r.returncode}")
    return r


def set_flash(on: bool) -> bool:
    """Move flash-attn's files into the site (on) or out of it; True when it imports afterwards."""
    src, dst = (FLASH_OFF, gm().SITE) if on else (gm().SITE, FLASH_OFF)
    dst.mkdir(parents=True, exist_ok=True)
    for p in list(src.iterdir()) if src.exists() else []:
        if p.name.startswith("flash_attn"):
            shutil.move(str(p), str(dst / p.name))
    if not on:
        return False
    r = subprocess.run([str(gm().BIN / "python3"), "-c", "import flash_attn, flash_attn_2_cuda"],
                       capture_output=True, timeout=120, env=gm().env())
    return r.returncode == 0


def staged_flash() -> bool:
    return any(p.name.startswith("flash_attn") for d in (gm().SITE, FLASH_OFF) if d.exists() for p in d.iterdir())


def card_name() -> str:
    r = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                       text=True, timeout=30)
    return (r.stdout.strip().splitlines() or ["unknown"])[0].strip()


def host_cpu() -> dict[str, Any]:
    """The machine's CPU (model, cores) and the Python probe's figure: the model's fixed and per-pass costs are the
    host's, and hosts reporting one CPU model ran them ~1.4x apart (docs/placement.md, "Batch V"). Taken when a run
    ends, beside whatever else runs then (the chain's setup and end probes, host_probe.jsonl, run alone). Never costs
    a run: a probe that fails says why in the record."""
    if str(REPO) not in sys.path:  # the chain's Python has scripts/calibration on its path, not the package
        sys.path.insert(0, str(REPO))
    try:
        from verl_cluster.diagnostics.probe_node import cpu_info, host_speed  # stdlib only

        ms, steal = host_speed()
        return {**cpu_info(), "host_python_ms": ms, "host_steal_pct": steal}
    except Exception as e:  # noqa: BLE001 - the run's record is worth more than its host's figure
        return {"probe_error": f"{type(e).__name__}: {e}"}


def site_rows(what: str, when: str, argv: list[str], jsonl: str, timeout: float,
              env: Optional[dict] = None) -> tuple[list[dict], str]:
    """A script of this repo (ARGV: its path and arguments) in the site's Python, its JSON lines appended to
    OUT/JSONL, each with WHEN: (its result rows, "") or ([], the line that says why there are none: it failed, or
    gave none - with the {"error": ...} row it printed, else its stderr). Never raises."""
    g = gm()
    try:
        r = subprocess.run([g.PY, *argv], capture_output=True, text=True, timeout=timeout, env=env or g.env())
        rows = [json.loads(ln) for ln in r.stdout.splitlines() if ln.startswith("{")]
        with open(OUT / jsonl, "a") as fh:
            for row in rows:
                fh.write(json.dumps({"when": when, **row}) + "\n")
    except Exception as e:  # noqa: BLE001 - a slow CUDA start or a torn line must not cost the batch
        return [], f"{what} ({when}) failed: {type(e).__name__}: {e}"
    done = [row for row in rows if "error" not in row]
    if done:
        return done, ""
    why = next((row["error"] for row in rows if "error" in row), r.stderr.strip()[-200:])
    return [], f"{what} ({when}) gave nothing (rc {r.returncode}): {why}"


def host_probe(when: str) -> str:
    """scripts/gpu/gpu_host_probe.py in the site's Python (the Python probe, a launch, an `.item()`), appended to
    host_probe.jsonl: the host's speed beside each batch's runs, which the card's name does not tell. Never stops
    the chain: what went wrong is the line logged."""
    rows, why = site_rows("host probe", when, [str(REPO / "scripts/gpu/gpu_host_probe.py"), "--repeats", "3"],
                          "host_probe.jsonl", 120)
    if not rows:
        return why
    last = rows[-1]
    ctx = last.get("context") or {}
    return (f"host probe ({when}): python {last.get('host_python_ms')} ms, launch {last.get('launch_us')} us, "
            f".item() {last.get('sync_us')} us; steal {last.get('steal_pct')}%, others {ctx.get('others_cpus')} CPUs "
            f"{ctx.get('busiest', [])[:2]}")


FLOOR_LEFT_S = 90  # the chain's end reads the layer floor only with this much of BUDGET_S left (~30 s, a 150 s cap)


def layer_floor(when: str) -> str:
    """scripts/gpu/gpu_logprob_tail.py at the 0.5B shape and 4 sequences, appended to layer_floor.jsonl: a packed
    log-prob layer's host floor (docs/placement.md, "The micro batch on the device"), read on the machine whose host
    factor the chain's runs give. Three H100 hosts ran one line 1.45-1.73x apart and no probe has ordered them; this
    is the figure closest to the host terms. Never stops the chain: what went wrong is the line logged."""
    g = gm()
    env = {**g.env(), "PYTHONPATH": os.pathsep.join([str(FLASH_OFF), str(g.SITE), str(REPO)])}  # flash-attn wherever
    rows, why = site_rows("layer floor", when, [str(REPO / "scripts/gpu/gpu_logprob_tail.py"), "--shape",
                                                "qwen2.5-0.5b", "--seqs", "4"], "layer_floor.jsonl", 150, env)
    if not rows:
        return why
    row = rows[-1]
    return (f"layer floor ({when}): {row['layers_s'] / row['layers'] * 1e3:.2f} ms a layer ({row['shape']}, "
            f"{row['seqs']} sequences, {row['tokens']} tokens; the model's FORWARD_SYNC_PASS_S is 2.0)")


FLOOR_S = 40  # what the layer floor took before the runs (batch Y: 37 s)


def runs_that_fit(needs: list[float], left: float) -> int:
    """How many of the runs (their needs, in order) the chain would start in LEFT seconds, one after another, each
    that fits in what is left (decide's rule; a side-by-side batch's lanes overlap: this errs towards the runs)."""
    n = 0
    for need in needs:
        if need <= left:
            n, left = n + 1, left - need
    return n


def floor_before_runs(batches: list[str], skip: tuple[str, ...] = ()) -> str:
    """The layer floor before the first run (a reading a plan could have had), unless its ~40 s would cost a run."""
    needs = [need_s(r) for _, runs in grid2.phases(batches, skip) for r in runs]
    left = BUDGET_S - (time.time() - T0)
    if runs_that_fit(needs, left - FLOOR_S) < runs_that_fit(needs, left):
        return f"layer floor before the runs skipped: its ~{FLOOR_S}s would cost a run ({left:.0f}s of BUDGET_S left)"
    return layer_floor("setup")


def device_setup() -> None:
    g = gm()
    g.setup()  # the staged site moved to /srv/vc/site, wrappers, the 0.5B shape and synthetic GSM8K
    log(gc_watch(g.SITE))
    log(host_probe("setup"))  # before compileall takes every core
    comp = subprocess.Popen([g.PY, "-m", "compileall", "-q", "-j", "0", str(g.SITE)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)  # staged --no-compile: else every verl process compiles
    wheel = VC / "flashattn-wheel"
    if wheel.exists() and not staged_flash():
        e = {**g.env(), "FA_SITE": str(g.SITE), "FA_PYTHON": g.PY}
        with open(OUT / "grid2-flash-attn.log", "w") as fh:
            r = subprocess.run(["bash", str(wheel / "install.sh")], stdout=fh, stderr=subprocess.STDOUT, env=e,
                               timeout=300)
        log(f"flash-attn installed, its GPU check rc={r.returncode} (grid2-flash-attn.log)")
    set_flash(False)
    log(f"flash-attn {'staged' if staged_flash() else 'NOT staged: the packed and PPO runs will be skipped'}")
    total = gpu_count()
    topo = subprocess.run(["nvidia-smi", "topo", "-m"], capture_output=True, text=True, timeout=60)
    (OUT / "nvidia-smi-topo.txt").write_text(topo.stdout + topo.stderr)  # the links the 4-GPU facts assume
    try:
        comp.wait(600)
    except subprocess.TimeoutExpired:
        comp.kill()
    sets = grid2.gpu_sets(total)
    with cf.ThreadPoolExecutor(8) as pool:  # one cluster per GPU set, started side by side
        got = list(pool.map(lambda gs: sh(f"up-{set_name(gs)}", vc("up", "--no-check", "-c",
                                                                   str(write_cluster(gs, total))), 300), sets))
    with cf.ThreadPoolExecutor(8) as pool:  # each cluster's job ids apart from the others' (verl's /tmp sockets)
        burnt = list(pool.map(lambda ig: burn_job_ids(cluster_path(ig[1]), ig[0] * JOB_ID_STRIDE),
                              list(enumerate(sets))[1:]))
    log("clusters up: " + ", ".join(f"{set_name(gs)} rc={r.returncode}" for gs, r in zip(sets, got))
        + "; job ids apart: " + ", ".join(f"{set_name(gs)} {(b.stdout.split() or ['?'])[-1]} (rc={b.returncode})"
                                          for gs, b in zip(sets[1:], burnt)))


GC_DIR = OUT / "gc"


def gc_watch(site: Path) -> str:
    """Every Python process of the runs (the clusters inherit the environment) logs its collector's pauses
    (gc_pauses.py as the site's sitecustomize): one-step outliers told apart from full collections."""
    target = site / "sitecustomize.py"
    if target.exists() and "gc_pauses" not in target.read_text():
        return f"gc pauses not watched: {target} is the site's own"
    GC_DIR.mkdir(parents=True, exist_ok=True)
    target.write_text("# gc_pauses (scripts/calibration/gc_pauses.py), put here by grid2's chain\n"
                      + (REPO / "scripts/calibration/gc_pauses.py").read_text())
    os.environ["GC_PAUSES_DIR"] = str(GC_DIR)
    return f"gc pauses over 50 ms logged by every Python process in {GC_DIR}"


def gc_summary() -> str:
    return gc_pauses.summary(str(GC_DIR), T0)


JOB_ID_STRIDE = 50  # the i-th GPU set's cluster hands out Ray job ids from 1 + i x STRIDE (burn_job_ids)
BURN = """import os, sys
from verl_cluster.launchers import load_cluster
from verl_cluster.nodes.auth import ray_auth_env
spec = load_cluster(sys.argv[1])
os.environ.update(ray_auth_env(spec))
import ray
import ray._private.state as state
ray.init(address=spec.gcs_address, logging_level="ERROR", log_to_driver=False)
for _ in range(int(sys.argv[2])):
    state.next_job_id()
print("next job id", state.next_job_id().hex())
ray.shutdown()
"""


def burn_job_ids(cluster: Path, n: int, python: str = "") -> subprocess.CompletedProcess:
    """Advance the cluster's Ray job id counter by N. verl names its weight-sync sockets
    /tmp/rl-colocate-zmq-<Ray job id>-replica-R-rank-K.sock, and job ids count from 1 in every GCS: the first job of
    each cluster on this machine would get the same id, hence the same sockets in the shared /tmp. (GCS's
    next_job_id is Ray's private API, used here by the grid, not by the product.)"""
    return subprocess.run([python or str(gm().BIN / "python3"), "-c", BURN, str(cluster), str(n)],
                          capture_output=True, text=True, timeout=300, env=gm().env(), cwd=REPO)


def set_name(gpus: tuple[int, ...]) -> str:
    return "g" + "".join(map(str, gpus))


def cluster_path(gpus: tuple[int, ...]) -> Path:
    return OUT / f"grid2-{set_name(gpus)}.yaml"


def write_cluster(gpus: tuple[int, ...], total: int) -> Path:
    """A one-node cluster of GPUS of this machine's TOTAL (CUDA_VISIBLE_DEVICES on the head), with its own ports and
    temp dir: verl 0.9 keeps one TransferQueue per Ray cluster, so runs side by side need clusters of their own
    (submit/shared_queue.py)."""
    i = grid2.gpu_sets(total).index(gpus)
    path = cluster_path(gpus)
    p = 7000 + 20 * i
    path.write_text(
        f"cluster_name: grid2-{set_name(gpus)}\nhead:\n  host: localhost\n  gpus: {len(gpus)}\n"
        f"  env: {{CUDA_VISIBLE_DEVICES: '{','.join(map(str, gpus))}'}}\n"
        f"  gcs_port: {6400 + i}\n  dashboard_port: {8300 + i}\n  ray_client_port: {10010 + i}\n"
        f"ray:\n  ray_executable: {gm().BIN / 'ray'}\n  object_store_memory: 4294967296\n"
        f"  ports: {{node_manager: {p}, object_manager: {p + 1}, dashboard_agent_grpc: {p + 2}, "
        f"dashboard_agent_listen: {52400 + i}, metrics_export: {p + 3}, runtime_env_agent: {p + 4}, "
        f"dashboard_metrics: {p + 5}, autoscaler_metrics: {p + 6}, min_worker: {20000 + 1000 * i}, "
        f"max_worker: {20999 + 1000 * i}}}\n")
    return path


def flash_head_dims(wheel: Path) -> Optional[set[int]]:
    """The head dims the carried flash-attn wheel was built for (its kit.env's FA_HDIMS); None when no kit wheel is
    there (no flash-attn, or a full build: every head dim)."""
    env = wheel / "kit.env"
    if not env.exists():
        return None
    m = re.search(r'^FA_HDIMS="([^"]*)"', env.read_text(), re.M)
    return {int(d) for d in m.group(1).split()} if m else None


def head_dim_gap(run: Run, dims: Optional[set[int]]) -> str:
    """'' when the run's model can use the flash-attn wheel, else why not and how to fix it."""
    if not run.flash or dims is None or run.head_dim in dims:
        return ""
    have = " ".join(str(d) for d in sorted(dims))
    return (f"{run.name} ({run.shape}) needs flash-attn head dim {run.head_dim}; the carried wheel has {have}: "
            f"rebuild it with FA_HDIMS=\"{have} {run.head_dim}\" scripts/gpu/gpu_flash_attn_kit.sh --wheel-here")


def decide(run: Run, flash_ok: bool, left_s: float, need_s: float, gpus: int = 2,
           head_dims: Optional[set[int]] = None) -> str:
    """'' to run it, else the one line that says why it is skipped."""
    if run.gpus > gpus:
        return f"SKIP {run.name}: needs {run.gpus} GPUs, this machine has {gpus}"
    if run.flash and not flash_ok:
        return (f"SKIP {run.name} ({run.family}): flash-attn is not staged on this machine; carry "
                ".stage/flashattn-wheel in the start call (scripts/gpu/gpu_flash_attn_kit.sh --wheel-here builds it)")
    gap = head_dim_gap(run, head_dims)
    if gap:
        return f"SKIP {gap}"
    if left_s < need_s:
        return f"SKIP {run.name}: needs ~{need_s:.0f}s, {left_s:.0f}s left of BUDGET_S (run it with the next batch)"
    return ""


def need_s(run: Run, path: Path = grid2.PREDICTIONS) -> float:
    """The expected seconds (the slower card) of the latest recorded round that predicts the run (or its first),
    else a generous guess; plus what start-up took beyond grid2.STARTUP_S when runs went side by side
    (STARTUP_MARGIN_S)."""
    rounds = json.loads(path.read_text())["rounds"] if path.exists() else []
    rnd = next((r for r in reversed(rounds) if any(grid2.prediction(r, run, c) for c in grid2.CARDS)), None)
    got = [p["expected_s"] for c in grid2.CARDS if rnd and (p := grid2.prediction(rnd, run, c))]
    return (max(got) if got else grid2.STARTUP_S + 200) + STARTUP_MARGIN_S


def one(run: Run, card: str, cluster: Path, have_flash: bool, machine_gpus: int,
        gpus: tuple[int, ...] = ()) -> dict[str, Any]:
    shutil.rmtree(run.ckpt_dir, ignore_errors=True)
    stop = OUT / f"stop-{run.name}"
    sampler = subprocess.Popen([gm().PY, "scripts/gpu/gpu_mem_sampler.py", str(OUT / f"nvml-{run.name}.jsonl"),
                                "--stop-file", str(stop)], cwd=REPO, env=gm().env(), stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
    started, t = time.strftime(UTC, time.gmtime()), time.time()
    limit = min(need_s(run) * 1.5 + 120, BUDGET_S + 240 - (time.time() - T0))
    freeze = GC_DIR / gc_pauses.FREEZE_FLAG
    if run.gc_freeze:
        GC_DIR.mkdir(parents=True, exist_ok=True)
        freeze.touch()
    seen: dict[int, float] = {}
    tail = StepTimes(OUT / f"grid2-submit-{run.name}.log", seen)
    tail.start()
    try:
        # the calibrated hosts' plan, as the round recorded it: not the speed earlier runs of the chain showed here
        r = sh(f"submit-{run.name}", vc("submit", "-c", str(cluster), "--json", *run.flags,
                                        "placement.host_factor=off", "--", *run.line()), limit)
    finally:
        freeze.unlink(missing_ok=True)
        tail.done.set()
    stop.touch()
    try:
        sampler.wait(30)
    except subprocess.TimeoutExpired:
        sampler.kill()
    lines = (OUT / f"grid2-submit-{run.name}.log").read_text(errors="replace").splitlines()
    sid = next((m.group(1) for m in map(SUBMITTED.search, lines) if m), None)
    if r.returncode == 124 and sid:  # cut short: the job would go on beside the next run and skew its timings
        sh(f"stop-{run.name}", vc("stop", sid, "-c", str(cluster)), 120)
    try:
        product = json.loads(r.stdout)
    except ValueError:
        product = {}
    shutil.rmtree(run.ckpt_dir, ignore_errors=True)
    if run.profile:  # the traces stay here; their summary comes back
        got = sh(f"profile-{run.name}", [gm().PY, "scripts/calibration/profile_summary.py", str(run.profile_dir),
                                         "--json", str(OUT / f"profile-{run.name}.json")], 300)
        (OUT / f"profile-{run.name}.md").write_text(got.stdout)
    return {"run": run.name, "batch": run.batch, "family": run.family, "card": card, "gpus": run.gpus,
            "machine_gpus": machine_gpus, "gpu_set": list(gpus), "flash_attn": have_flash, "started_utc": started,
            "wall_s": round(time.time() - t, 1),
            "rc": r.returncode, "status": product.get("status"), "submission_id": sid, "line": run.line(),
            "steps": grid2.parse_steps(lines), "product": product.get("verl"),
            "step_seen_t": {str(k): v for k, v in sorted(seen.items())}, "started_t": round(t, 3),
            "gc_freeze": run.gc_freeze, "submit_flags": list(run.flags), "host_cpu": host_cpu()}


class StepTimes(threading.Thread):
    """When each `step:N - ` line reached the job's log (epoch seconds, to 0.25 s): a step's collector pauses are
    the ones between its line and the line before."""

    def __init__(self, path: Path, seen: dict[int, float]):
        super().__init__(daemon=True)
        self.path, self.seen, self.done = path, seen, threading.Event()

    def run(self) -> None:
        pos = 0
        while not self.done.wait(0.25):
            try:
                with open(self.path, "rb") as fh:
                    fh.seek(pos)
                    chunk = fh.read()
            except OSError:
                continue
            cut = chunk.rfind(b"\n") + 1  # whole lines only; the rest is read again
            pos += cut
            for m in map(grid2.step_line, chunk[:cut].decode(errors="replace").splitlines()):
                if m:
                    self.seen.setdefault(int(m.group(1)), round(time.time(), 2))


def gpu_count() -> int:
    r = subprocess.run(["nvidia-smi", "--query-gpu=index", "--format=csv,noheader"], capture_output=True,
                       text=True, timeout=30)
    return max(len(r.stdout.split()), 1)


def free_gpus(cluster: Path) -> Optional[float]:
    """The GPUs Ray lists free on the cluster's alive nodes (None when `status` cannot tell)."""
    try:
        r = subprocess.run(vc("status", "-c", str(cluster), "--json"), capture_output=True, text=True, timeout=60,
                           env=gm().env(), cwd=REPO)
        nodes = json.loads(r.stdout).get("nodes", [])
    except (subprocess.TimeoutExpired, ValueError, AttributeError):
        return None
    got = [(n.get("available") or {}).get("GPU") for n in nodes if n.get("alive")]
    return float(sum(g for g in got if g)) if got and all(g is not None for g in got) else None


def wait_free(cluster: Path, need: int, limit_s: float = 120) -> None:
    """Until Ray lists NEED GPUs free: a job that just ended may hold its GPUs a few seconds more, and submit's
    preflight would refuse the next run on them."""
    end = time.time() + limit_s
    while time.time() < end:
        got = free_gpus(cluster)
        if got is None or got >= need:
            return
        time.sleep(3)
    log(f"Ray still lists fewer than {need} GPUs free after {limit_s:.0f}s; starting anyway")


def run_phase(runs: list[Run], card: str, flash_ok: bool, have_flash: bool, total: int) -> None:
    """RUNS side by side, each started in order on the first free GPU set of its size (grid2.gpu_sets: a Ray
    cluster each), once Ray on that cluster lists the GPUs free."""
    pending, active = list(runs), {}
    dims = flash_head_dims(VC / "flashattn-wheel")  # the staged wheel's, fixed for the chain
    with cf.ThreadPoolExecutor(max(total, 1)) as pool:
        while pending or active:
            for run in list(pending):
                why = decide(run, flash_ok, BUDGET_S - (time.time() - T0), need_s(run), total, dims)
                if why:
                    log(why)
                    pending.remove(run)
                    continue
                gpus = grid2.first_free_set(run.gpus, total, {g for _, gs in active.values() for g in gs})
                if gpus is None:
                    break  # in order, as grid2.lane_plan budgets them
                cluster = cluster_path(gpus)
                wait_free(cluster, run.gpus)
                pending.remove(run)
                log(f"{run.name} starts on GPU {','.join(map(str, gpus))} of {total}"
                    + (f" beside {', '.join(r.name for r, _ in active.values())}" if active else ""))
                active[pool.submit(one, run, card, cluster, have_flash, total, gpus)] = (run, gpus)
                time.sleep(STAGGER_S)
            if not active:
                continue
            finished, _ = cf.wait(list(active), return_when=cf.FIRST_COMPLETED)
            for fut in finished:
                run, _ = active.pop(fut)
                try:
                    doc = fut.result()
                except Exception as e:  # noqa: BLE001 - one run's failure is a line; the others go on
                    log(f"{run.name} failed: {type(e).__name__}: {e}")
                    continue
                (OUT / f"grid2-{run.name}.json").write_text(json.dumps(doc, indent=1))
                m = grid2.measured(doc["steps"], run.sequences)
                log(f"{run.name}: {doc['status']} rc={doc['rc']} in {doc['wall_s']}s; step {m.get('step_s', 0):.2f}s "
                    f"over {m.get('steps', 0)} timed steps, fill {m.get('fill') or 0:.2f}")


def make_shapes(batches: list[str], skip: tuple[str, ...] = ()) -> None:
    """The model shapes the batches' runs need beyond the grid's own (setup makes the 0.5B): random init, written
    once to /srv/vc/models/SHAPE (a 3B is ~6 GB)."""
    g = gm()
    shapes = sorted({r.shape for _, runs in grid2.phases(batches, skip) for r in runs} - {grid2.SHAPE})
    for shape in shapes:
        if (g.MODELS / shape / "config.json").exists():
            continue
        t = time.time()
        r = sh(f"model-{shape}", [str(g.BIN / "python3"), "scripts/make_tiny_model.py", "--shape", shape, "-o",
                                  str(g.MODELS / shape)], 600)
        log(f"model {shape}: {time.time() - t:.0f}s (rc {r.returncode})")


def run_batch(batches: list[str], skip: tuple[str, ...] = ()) -> None:
    """The batches' runs as grid2.phases orders them: padded runs (flash-attn out of the site), then the rest (in),
    runs of a phase side by side on the machine's GPUs."""
    card, total = card_name(), gpu_count()
    flash_ok = set_flash(True)
    set_flash(False)
    log(f"batches {'+'.join(batches)} on {total} x {card}; flash-attn importable: {flash_ok}")
    for flash, runs in grid2.phases(batches, skip):
        have = set_flash(True) if flash else set_flash(False)
        run_phase(runs, card, flash_ok, have, total)


def start(batches: list[str], skip: tuple[str, ...] = ()) -> None:
    """Copy the repo to /srv/vc/repo (a later call replaces the call's tree) and run `chain BATCH` detached."""
    phases = grid2.phases(batches, skip)  # unknown batches, runs or a fit/held-out mix: said here, not in the chain
    dims = flash_head_dims(REPO / ".stage" / "flashattn-wheel")
    gaps = [g for _, runs in phases for r in runs for g in [head_dim_gap(r, dims)] if g]
    if gaps:  # said before any device time goes on a run that cannot start (batch U lost ~550 s so, 2026-12-02)
        raise SystemExit("\n".join(gaps) + "\n(or leave those runs out with --skip RUN)")
    batch = "+".join(batches)
    dst = VC / "repo"
    pid = running_chain(OUT)
    if pid:  # two chains on one GPU see each other's flash-attn install and share its memory (batch W, 2026-12-07)
        raise SystemExit(f"a chain (pid {pid}) is still running on this machine: poll it (bash scripts/gpu/gpu_poll.sh "
                         f"{OUT} ...) or stop it (kill -- -{pid}) before starting another")
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / f"grid2-{batch}.done").unlink(missing_ok=True)  # a chain that stopped before this one left it
    if REPO != dst:
        shutil.copytree(REPO, dst, dirs_exist_ok=True, ignore=shutil.ignore_patterns(
            ".git", ".stage", ".stage-src", ".venv*", "__pycache__", ".gpubundle", ".whl", ".hypothesis"))
        if (REPO / ".stage" / "flashattn-wheel").exists():
            shutil.copytree(REPO / ".stage" / "flashattn-wheel", VC / "flashattn-wheel", dirs_exist_ok=True)
    steps = OUT / "steps.log"
    since = steps.stat().st_size if steps.exists() else 0  # an earlier chain's lines on this machine are not ours
    with open(OUT / f"chain-{batch}.log", "a") as fh:
        proc = subprocess.Popen([sys.executable, str(dst / "scripts/calibration/grid2.py"), "chain", *batches,
                                 *(f"--skip={n}" for n in skip)], cwd=dst,
                                stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
                                env={**os.environ, "GRID2_T0": str(T0), "BUDGET_S": str(BUDGET_S),
                                     "PYTHONUNBUFFERED": "1"})
    (OUT / "chain.pid").write_text(f"{proc.pid}\n")
    print(f"chain {batch} started detached (budget {BUDGET_S:.0f}s); poll: bash scripts/gpu/gpu_poll.sh {OUT} "
          f"{OUT}/grid2-{batch}.done 560", flush=True)
    wait = float(os.environ.get("GRID2_START_WAIT_S", "240"))
    done = OUT / f"grid2-{batch}.done"
    while time.time() - T0 < wait and not done.exists() and "clusters up:" not in this_chain(steps, batch, since):
        time.sleep(3)  # the setup (site, models, flash-attn's GPU check, `up`) is seen in this call
    print(this_chain(steps, batch, since) or "no line of this chain in steps.log yet", end="")


def this_chain(steps: Path, batch: str, since: int = 0) -> str:
    """steps.log from this chain's first line on, past byte SINCE (its size when this chain was started): a machine
    kept from an earlier chain, of this batch or another, has its lines above."""
    if not steps.exists():
        return ""
    with open(steps, "rb") as fh:
        fh.seek(since)
        text = fh.read().decode(errors="replace")
    at = text.rfind(f"chain {batch} (budget")
    return text[at:] if at >= 0 else ""


def running_chain(out: Path) -> Optional[int]:
    """The pid of the chain `start` last started on this machine (OUT/chain.pid) while it runs, else None."""
    try:
        pid = int((out / "chain.pid").read_text().split()[0])
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except (OSError, ValueError, IndexError):
        return None
    return pid if any(a.endswith(b"grid2.py") for a in argv) and b"chain" in argv else None


def chain(batches: list[str], skip: tuple[str, ...] = ()) -> None:
    batch = "+".join(batches)
    try:
        log(f"chain {batch} (budget {BUDGET_S:.0f}s)")
        device_setup()
        make_shapes(batches, skip)
        log(floor_before_runs(batches, skip))
        run_batch(batches, skip)
    except SystemExit as e:  # gpu_multinode's setup says what is missing (no staged site)
        log(f"chain {batch} stopped: {e}")
    except Exception as e:  # noqa: BLE001 - said in steps.log, which comes back; the traceback is in chain-B.log
        log(f"chain {batch} failed: {type(e).__name__}: {e}")
        raise
    finally:
        log(host_probe("end"))
        left = BUDGET_S - (time.time() - T0)
        log(layer_floor("end") if left >= FLOOR_LEFT_S else f"layer floor skipped: {left:.0f}s of BUDGET_S left")
        log(gc_summary())
        log("end")
        (OUT / f"grid2-{batch}.done").touch()
