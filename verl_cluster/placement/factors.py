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
from verl_cluster.placement.check_run import STEP_PHASES

MIN_RUNS = 2  # a figure from fewer runs is shown, not applied
FACTOR_RANGE = (0.05, 20.0)  # measured / predicted: a plan 20 times off is a wrong plan, not a factor to apply
MAX_RUNS = 10**6
MAX_FILE_BYTES = 2**20
STEP, HOST, SAVE = "step", "host_gib", "save_checkpoint_s"
FIGURES = STEP_PHASES + (STEP, SAVE, HOST)


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


def compute(runs: Iterable[list[dict]], min_runs: int = MIN_RUNS) -> dict[str, dict[str, Any]]:
    """{figure: {factor, runs, min, max, enough}} from each run's pairs rows."""
    got: dict[str, list[float]] = {}
    for rows in runs:
        for row in rows:
            name, x = figure_of(str(row.get("what", ""))), ratio(row)
            if name and x is not None:
                got.setdefault(name, []).append(x)
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
        lo, hi = FACTOR_RANGE
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


def factors_note(factors: dict[str, tuple[float, Optional[int], bool]], source: str = "") -> str:
    """Which factors are applied, from how many runs, and which are not."""
    words = [f"{k} x{f:g}" + (f" ({runs} runs)" if runs is not None else "")
             for k, (f, runs, enough) in factors.items() if enough and k != STEP]
    skipped = [k for k, (_, _, enough) in factors.items() if not enough]
    note = f"factors from {source or 'a file'} applied: {', '.join(words) or 'none'}"
    if skipped:
        note += f"; not applied, fewer than {MIN_RUNS} runs: {', '.join(skipped)}"
    if STEP in factors:
        note += "; the step is the sum of its phases (its own factor is not applied)"
    return note


def apply_factors(plan, factors: dict[str, tuple[float, Optional[int], bool]], source: str = ""):
    """The Plan with each phase's seconds, the checkpoint save and host RAM (every part) times its factor, the step
    the sum of its phases; figures from too few runs and the step's own factor are named in the notes, not applied."""
    if plan is None:
        return None
    used = {k: f for k, (f, _, enough) in factors.items() if enough and k != STEP}
    note = factors_note(factors, source)
    time, reasons = _scaled_time(plan.time, used), plan.reasons
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
    return replace(plan, time=time, time_at=None if at is None else (lambda fill: _scaled_time(at(fill), used)),
                   host_gib_per_node=need, host_parts={k: v * h for k, v in plan.host_parts.items()},
                   host_worker_gib=plan.host_worker_gib * h,
                   warnings=warnings, reasons=reasons)
