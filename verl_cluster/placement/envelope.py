"""What the step-time model was calibrated on, and the error bar a predicted step carries (docs/placement.md,
"Error bars").

The envelope is the recorded verl runs the model is held against (catalog/step_time_envelope.json, written by
scripts/calibration/fit_plan_calibration.py --write-envelope), each with its axes and the model's step error on it: runs the
constants were fitted on ("fit"), runs they were not ("hold-out"), and runs looked at but neither fitted nor blind
("seen"). A family is the runs alike on every categorical axis; its micro batches and model sizes span a range.
A job inside a family of fit and hold-out runs is calibrated: its step carries the largest error among the runs not
fitted on (hold-out and seen) nearest it, those that share the most axes with it, and never less than its family's
own fit residual. A job outside
every family is uncalibrated: it carries the largest error the model has shown on any run it was not fitted on, and
names its nearest family and the axes it is outside on.
The host is an axis no job states: machines of one GPU kind ran the model's host terms up to ~1.4x apart (docs/
placement.md, "Batch V"). Every job's bar is at least what its own step would be off by on the fastest host a
held-out group ran on (the envelope's `hosts`), which is large where the step is the host's work and small where it
is the GPU's.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, replace
from functools import lru_cache
from pathlib import Path
from typing import Any, Optional

ENVELOPE_FILE = Path(__file__).resolve().parent.parent / "catalog" / "step_time_envelope.json"
# categorical axes (a family is alike on all of them), then the axes that span a range within a family
CATEGORICAL = ("gpu", "ranks", "nodes", "attention", "algorithm", "offload", "rollout")
RANGED = ("micro_update", "micro_log_prob", "params_b")
AXES = CATEGORICAL + RANGED
CALIBRATED_ROLES = ("fit", "hold-out")


def job_axes(*, gpu: str, ranks: int, nodes: int, packed: bool, flash: bool, adv_estimator: str, critic: bool,
             offload: str, eager: bool, micro_update: Optional[int], micro_log_prob: Optional[int],
             params: float) -> dict[str, Any]:
    """A job's (or a recorded run's) values on the axes the model was calibrated along."""
    attention = "packed (flash-attn)" if packed else ("padded" if flash else "padded, no flash-attn")
    return {"gpu": gpu, "ranks": ranks, "nodes": nodes, "attention": attention,
            "algorithm": adv_estimator + ("+critic" if critic else ""), "offload": offload,
            "rollout": "eager" if eager else "cuda graphs", "micro_update": micro_update,
            "micro_log_prob": micro_log_prob, "params_b": round(params / 1e9, 2)}


def phrase(axis: str, v: Any) -> str:
    """An axis value as the error bar's line says it."""
    if axis == "gpu":
        return str(v)
    if axis == "ranks":
        return f"{v} GPU{'s' if v != 1 else ''}"
    if axis == "nodes":
        return f"{v} node{'s' if v != 1 else ''}"
    if axis == "attention":
        return f"{v} attention"
    if axis == "algorithm":
        return {"grpo": "GRPO", "gae+critic": "PPO with a critic"}.get(str(v), str(v))
    if axis == "offload":
        return "no offload" if v == "none" else f"{v} offload"
    if axis == "rollout":
        return "enforce_eager" if v == "eager" else "CUDA graphs"
    if axis in ("micro_update", "micro_log_prob"):
        what = "micro" if axis == "micro_update" else "log-prob micro"
        if isinstance(v, (list, tuple)):
            return f"{what} {v[0]}" if v[0] == v[1] else f"{what} {v[0]}-{v[1]}"
        return f"{what} {'by token budget' if v is None else v}"
    if isinstance(v, (list, tuple)):
        return f"{v[0]:g}B" if v[0] == v[1] else f"{v[0]:g}-{v[1]:g}B"
    return f"{v:g}B"


@dataclass(frozen=True)
class Family:
    axes: dict[str, Any]  # categorical values
    ranges: dict[str, tuple]  # ranged axis -> (lowest, highest) over its runs; micro None: (None, None)
    runs: tuple[dict, ...]

    def outside(self, job: dict[str, Any]) -> list[str]:
        """The axes the job is outside this family on."""
        out = [a for a in CATEGORICAL if job.get(a) != self.axes.get(a)]
        for a in RANGED:
            lo, hi = self.ranges[a]
            v = job.get(a)
            if v is None or lo is None:
                if v is not lo:
                    out.append(a)
            elif not lo <= v <= hi:
                out.append(a)
        return out

    def describe(self) -> str:
        return ", ".join([phrase(a, self.axes[a]) for a in CATEGORICAL]
                         + [phrase(a, self.ranges[a]) for a in RANGED])


@dataclass(frozen=True)
class ErrorBar:
    pct: int  # ± percent on the step
    calibrated: bool
    why: str  # the line the plan prints after the ±
    nearest: str = ""  # the nearest calibrated family (uncalibrated jobs)
    outside: tuple[str, ...] = ()  # the axes the job is outside that family on
    runs: tuple[str, ...] = ()  # the runs the figure comes from
    axes: dict[str, Any] = field(default_factory=dict)
    host: Optional[dict[str, Any]] = None  # the fastest recorded host: its group, factor, this step's error there
    # the same runs' errors by their sign (predicted / measured - 1): over >= 0, the most the plan was over (a
    # faster run); under <= 0, the most it was under. The ± is the larger; the two say which way
    over: float = 0.0
    under: float = 0.0

    def line(self) -> str:
        return f"±{self.pct}%: {self.why}" if self.pct else self.why

    def to_dict(self) -> dict[str, Any]:
        out = {"pct": self.pct, "calibrated": self.calibrated, "why": self.why, "runs": list(self.runs),
               "axes": self.axes, "over": round(self.over, 3), "under": round(self.under, 3)}
        if not self.calibrated:
            out.update(nearest_family=self.nearest, outside=list(self.outside))
        if self.host is not None:
            out["host"] = self.host
        return out


def step_range(step_s: float, bar: Optional[dict[str, Any]]) -> Optional[tuple[float, float]]:
    """The seconds a step planned at STEP_S came in between on the runs BAR comes from: STEP_S / (1 + over) to
    STEP_S / (1 + under) (measured = predicted / (1 + error)); an under past -90% counts as -90% (10x the plan).
    None without a bar that has them."""
    if not bar or not bar.get("pct") or "over" not in bar:
        return None
    return step_s / (1 + bar["over"]), step_s / (1 + max(bar["under"], -0.9))


def _places(x: float) -> int:
    """The decimals a range prints X with: whole seconds from 10 s, tenths from 1, hundredths below."""
    return 0 if x >= 10 else 1 if x >= 1 else 2


def range_bounds(lo: float, hi: float) -> tuple[float, float]:
    """LO and HI as printed (_places), rounded outward."""
    def shown(x: float, up: bool) -> float:
        q = 10 ** _places(x)
        return (math.ceil(x * q - 1e-9) if up else math.floor(x * q + 1e-9)) / q
    return shown(lo, False), shown(hi, True)


def range_text(lo: float, hi: float) -> str:
    """'5.2-12 s' (range_bounds)."""
    return "-".join(f"{x:.{_places(x)}f}" for x in range_bounds(lo, hi)) + " s"


def with_range(t: dict[str, Any]) -> dict[str, Any]:
    """T (a step time's dict) with step_range_s from its step and error bar (step_range); none where the bar has
    none."""
    got = step_range(t.get("step_s") or 0.0, t.get("error_bar"))
    t.pop("step_range_s", None)
    if got is not None:
        t["step_range_s"] = [round(got[0], 2), round(got[1], 2)]
    return t


def _signs(errors: list[float]) -> tuple[float, float]:
    """The most over and the most under, each at least the ± bar's 5% floor (_round_up): a bar whose runs all
    came in over still allows a step a little slower than planned."""
    return max([0.05] + errors), min([-0.05] + errors)


def read_envelope(path: Path = ENVELOPE_FILE) -> dict[str, Any]:
    """The recorded runs' axes, roles and step errors (JSON written by scripts/calibration/fit_plan_calibration.py)."""
    return json.loads(path.read_text())


@lru_cache(maxsize=1)
def _shipped() -> Optional[dict[str, Any]]:
    try:
        return read_envelope()
    except (OSError, ValueError):
        return None


def families(runs: list[dict]) -> list[Family]:
    groups: dict[tuple, list[dict]] = {}
    for r in runs:
        if r["role"] in CALIBRATED_ROLES:
            groups.setdefault(tuple(json.dumps(r["axes"][a]) for a in CATEGORICAL), []).append(r)
    out = []
    for rs in groups.values():
        ranges = {}
        for a in RANGED:
            vals = [r["axes"][a] for r in rs if r["axes"][a] is not None]
            ranges[a] = (min(vals), max(vals)) if vals else (None, None)
        out.append(Family({a: rs[0]["axes"][a] for a in CATEGORICAL}, ranges, tuple(rs)))
    return out


def _round_up(x: float) -> int:
    """A fraction as a percent, up to the next 5."""
    return max(5, int(math.ceil(round(abs(x) * 100, 6) / 5.0) * 5))


def _shares(job: dict[str, Any], run: dict[str, Any]) -> int:
    """How many axes a run has the job's value on."""
    return sum(1 for a in AXES if job.get(a) == run["axes"].get(a))


def fastest_host(doc: Optional[dict[str, Any]] = None) -> Optional[tuple[str, float]]:
    """(group, factor) of the fastest host a held-out group ran on, when it ran the host terms faster than the fit."""
    doc = doc if doc is not None else _shipped()
    factors = ((doc or {}).get("hosts") or {}).get("factors") or {}
    if not factors:
        return None
    name = min(factors, key=factors.get)
    return (name, factors[name]) if factors[name] < 1.0 else None


def with_host(bar: ErrorBar, host: Optional[dict[str, Any]]) -> ErrorBar:
    """BAR, widened to the step's error on the fastest recorded host where that is larger (HOST: group, factor,
    error), and carrying it."""
    if host is None:
        return bar
    pct = _round_up(host["error"])
    over = max(bar.over, host["error"])
    if pct <= bar.pct:
        return replace(bar, host=host, over=over)
    why = (f"{bar.why}; on the fastest host recorded ({host['group']}: {host['factor']:.2f} of the fit's host time) "
           f"this step would be {host['error']:+.0%} over, its host work")
    return replace(bar, pct=pct, why=why, host=host, over=over)


# one machine's own runs, their host factors apart (check_run.host_fit; docs/placement.md): batch V's three 0.59 to
# 0.89 within a session, W's two 1.16x, R's one line 1.2x in 20 minutes. A plan at a machine's host factor is still
# this far from the next run's
MACHINE_DRIFT = 1.5


def with_drift(bar: ErrorBar, lo: float, hi: float, over: float, under: float) -> ErrorBar:
    """BAR of a plan made at a host factor, widened to the step's errors were the host at LO (its factor over
    MACHINE_DRIFT; OVER >= 0: the run faster than planned) and HI (times it; UNDER <= 0) where those are larger."""
    wide = {"over": max(bar.over, over), "under": min(bar.under, under)}
    pct = _round_up(max(over, -under))
    if pct <= bar.pct:
        return replace(bar, **wide)
    why = (f"{bar.why}; one machine's host moved up to {MACHINE_DRIFT:g}x between runs: at {lo:.2f} "
           f"to {hi:.2f} of the fit's host time this step would be {over:+.0%} to {under:+.0%}")
    return replace(bar, pct=pct, why=why, **wide)


def error_bar(job: dict[str, Any], doc: Optional[dict[str, Any]] = None,
              host: Optional[dict[str, Any]] = None) -> ErrorBar:
    """The error bar of a job's predicted step; HOST (group, factor, error) the step's error on the fastest recorded
    host (step_time computes it with fastest_host's factor)."""
    return with_host(_envelope_bar(job, doc), host)


def _envelope_bar(job: dict[str, Any], doc: Optional[dict[str, Any]] = None) -> ErrorBar:
    doc = doc if doc is not None else _shipped()
    if not doc or not doc.get("runs"):
        return ErrorBar(0, False, f"no calibration envelope ({ENVELOPE_FILE.name} missing or unreadable)", axes=job)
    runs = doc["runs"]
    fams = families(runs)
    unfitted = [r for r in runs if r["role"] != "fit"]
    home = next((f for f in fams if not f.outside(job)), None)
    if home is not None:
        best = max((_shares(job, r) for r in unfitted), default=0)
        near = [r for r in unfitted if _shares(job, r) == best]
        errors = [r["step_error"] for r in near] + [r["step_error"] for r in home.runs if r["role"] == "fit"]
        names = tuple(r["run"] for r in near)
        why = (f"the largest step error of the runs not fitted on nearest this job ({', '.join(names)}) and of its "
               f"family's fit runs")
        over, under = _signs(errors)
        return ErrorBar(_round_up(max(map(abs, errors))), True, why, runs=names, axes=job, over=over, under=under)
    nearest = min(fams, key=lambda f: (len(f.outside(job)), -len(f.runs)))
    out = nearest.outside(job)
    worst = max(abs(r["step_error"]) for r in unfitted) if unfitted else 1.0
    said = ", ".join(phrase(a, job.get(a)) for a in out)
    why = (f"uncalibrated: {said} is outside the calibrated range (nearest family: {nearest.describe()}); the "
           "largest step error the model has shown on runs it was not fitted on")
    over, under = _signs([r["step_error"] for r in unfitted]) if unfitted else (1.0, -0.5)  # ±100%: half to twice
    return ErrorBar(_round_up(worst), False, why, nearest.describe(), tuple(out),
                    tuple(r["run"] for r in unfitted), job, over=over, under=under)
