"""Correction factors from runs held against their plans (check_run.pairs rows), and a plan with them applied.

A factor is measured / predicted, the geometric mean over the runs that have the figure: 1.2 says runs took 20%
longer (or used 20% more RAM) than planned. scripts/plan_factors.py makes a factors file from `jobs --json`;
`plan --factors FILE` applies it.
"""

from __future__ import annotations

import json
import math
from dataclasses import replace
from typing import Any, Iterable, Optional

from verl_cluster.config.loader import NotRegularFile, open_regular
from verl_cluster.errors import ConfigError
from verl_cluster.placement.check_run import STEP_PHASES, host_ratios
from verl_cluster.placement.envelope import MACHINE_DRIFT, error_bar, with_drift, with_range

MIN_RUNS = 2  # a figure from fewer runs is shown, not applied
FACTOR_RANGE = (0.05, 20.0)  # measured / predicted: a plan 20 times off is a wrong plan, not a factor to apply
MAX_RUNS = 10**6
MAX_FILE_BYTES = 2**20
STEP, HOST, SAVE = "step", "host_gib", "save_checkpoint_s"
# the factor on the plan's host terms that explained earlier runs (their vs_plan_host): unlike a phase's factor it
# carries over to another job on the same machines (batch W: one factor put two families within 3%)
HOST_FACTOR = "host_factor"
HOST_FACTOR_RANGE = (0.5, 2.0)  # step_time.HOST_GRID's ends: the plan keeps its phases between them
FIGURES = STEP_PHASES + (STEP, SAVE, HOST, HOST_FACTOR)


def figure_of(what: str) -> Optional[str]:
    """The factor name of a pairs row's `what` (None: a figure no factor is made for, GPU memory)."""
    if what == "time step (s)":
        return STEP
    if what.startswith("time ") and what.endswith(" (s)"):
        name = what[5:-4]
        return name if name in STEP_PHASES else None
    return {"save_checkpoint (s)": SAVE, "host RAM per node (GiB)": HOST,
            "host RAM, all nodes on one machine (GiB)": HOST}.get(what)


def ratio(row: dict) -> Optional[float]:
    """measured / predicted from the row's error (predicted / measured - 1), which keeps the precision that the
    rounded seconds lose for short phases; None for a row with no usable ratio."""
    try:
        x = 1.0 / (1.0 + float(row["error"]))
    except (KeyError, TypeError, ValueError, ZeroDivisionError):
        return None
    return x if math.isfinite(x) and x > 0 else None


def compute(runs: Iterable[list[dict]], min_runs: int = MIN_RUNS,
            hosts: Iterable[Optional[dict]] = ()) -> dict[str, dict[str, Any]]:
    """{figure: {factor, runs, min, max, enough}} from each run's pairs rows, and host_factor from the runs' host fits
    (vs_plan_host) that explained them."""
    got: dict[str, list[float]] = {}
    for rows in runs:
        for row in rows:
            name, x = figure_of(str(row.get("what", ""))), ratio(row)
            if name and x is not None:
                got.setdefault(name, []).append(x)
    for h in hosts:
        x = (h or {}).get("factor")
        if (h or {}).get("explains") and isinstance(x, (int, float)) and not isinstance(x, bool) and x > 0:
            got.setdefault(HOST_FACTOR, []).append(float(x))
    out = {}
    for name in sorted(got, key=FIGURES.index):
        xs = got[name]
        out[name] = {"factor": round(math.exp(sum(map(math.log, xs)) / len(xs)), 4), "runs": len(xs),
                     "min": round(min(xs), 4), "max": round(max(xs), 4), "enough": len(xs) >= min_runs}
    return out


def read_factors(path: str) -> dict[str, tuple[float, Optional[int], bool]]:
    """{figure: (factor, runs or None, enough)} from a factors file ({"factors": {figure: {factor, runs, ...} or a
    number}}). ConfigError naming the file and field for anything else."""
    text = _read_regular(path)
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        raise ConfigError(f"--factors {path}: invalid JSON: {e.msg} (line {e.lineno})",
                          "make it with scripts/plan_factors.py --out FILE")
    except RecursionError:
        raise ConfigError(f"--factors {path}: invalid JSON: nested too deep")
    table = doc.get("factors") if isinstance(doc, dict) else None
    if not isinstance(table, dict):
        raise ConfigError(f"--factors {path}: expected an object with `factors` ({{figure: {{factor, runs}}}})",
                          "make it with scripts/plan_factors.py --out FILE")
    out = {}
    for name, v in table.items():
        where = f"--factors {path}: factors.{name}"
        if name not in FIGURES:
            raise ConfigError(f"{where}: not a figure the plan predicts", f"one of {', '.join(FIGURES)}")
        entry = v if isinstance(v, dict) else {"factor": v}
        f, runs = entry.get("factor"), entry.get("runs")
        if isinstance(f, bool) or not isinstance(f, (int, float)) or not math.isfinite(f) or f <= 0:
            raise ConfigError(f"{where}.factor: must be a positive number, got {json.dumps(f)}", "e.g. 1.15")
        lo, hi = HOST_FACTOR_RANGE if name == HOST_FACTOR else FACTOR_RANGE
        if name == HOST_FACTOR and not lo <= f <= hi:
            raise ConfigError(f"{where}.factor: {f:g} is out of range: the plan keeps its phases at host factors "
                              f"{lo:g} to {hi:g}", "make the file with scripts/plan_factors.py from `jobs --json`")
        if not lo <= f <= hi:
            raise ConfigError(f"{where}.factor: {f:g} is out of range: a factor (measured / predicted) is from {lo:g} "
                              f"to {hi:g}", "make the file with scripts/plan_factors.py from runs of this job")
        if runs is not None and (isinstance(runs, bool) or not isinstance(runs, int) or not 0 <= runs <= MAX_RUNS):
            raise ConfigError(f"{where}.runs: must be a whole number of runs (0 to {MAX_RUNS}), got "
                              f"{json.dumps(runs)[:40]}")
        enough = entry.get("enough", True if runs is None else runs >= MIN_RUNS)
        if not isinstance(enough, bool):
            raise ConfigError(f"{where}.enough: must be true or false, got {json.dumps(enough)[:40]}")
        out[name] = (float(f), runs, enough)
    return out


def _read_regular(path: str) -> str:
    """The factors file's text: a regular file (a FIFO would hang the read, a device never end), at most 1 MiB."""
    try:
        with open_regular(path) as f:
            raw = f.read(MAX_FILE_BYTES + 1)
    except FileNotFoundError:
        raise ConfigError(f"--factors {path}: file not found", "make it with scripts/plan_factors.py --out FILE")
    except (IsADirectoryError, NotRegularFile):
        raise ConfigError(f"--factors {path}: not a regular file", "name the JSON file plan_factors.py wrote")
    except OSError as e:
        raise ConfigError(f"--factors {path}: cannot read: {e.strerror or e}")
    if len(raw) > MAX_FILE_BYTES:
        raise ConfigError(f"--factors {path}: larger than 1 MiB; not a factors file")
    try:
        return raw.decode()
    except UnicodeDecodeError as e:
        raise ConfigError(f"--factors {path}: not UTF-8 text (byte {e.start})")


def _scaled_time(t: Optional[dict], f: dict[str, float]) -> Optional[dict]:
    if not t:
        return t
    phases = {k: round(v * f.get(k, 1.0), 2) for k, v in t["phases_s"].items()}
    step = round(sum(phases.values()), 2)
    rate = t.get("tokens_per_gpu_s", 0.0) * (t["step_s"] / step if step > 0 else 1.0)  # the same tokens, more time
    return {**t, "phases_s": phases, "step_s": step, "save_checkpoint_s": round(t["save_checkpoint_s"] * f.get(SAVE, 1.0), 2),
            "tokens_per_gpu_s": round(rate, 1)}


def _adjusted(t: Optional[dict], used: dict[str, float], ratios: Optional[dict[str, float]],
              speed: Optional[float] = None) -> Optional[dict]:
    """T with the factors USED applied; with RATIOS (T's phases at host factor SPEED over their own: host_ratios),
    the phases at that host's speed in place of their own factors (those were measured with the host in them). With
    RATIOS the plan keeps its table of host factors and says SPEED (`host_factor`), so a run's host fit is still
    the host's against the calibrated hosts' (check_run.host_fit takes the factor back out), and its error bar is
    the envelope's widened by a machine's own drift (envelope.with_drift), no longer the fastest host's: the host's
    speed is stated. A plan a phase's own factor changed keeps no table (a host fit against it would count the
    factors twice)."""
    f = used if ratios is None else {**{k: v for k, v in used.items() if k not in STEP_PHASES}, **ratios}
    out = _scaled_time(t, f)
    if out is None or not (ratios or any(k in STEP_PHASES for k in f)):
        return out
    if ratios and speed is not None and out.get("by_host_factor"):
        out["host_factor"] = speed
    else:
        out.pop("by_host_factor", None)
    bar = out.get("error_bar") or {}
    if ratios and bar.get("axes"):
        stated = error_bar(bar["axes"])
        if speed is not None and out.get("by_host_factor") and out["step_s"] > 0:
            def step_at(h: float) -> float:
                r = host_ratios(t, h) or {}
                return sum(v * r.get(k, 1.0) for k, v in t["phases_s"].items())

            table = out["by_host_factor"]  # the plan keeps its phases at host factors within its table only
            lo, hi = max(speed / MACHINE_DRIFT, table[0][0]), min(speed * MACHINE_DRIFT, table[-1][0])
            fast, slow = step_at(lo), step_at(hi)
            stated = with_drift(stated, lo, hi, out["step_s"] / fast - 1 if fast > 0 else 0.0,
                                out["step_s"] / slow - 1 if slow > 0 else 0.0)
        out["error_bar"] = stated.to_dict()
    return with_range(out)


def factors_note(factors: dict[str, tuple[float, Optional[int], bool]], source: str = "",
                 host_applied: Optional[bool] = None) -> str:
    """Which factors are applied, from how many runs, and which are not (HOST_APPLIED: whether the plan could take
    the host factor; None where no plan was made)."""
    host = factors.get(HOST_FACTOR)
    on_host = bool(host and host[2] and host_applied is not False)
    words = [f"{k} x{f:g}" + (f" ({runs} runs)" if runs is not None else "")
             for k, (f, runs, enough) in factors.items()
             if enough and k != STEP and (k != HOST_FACTOR or on_host) and not (on_host and k in STEP_PHASES)]
    skipped = [k for k, (_, _, enough) in factors.items() if not enough]
    note = f"factors from {source or 'a file'} applied: {', '.join(words) or 'none'}"
    if on_host:
        note += ("; the phases as on a host at that factor of the fit's host time (the plan's phases at host factors), "
                 "so the phases' own factors are not applied")
    elif host and host[2]:
        note += "; host_factor not applied: the plan kept no phases at host factors"
    if skipped:
        note += f"; not applied, fewer than {MIN_RUNS} runs: {', '.join(skipped)}"
    if STEP in factors:
        note += "; the step is the sum of its phases (its own factor is not applied)"
    return note


def apply_factors(plan, factors: dict[str, tuple[float, Optional[int], bool]], source: str = "",
                  note: Optional[str] = None):
    """The Plan with each phase's seconds, the checkpoint save and host RAM (every part) times its factor, the step
    the sum of its phases; figures from too few runs and the step's own factor are named in the notes, not applied.
    NOTE: what the plan says of them where the host factor took (factors_note's when None, or when it did not)."""
    if plan is None:
        return None
    used = {k: f for k, (f, _, enough) in factors.items() if enough and k != STEP}
    speed = used.pop(HOST_FACTOR, None)  # the host's, against the fit's
    ratios = host_ratios(plan.time or {}, speed) if speed is not None else None
    on_host = ratios is not None
    note = note if note and on_host else factors_note(factors, source, on_host)
    time, reasons = _adjusted(plan.time, used, ratios, speed), plan.reasons
    if time is not None:
        time["notes"] = list(time.get("notes") or []) + [note]
    else:
        reasons += (note,)
    at = plan.time_at
    h = used.get(HOST, 1.0)
    warnings = plan.warnings
    need = plan.host_gib_per_node * h
    if h != 1.0 and plan.host_mem_gib is not None and need > 0.9 * plan.host_mem_gib:
        warnings += (f"host memory {need:.1f} GiB per node with the factors applied is over "
                     f"{'the' if need > plan.host_mem_gib else '90% of the'} {plan.host_mem_gib:.0f} GiB RAM",)

    def time_at(fill: float, host_table: bool = False) -> Optional[dict]:  # each fill through its own host table
        t = at(fill, True) if on_host else at(fill)
        return _adjusted(t, used, host_ratios(t or {}, speed) if on_host else None, speed)

    return replace(plan, time=time, time_at=None if at is None else time_at,
                   host_gib_per_node=need, host_parts={k: v * h for k, v in plan.host_parts.items()},
                   host_worker_gib=plan.host_worker_gib * h,
                   warnings=warnings, reasons=reasons)
