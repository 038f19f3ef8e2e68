#!/usr/bin/env python3
"""Fit the planner's step-time and host-RAM constants (placement/step_time.py, placement/host_memory.py) on the
recorded verl runs in tests/fixtures/verl_runs/calibration_runs.json and multi_gpu_runs.json, and show them against
every run.

    python3 scripts/calibration/fit_plan_calibration.py [--runs-file FILE] [--figures-file FILE] [--check] [--write-envelope]
                                            [--json]

Each run is replayed as tests/unit/test_plan_time_host.py does (scripts/calibration/calib_from_runs.py replay: the job as it
ran, the recorded H100 facts, the run's own lengths); the runs kept as figures (multi_gpu_runs.json: more than one
GPU) on their own facts, node count, `check`'s NCCL figure and fill (replay_figures). The plan carries each phase
as terms (Plan.terms: fitted constant -> coefficient, plus seconds no constant scales: bytes over PCIe, HBM and
links, verl's poll of the rollout), so the fit is linear:
- step time: one least-squares fit over every phase of every run tagged time "fit" (verl's timing_s/* means over
  the steps after the first), each row divided by its measured seconds (relative errors count alike), constants
  kept non-negative; COMPUTE_SHARE is held at the module's value (the runs cannot tell it: step_time.py says why);
- host RAM: PER_GPU_PROCESS_BYTES is measured, not fitted: the sampler's PSS at verl's step lines of the trainer
  worker (less its shared memory: the pinned states fitted below) and of vLLM's server, engine and worker, mean
  over the fit runs that have it; NODE_BYTES, REF_HOST_COPIES and OFFLOAD_HOST_COPIES are then fitted (least
  squares, relative) on verl's largest logged node RAM of the runs tagged host "fit".
Prints the constants as they are written in the modules (3 significant digits), then predicted vs measured for
every run, fit, hold-out and seen. --write-envelope writes the planner's calibration envelope (each run's axes, role
and step error, and the held-out machines' host factors at the fitted constants, host_factor.py: placement/
envelope.py); --check exits 1 when a module's constant, or that envelope, differs from the fit.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from verl_cluster.placement import host_memory, step_time  # noqa: E402
from verl_cluster.placement.memory import GIB  # noqa: E402

_spec = importlib.util.spec_from_file_location("calib_from_runs", ROOT / "scripts/calibration/calib_from_runs.py")
CALIB = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(CALIB)
LOGS = ROOT / "tests/fixtures/verl_logs"
FIGURES_FILE = ROOT / "tests/fixtures/verl_runs/multi_gpu_runs.json"  # runs kept as figures (more than one GPU)
GRID2_FILE = ROOT / "tests/fixtures/verl_runs/grid2_runs.json"  # issue 33's second grid (grid2.py fixture)
ENVELOPE_FILE = ROOT / "verl_cluster/catalog/step_time_envelope.json"
ENVELOPE_COMMENT = ("The step-time model's calibration envelope (placement/envelope.py): the recorded verl runs, each "
                    "with its axes, its role (fit: the constants were fitted on it; hold-out: not fitted on; seen: "
                    "looked at while the terms were written, not fitted on, not blind) and the model's step error "
                    "on it; then the machines held-out runs ran on (hosts). Written by "
                    "scripts/calibration/fit_plan_calibration.py --write-envelope; --check fails when it differs "
                    "from the fit.")
HOSTS_COMMENT = ("Machines the held-out runs ran on, each with the factor on the model's host terms "
                 "(step_time.HOST_TERMS) that puts its runs' steps at what they measured "
                 "(scripts/calibration/host_factor.py): below 1 a host faster than the fit's.")
# kept at the module's value: priors the runs cannot tell (step_time.py says why), verl's poll period, its spread and
# the sleep after it, a forward layer's host floor and the eager entropy's bytes (measured)
HELD = ("COMPUTE_SHARE", "COMM_S", "GEN_POLL_S", "GEN_JITTER", "GEN_SLEEP_S", "FORWARD_PASS_S", "FORWARD_SYNC_PASS_S",
        "ENTROPY_EAGER_BYTES")
GEN = ("GENERATE_FIXED_S", "DECODE_TOKEN_S", "EAGER_STEP_S", "EAGER_LAYER_STEP_S")  # the generate's fitted constants
GPU_ROLES = ("worker_dict", "vllm_worker", "vllm_engine", "vllm_server")  # the sampler's roles of one GPU's processes


def sig3(x: float) -> float:
    return float(f"{x:.3g}")


def nnls(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Least squares with x >= 0: drop the most negative unknown and solve again until none is negative."""
    free = list(range(a.shape[1]))
    x = np.zeros(a.shape[1])
    while free:
        sol, *_ = np.linalg.lstsq(a[:, free], b, rcond=None)
        if (sol >= 0).all():
            x[:] = 0
            x[free] = sol
            return x
        free.pop(int(np.argmin(sol)))
    return x


def replay_figures(entry: dict, tmp: Path) -> tuple:
    """(the plan re-made for a run kept as figures, on its hardware at its fill; its means as check_run.measured
    gives them): the nodes are the facts file's, `nodes` of them, with `check`'s NCCL figure when the run had one."""
    import time
    from dataclasses import replace

    from verl_cluster.config.job import load_job
    from verl_cluster.facts.measured_bus import BusMeasure
    from verl_cluster.facts.model import NodeFacts, from_json
    from verl_cluster.placement import plan_job
    from verl_cluster.placement.check_run import STEP_PHASES, measured

    facts = from_json(NodeFacts, (ROOT / entry["facts"]).read_text())
    if not entry["flash_attn"]:
        facts = replace(facts, versions={k: v for k, v in facts.versions.items() if k != "flash_attn"})
    nodes = [replace(facts, host=f"node{i}") for i in range(entry["nodes"])]
    args = list(entry.get("args", ())) + ([f"model.catalog={entry['model']}"] if entry.get("model") else [])
    if entry.get("tiny_model"):
        from verl_cluster.testdata.tiny_model import write_model

        write_model(tmp / "tiny", "tiny", seed=0)
        args.append(f"model.path={tmp / 'tiny'}")
    b = entry.get("bus")
    bus = (BusMeasure("recorded", b["backend"], b["nodes"], b["ranks"], b["gpus"], b["busbw_gbs"], b["size_bytes"],
                      time.time()),) if b else ()
    if "line" in entry:  # the verl line as it ran, read as `plan -- LINE` reads it
        from verl_cluster.submit.job_input import JobInput

        job = JobInput.from_words(None, list(entry["line"])).job()
    else:
        job = load_job(ROOT / entry["job"], args)
    plan = plan_job(job, nodes, fill=entry["fill"], bus=bus)
    if "steps" in entry:
        got = measured({int(k): v for k, v in entry["steps"].items()}, entry["first_steps"])
    else:
        phases = {k: v for k, v in entry["means"].items() if k in STEP_PHASES}
        got = {"phases_s": phases, "step_s": sum(phases.values())}
    return plan, got


def replays(runs: dict, figures: dict | None = None) -> dict:
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, entry in runs.items():
            plan, got = CALIB.replay(entry, LOGS, Path(tmp) / name)
            out[name] = (entry, plan, got)
        for name, entry in (figures or {}).items():
            plan, got = replay_figures(entry, Path(tmp) / name)
            out[name] = (entry, plan, got)
    return out


def bound_consts(fixed: str) -> tuple[str, ...]:
    """The fitted constants of a micro-batched phase kind (step_time.SIDES): its fixed costs (one rank's, more
    ranks'), both sides' terms and its tail's (step_time.TAIL: serial, after the last layer)."""
    host, gpu = step_time.SIDES[fixed]
    ranks = ("UPDATE_FIXED_RANKS_S",) if fixed == "UPDATE_FIXED_S" else ()
    return (fixed,) + ranks + tuple(k for k in host + gpu + step_time.TAIL[fixed] if k.lstrip("1/") not in HELD)


def half_period(t: dict, value=None) -> dict:
    """The generate's wait as a linear fit can take it: half a poll period (the model before polls())."""
    return {**t, "GEN_POLL_S": 0.5}


@contextmanager
def patched(bound, polled):
    """step_time's bound() and polled() replaced while replays are made: both sides of a micro-batched phase kept,
    the generate's wait as POLLED gives it."""
    saved = step_time.bound, step_time.polled
    step_time.bound, step_time.polled = bound, polled
    try:
        yield
    finally:
        step_time.bound, step_time.polled = saved


@contextmanager
def at_constants(values: dict[str, float]):
    """step_time's constants set to VALUES while the plans are made, the module's own back after."""
    saved = {k: getattr(step_time, k) for k in values}
    try:
        for k, v in values.items():
            setattr(step_time, k, v)
        yield
    finally:
        for k, v in saved.items():
            setattr(step_time, k, v)


def fit_bound(runs: dict, figures: dict) -> tuple[dict, dict[str, float]]:
    """Replays with each micro-batched phase's host and GPU terms both kept and the generate's wait at half a period,
    and the time fit: the other phases by least squares; the forward and update phases, whose micro batches take the
    longer of the host's and the GPU's work (step_time.bound), and the generate, which takes whole poll periods
    (step_time.polled), by minimizing the same relative errors with that max or those periods (Nelder-Mead from the
    least-squares fit that adds the two sides and waits half a period: the same start whatever the modules hold, so
    --check is stable). Returns the replays as the plan makes them at the fitted constants."""
    with patched(lambda t, ranks=1: t, half_period):
        raw = replays(runs, figures)
    x0 = fit_time(raw)
    time_x = dict(x0)
    groups = {fixed: (bound_consts(fixed), step_time.bound) for fixed in step_time.SIDES}
    groups["GENERATE_FIXED_S"] = (GEN, lambda t, ranks, val: step_time.polled(t, val))
    for fixed, (names, transform) in groups.items():
        rows = [(terms, got["phases_s"][ph], plan.time["error_bar"]["axes"]["ranks"])
                for entry, plan, got in raw.values() if entry["time"] == "fit"
                for ph, terms in plan.terms["time"].items() if fixed in terms and got["phases_s"].get(ph)]
        loose = {k for t, _, _ in rows for k, v in t.items()
                 if v and k and k not in names and k.lstrip("1/") not in HELD}
        assert not loose, f"{fixed}'s phases carry fitted constants outside its group: {sorted(loose)}"
        start = np.array([x0.get(k, 0.0) for k in names])
        scale = np.where(start > 0, start, 1e-3)

        def predicted(x: np.ndarray, terms: dict, ranks: int, names=names, scale=scale,
                      transform=transform) -> float:
            c = dict(zip(names, np.abs(x) * scale))
            val = (lambda k: c[k] if k in c else step_time.const(k))  # the rest are HELD: the modules' alone
            return step_time.seconds(transform(terms, ranks, val), val)  # as the plan makes it, at X

        def loss(x: np.ndarray, rows=rows, predicted=predicted) -> float:
            return sum((predicted(x, t, n) / m - 1.0) ** 2 for t, m, n in rows)

        found = []
        starts = (1.0, 0.5, 2.0) if fixed == "GENERATE_FIXED_S" else (1.0,)  # whole periods have local minima
        for at in starts:  # from each start the best kept
            best = np.full(len(names), at)
            for _ in range(3):  # restarted from its best: a simplex that collapsed early starts whole again
                best = nelder_mead(loss, best)
            found.append((loss(best), at, best))
        best = min(found, key=lambda f: (f[0], f[1]))[2]
        best = np.where(np.abs(best) < 1e-3, 0.0, best)  # driven to a thousandth of its start: none (stable digits)
        time_x.update({k: float(v) for k, v in zip(names, np.abs(best) * scale)})
    fitted = [k for names, _ in groups.values() for k in names]
    with at_constants({k: time_x[k] for k in fitted}):  # the plans as the modules will make them: bound() at them
        done = replays(runs, figures)
    return done, time_x


def nelder_mead(f, x0: np.ndarray, rounds: int = 4000, tol: float = 1e-12) -> np.ndarray:
    """Minimize F from X0 (the simplex method: no gradient, so the max's kinks do not matter); deterministic."""
    n = len(x0)
    pts = [x0.astype(float)] + [x0 + np.eye(n)[i] * 0.25 for i in range(n)]
    vals = [f(p) for p in pts]
    for _ in range(rounds):
        order = np.argsort(vals)
        pts, vals = [pts[i] for i in order], [vals[i] for i in order]
        if vals[-1] - vals[0] < tol:
            break
        mid = np.mean(pts[:-1], axis=0)
        refl = mid + (mid - pts[-1])
        fr = f(refl)
        if fr < vals[0]:
            exp = mid + 2.0 * (mid - pts[-1])
            fe = f(exp)
            pts[-1], vals[-1] = (exp, fe) if fe < fr else (refl, fr)
        elif fr < vals[-2]:
            pts[-1], vals[-1] = refl, fr
        else:
            con = mid + 0.5 * (pts[-1] - mid)
            fc = f(con)
            if fc < vals[-1]:
                pts[-1], vals[-1] = con, fc
            else:  # shrink toward the best
                pts = [pts[0]] + [pts[0] + 0.5 * (p - pts[0]) for p in pts[1:]]
                vals = [vals[0]] + [f(p) for p in pts[1:]]
    return pts[int(np.argmin(vals))]


def fit_time(done: dict) -> dict[str, float]:
    rows, target = [], []
    for entry, plan, got in done.values():
        if entry["time"] != "fit":
            continue
        for phase, terms in plan.terms["time"].items():
            m = got["phases_s"].get(phase)
            if m:
                known = sum(c * step_time.const(k) for k, c in terms.items() if not k or k.lstrip("1/") in HELD)
                rows.append({k: v / m for k, v in terms.items() if k and k.lstrip("1/") not in HELD})
                target.append((m - known) / m)
    names = sorted({k for r in rows for k, v in r.items() if v})
    x = nnls(np.array([[r.get(k, 0.0) for k in names] for r in rows]), np.array(target))
    return dict(zip(names, x))


def per_gpu_pss(done: dict) -> tuple[float, int]:
    vals = []
    for entry, _, _ in done.values():
        if entry.get("host") != "fit":
            continue
        for at in (entry.get("sampled") or {}).get("at_steps", []):
            pss, shm = at.get("roles_pss_gib"), at.get("roles_shmem_gib", {})
            # a sample taken after the job ended (the node's RAM far below what verl logged) says nothing
            alive = abs(at["used_available_gib"] / at["verl_gib"] - 1) < 0.1
            if pss and "worker_dict" in pss and alive and at["step"] not in entry["first_steps"]:
                vals.append(sum(pss.get(r, 0.0) for r in GPU_ROLES) - shm.get("worker_dict", 0.0))
    return (sum(vals) / len(vals), len(vals)) if vals else (0.0, 0)


def fit_host(done: dict, per_gpu_gib: float) -> dict[str, float]:
    names = ("NODE_BYTES", "REF_HOST_COPIES", "OFFLOAD_HOST_COPIES")
    rows, target = [], []
    for entry, plan, got in done.values():
        if entry.get("host") != "fit" or "host_gib" not in got:
            continue
        t = plan.terms["host"]
        m = got["host_gib"] * GIB
        batch = plan.host_parts.get("batch (driver + object store)", 0.0) * GIB
        rows.append([t[k] / m for k in names])
        target.append((m - batch - per_gpu_gib * GIB * t["PER_GPU_PROCESS_BYTES"]) / m)
    x = nnls(np.array(rows), np.array(target))
    return dict(zip(names, x))


def constants(time_x: dict, host_x: dict, per_gpu_gib: float) -> dict[str, float]:
    """Module constant (NAME or NAME:key) -> value as written in the modules."""
    out = {}
    for k, v in time_x.items():
        if k.startswith("1/"):
            out[k[2:]] = sig3(1.0 / v) if v > 0 else float("inf")
        else:
            out[k] = sig3(v)
    out.update({k: getattr(step_time, k) for k in HELD})
    out["PER_GPU_PROCESS_BYTES"] = sig3(per_gpu_gib)  # GiB
    out["NODE_BYTES"] = sig3(host_x["NODE_BYTES"] / GIB)  # GiB
    out["REF_HOST_COPIES"] = sig3(host_x["REF_HOST_COPIES"])
    out["OFFLOAD_HOST_COPIES"] = sig3(host_x["OFFLOAD_HOST_COPIES"])
    return out


def module_value(name: str) -> float:
    base, _, key = name.partition(":")
    mod = host_memory if base in vars(host_memory) else step_time
    v = getattr(mod, base)
    v = v[key] if key else v
    return v / GIB if base in ("PER_GPU_PROCESS_BYTES", "NODE_BYTES") else v


def value_of(name: str, consts: dict) -> float:
    """A term's multiplier from the fitted constants (not the modules'): "" -> 1, "1/NAME:key" -> 1 / value."""
    if not name:
        return 1.0
    if name.startswith("1/"):
        return 1.0 / consts[name[2:]]
    return consts[name] * (GIB if name in ("PER_GPU_PROCESS_BYTES", "NODE_BYTES") else 1.0)


def table(done: dict, consts: dict) -> list[dict]:
    """Predicted (the fitted constants) vs measured for every run: phases, step, host RAM."""
    out = []
    for name, (entry, plan, got) in done.items():
        phases = {ph: sum(c * value_of(k, consts) for k, c in terms.items() if c)
                  for ph, terms in plan.terms["time"].items()}
        rows = [(f"{ph}", phases[ph], got["phases_s"][ph]) for ph in phases if got["phases_s"].get(ph)]
        # the step: the phases measured (a run kept as figures may lack one)
        rows.append(("step", sum(phases[ph] for ph in phases if got["phases_s"].get(ph)), got["step_s"]))
        if "host_gib" in got:
            t = plan.terms["host"]
            host = (sum(c * value_of(k, consts) for k, c in t.items())
                    + plan.host_parts.get("batch (driver + object store)", 0.0) * GIB) / GIB
            rows.append(("host RAM (GiB)", host, got["host_gib"]))
        out.append({"run": name, "time": entry["time"], "host": entry.get("host", "-"),
                    "axes": plan.time["error_bar"]["axes"],
                    "rows": [{"what": w, "predicted": round(p, 2), "measured": round(m, 2),
                              "error": round(p / m - 1, 3)} for w, p, m in rows]})
    return out


def envelope(rows: list[dict], host_doc: dict | None = None) -> dict:
    """The calibration envelope the planner ships (placement/envelope.py): each run's axes, role and the model's step
    error on it (the fitted constants'), the worst phase over half a second; HOST_DOC the hosts (hosts())."""
    runs = []
    for r in rows:
        step = next(x for x in r["rows"] if x["what"] == "step")
        long = [x for x in r["rows"] if x["what"] not in ("step", "host RAM (GiB)") and x["measured"] >= 0.5]
        worst = max(long, key=lambda x: abs(x["error"]), default=None)
        runs.append({"run": r["run"], "role": r["time"], "axes": r["axes"], "step_error": step["error"],
                     "worst_phase": [worst["what"], worst["error"]] if worst else None})
    return {"_comment": ENVELOPE_COMMENT, "runs": runs, "hosts": host_doc or {}}


def hosts(time_x: dict[str, float], runs: dict, figures: dict) -> dict:
    """The machines the held-out runs ran on, each group's factor on the model's host terms (host_factor.py), at
    the fitted constants TIME_X and on the same runs: what a job's bar widens to in proportion to its host work
    (placement/envelope.with_host)."""
    spec = importlib.util.spec_from_file_location("host_factor", ROOT / "scripts/calibration/host_factor.py")
    hf = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hf)
    with at_constants(time_x):
        return {"_comment": HOSTS_COMMENT, "factors": hf.group_factors(done=hf.unbound_replays(runs, figures))}


def write_envelope(doc: dict, path: Path) -> None:
    lines = ["{", f'  "_comment": {json.dumps(doc["_comment"])},', '  "runs": [']
    lines += [f"    {json.dumps(r)}" + ("," if i < len(doc["runs"]) - 1 else "") for i, r in enumerate(doc["runs"])]
    path.write_text("\n".join(lines + ["  ],", f'  "hosts": {json.dumps(doc["hosts"])}', "}"]) + "\n")


def default_figures() -> list[Path]:
    return [FIGURES_FILE] + ([GRID2_FILE] if GRID2_FILE.exists() else [])


def fit(runs_file: Path, figures_files: list[Path] | Path | None = None) -> tuple[dict, list[dict], dict]:
    runs = json.loads(runs_file.read_text())["runs"]
    files = default_figures() if figures_files is None else (
        [figures_files] if isinstance(figures_files, Path) else list(figures_files))
    figures = {k: v for f in files for k, v in json.loads(f.read_text())["runs"].items()}
    done, time_x = fit_bound(runs, figures)
    per_gpu, n = per_gpu_pss(done)
    consts = constants(time_x, fit_host(done, per_gpu), per_gpu)
    return consts, table(done, consts), {"per_gpu_pss_samples": n, "hosts": hosts(time_x, runs, figures)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs-file", type=Path, default=CALIB.RUNS_FILE)
    ap.add_argument("--figures-file", type=Path, action="append",
                    help="runs kept as figures (default: multi_gpu_runs.json and grid2_runs.json when it exists)")
    ap.add_argument("--check", action="store_true",
                    help="exit 1 when the modules' constants or the envelope differ from the fit")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--write-envelope", action="store_true", help=f"write {ENVELOPE_FILE.relative_to(ROOT)}")
    a = ap.parse_args(argv)
    consts, rows, info = fit(a.runs_file, a.figures_file)
    differ = {k: (module_value(k), v) for k, v in consts.items() if not np.isclose(module_value(k), v, rtol=1e-6)}
    env = envelope(rows, info["hosts"])
    if a.write_envelope:
        write_envelope(env, ENVELOPE_FILE)
    shipped = json.loads(ENVELOPE_FILE.read_text()) if ENVELOPE_FILE.exists() else {}
    if shipped.get("runs") != env["runs"] or shipped.get("hosts") != env["hosts"]:
        differ["envelope"] = (f"{ENVELOPE_FILE.name} as shipped", "the fit's (run with --write-envelope)")
    if a.json:
        print(json.dumps({"constants": consts, "runs": rows, **info, "differ": differ}, indent=1))
    else:
        for k, v in consts.items():
            mark = "" if k not in differ else f"   (module has {differ[k][0]:.4g})"
            print(f"{k:<28} {v:g}{' GiB' if k in ('PER_GPU_PROCESS_BYTES', 'NODE_BYTES') else ''}{mark}")
        print(f"(per-GPU processes: PSS at {info['per_gpu_pss_samples']} sampled steps)")
        if "envelope" in differ:
            print(f"envelope: {differ['envelope'][0]} differs from {differ['envelope'][1]}")
        for r in rows:
            print(f"{r['run']} (time {r['time']}, host {r['host']})")
            for x in r["rows"]:
                print(f"  {x['what']:<16} predicted {x['predicted']:>7} measured {x['measured']:>7} {x['error']:+.1%}")
    return 1 if a.check and differ else 0


if __name__ == "__main__":
    sys.exit(main())
