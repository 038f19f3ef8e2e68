"""How much faster or slower than the fit's hosts each recorded run's host ran: the factor on the step-time model's
host terms (step_time.HOST_TERMS) that puts its step at what it measured, the model's constants as they are, and
one factor for each group of runs that shared a machine. A diagnostic of the recorded runs, not a prediction: a
plan cannot know its host's factor before the run (docs/placement.md, "Batch V").

    python3 scripts/calibration/host_factor.py [--json] [--group NAME=RUN,RUN ...]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from verl_cluster.placement import step_time  # noqa: E402

# held-out runs by where they ran: batches V and W (one H100 machine each, one session), W's last run with X's on
# another, and the one-H100 grid's held-out runs (batches B-D, three H100 machines one after another, 2026-11-26)
GROUPS = {"batch V's H100, 2026-12-07": ("g1fa-m4", "g1pad15b-m8", "g1ppo15b-m8"),
          "batch W's H100, 2026-12-07": ("g1fa15b-m4", "g1ppo-m4"),
          "batches W and X's H100, 2026-12-07 16:00": ("g1pad-m4", "g1ppo-m4-b"),
          "batch X's H100, 2026-12-07 19:09": ("g1fa15b-m4-b",),
          "batch Y's H100, 2026-12-08 00:28": ("g1fa-m4-b",),
          "the one-H100 grid's held-out runs, 3 machines, 2026-11-26": ("hold-padded05", "hold-ppo15off", "hold-grpo3n8",
                                                   "hold-grpo05wide", "hold-grpo15big")}
FACTORS = [f / 100 for f in range(40, 161)]  # 0.40 ... 1.60


def load_fit():
    spec = importlib.util.spec_from_file_location("fit_plan_calibration",
                                                  ROOT / "scripts/calibration/fit_plan_calibration.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def unbound_replays(runs: dict | None = None, figures: dict | None = None) -> dict:
    """Every recorded run's plan (RUNS and FIGURES as fit_plan_calibration reads them; its files by default) with
    both sides of each micro-batched phase kept and the generate's raw seconds: the factor goes on the host's side
    before bound() and polled() choose."""
    fit = load_fit()
    if runs is None:
        runs = json.loads(fit.CALIB.RUNS_FILE.read_text())["runs"]
    if figures is None:
        figures = {k: v for f in fit.default_figures() for k, v in json.loads(f.read_text())["runs"].items()}
    with fit.patched(lambda t, ranks=1, value=None: t, lambda t, value=None: t):
        return fit.replays(runs, figures)


def step_error(replay: tuple, h: float) -> float:
    """The step's error (predicted / measured - 1) over the phases the run measured, the host terms times H."""
    _, plan, got = replay
    phases = step_time.at_host(plan.terms["time"], plan.time["error_bar"]["axes"]["ranks"], h)
    measured = [ph for ph in phases if got["phases_s"].get(ph)]
    return sum(step_time.seconds(phases[ph]) for ph in measured) / sum(got["phases_s"][ph] for ph in measured) - 1


def best_factor(replays: list[tuple]) -> float:
    """The factor of FACTORS with the least sum of squared step errors over REPLAYS."""
    return min(FACTORS, key=lambda h: (sum(step_error(r, h) ** 2 for r in replays), abs(h - 1)))


def group_factors(groups: dict[str, tuple[str, ...]] = GROUPS, done: dict | None = None) -> dict[str, float]:
    """Each group's one factor (best_factor over its runs): what the envelope ships as the hosts seen. A group whose
    runs are not all recorded is left out."""
    done = done if done is not None else unbound_replays()
    return {name: best_factor([done[n] for n in members]) for name, members in groups.items()
            if all(n in done for n in members)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--group", action="append", default=[], metavar="NAME=RUN,RUN",
                    help="runs given one factor (default: batch V, the one-H100 grid's held-out runs)")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    groups = dict(GROUPS) if not a.group else {
        g.partition("=")[0]: tuple(g.partition("=")[2].split(",")) for g in a.group}
    done = unbound_replays()
    unknown = sorted({n for runs in groups.values() for n in runs} - set(done))
    if unknown:
        print(f"error: no recorded run named {', '.join(unknown)} (the runs: {', '.join(done)})", file=sys.stderr)
        return 2
    runs = [{"run": n, "role": e.get("time"), "error": round(step_error((e, p, g), 1.0), 3),
             "factor": best_factor([(e, p, g)])} for n, (e, p, g) in done.items()]
    out_groups = [{"group": name, "factor": h, "errors": {n: round(step_error(done[n], h), 3) for n in groups[name]}}
                  for name, h in group_factors(groups, done).items()]
    if a.json:
        print(json.dumps({"runs": runs, "groups": out_groups}, indent=1))
        return 0
    for r in runs:
        print(f"{r['run']:<16} {r['role']:<9} step {r['error']:+.1%} as fitted; host factor {r['factor']:.2f}")
    for g in out_groups:
        errs = ", ".join(f"{n} {e:+.1%}" for n, e in g["errors"].items())
        print(f"{g['group']}: one factor {g['factor']:.2f} -> {errs}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
