"""How long a verl run has left, from its own log: the measured time per step, the checkpoint saves and
validations still to come, and the plan's step time beside it.

verl 0.9.1's trainers (ray_trainer.py and ppo/v1/trainer_base.py alike) time each step as `timing_s/step`, which
includes `timing_s/save_checkpoint` on the steps that save (every `trainer.save_freq`-th step and the last one)
but not `timing_s/testing` (validation, every `trainer.test_freq`-th step and the last one, timed after the step).
A step's time here is therefore `timing_s/step - timing_s/save_checkpoint`, saves and validations are projected
apart, and the first step of each start (the first the log shows, or one that does not follow the step before:
a resumed run, or a reader that came in late) is left out: it pays for start-up and compiles.

The run's length comes from the log (`Total training steps: N` from ray_trainer, the `Training Progress ... k/N`
bar both trainers draw, the config verl prints) or, until the log says it, from the job's command line
(`trainer.total_training_steps=N`): unset, verl counts it from the data (epochs x batches) and only the log can say.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import asdict, dataclass, field
from typing import Any, Mapping, Optional

from verl_cluster.placement.envelope import range_bounds, range_text, step_range

WINDOW = 20  # steps the time per step is the mean of: the newest (RL responses, and so steps, grow as it trains)
_TOTAL = re.compile(r"Total training steps: (\d+)")
_BAR = re.compile(r"Training Progress:.*?\|\s*(\d+)/(\d+) \[")
_CONFIG = re.compile(r"'(save_freq|test_freq)': (-?\d+)")  # verl's printed config (pprint): keys only trainer has
_ENTRY = "Running entrypoint for job "
_WORD = re.compile(r"^\+{0,2}trainer\.(total_training_steps|save_freq|test_freq)=['\"]?(-?\d+)['\"]?$")
_OWN_CONFIG = ("--config-name", "--config-path", "-cn", "-cp", "--config-dir", "-cd")


def due(last: int, total: int, freq: Optional[int]) -> int:
    """How many of the steps after `last` up to `total` do a thing verl does every `freq` steps and at the last."""
    if not freq or freq <= 0 or total <= last:
        return 0
    return total // freq - last // freq + (1 if total % freq else 0)


@dataclass
class RunEta:
    """Fed each step's metrics (and the lines that tell the run's length) as the log streams; JSON-able, so a
    reader resuming later goes on with the same figures."""
    total: Optional[int] = None  # trainer.total_training_steps as verl uses it
    total_from: str = ""  # "log" (verl said it) or "command" (the job's command line)
    save_freq: Optional[int] = None
    test_freq: Optional[int] = None
    last: Optional[int] = None  # the newest training step
    recent: list = field(default_factory=list)  # [seconds without the save, tokens or None] of the newest steps
    counted: int = 0  # steps counted since the start (the first of each start left out)
    saves: list = field(default_factory=lambda: [0.0, 0])  # timing_s/save_checkpoint: sum, count
    tests: list = field(default_factory=lambda: [0.0, 0])  # timing_s/testing: sum, count

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, doc: Optional[Mapping[str, Any]]) -> "RunEta":
        names = cls.__dataclass_fields__
        return cls(**{k: v for k, v in (doc or {}).items() if k in names})

    def add(self, step: int, m: Mapping[str, float]) -> None:
        """One console-logger line's metrics."""
        if "timing_s/testing" in m:
            self.tests = [self.tests[0] + m["timing_s/testing"], self.tests[1] + 1]
        if "timing_s/step" not in m:
            return  # a validation-only line (step 0's before training)
        save = m.get("timing_s/save_checkpoint")
        if save is not None:
            self.saves = [self.saves[0] + save, self.saves[1] + 1]
        if self.last is not None and step == self.last + 1:  # follows the step before it: no start in between
            self.recent.append([m["timing_s/step"] - (save or 0.0), m.get("perf/total_num_tokens")])
            del self.recent[:-WINDOW]
            self.counted += 1
        self.last = step

    def read_line(self, line: str) -> None:
        """A line that may tell the run's length or its save/validation frequency."""
        if "Training Progress" in line:
            bars = _BAR.findall(line)  # tqdm redraws with \r: the last drawing counts
            if bars and int(bars[-1][1]) > 0:
                self.total, self.total_from = int(bars[-1][1]), "log"
        elif "Total training steps" in line:
            m = _TOTAL.search(line)
            if m:
                self.total, self.total_from = int(m.group(1)), "log"
        elif "_freq'" in line:
            for key, value in _CONFIG.findall(line):
                setattr(self, key, int(value))
        elif line.startswith(_ENTRY):
            self.learn_command(line.partition(": ")[2])

    def learn_command(self, command: str) -> None:
        """The job's command line (Ray's entrypoint): what it sets of the run's length and frequencies. A verl
        trainer without a config of its own keeps verl's defaults for the frequencies it does not set (-1: off)."""
        try:
            words = shlex.split(command or "")
        except ValueError:
            words = (command or "").split()
        got: dict[str, int] = {}
        for w in words:
            m = _WORD.match(w)
            if m:
                got[m.group(1)] = int(m.group(2))
        if "total_training_steps" in got and self.total_from != "log":
            self.total, self.total_from = got["total_training_steps"], "command"
        defaults = any(w.startswith("verl.trainer.") for w in words) and not any(
            w.split("=")[0] in _OWN_CONFIG for w in words)
        for key in ("save_freq", "test_freq"):
            if getattr(self, key) is None and (key in got or defaults):
                setattr(self, key, got.get(key, -1))

    def estimate(self, predicted: Optional[Mapping[str, Any]] = None) -> Optional[dict[str, Any]]:
        """The figures and the line, once a step after the first of its start is in; else None."""
        if not self.recent:
            return None
        from verl_cluster.placement.check_run import planned_step_s

        step_s = sum(x[0] for x in self.recent) / len(self.recent)
        toks = [x[1] for x in self.recent if x[1]]
        out: dict[str, Any] = {"step": self.last, "total_steps": self.total, "step_s": round(step_s, 2),
                               "steps_counted": self.counted, "steps_in_mean": len(self.recent)}
        if predicted:
            plan, fill = planned_step_s(predicted, sum(toks) / len(toks) if toks else None)
            if plan:
                out["plan_step_s"] = round(plan, 2)
                out["vs_plan"] = round(step_s / plan - 1.0, 3)  # + : slower than planned
                got = step_range(plan, predicted.get("error_bar"))
                if got is not None:  # the seconds the plan's bar allows, as printed, and whether the run is inside
                    lo, hi = out["plan_range_s"] = list(range_bounds(*got))
                    out["in_plan_range"] = lo <= step_s <= hi
                if fill is not None:
                    out["at_fill"] = round(fill, 3)
        if self.total is not None:
            left = max(0, self.total - self.last)
            left_s = left * step_s
            out.update(steps_left=left, total_from=self.total_from)
            for name, freq, (total, n), plan_s in (
                    ("saves", self.save_freq, self.saves, (predicted or {}).get("save_checkpoint_s")),
                    ("validations", self.test_freq, self.tests, None)):
                if freq is None:
                    out[f"{name}_left"] = None  # not known: not counted
                    continue
                k = due(self.last, self.total, freq)
                each = total / n if n else (plan_s or None)
                out[f"{name}_left"] = k
                if k:
                    out[f"{name[:-1]}_s"] = round(each, 2) if each else None
                    out[f"{name[:-1]}_s_from"] = "measured" if n else ("plan" if each else "")
                    left_s += k * (each or 0.0)
            out["left_s"] = round(left_s, 1)
        out["text"] = eta_line(out)
        return out


def eta_line(e: Mapping[str, Any]) -> str:
    """'step 12/200: 31.1 s/step (plan 27.5, +13%), ~1h38m left incl. 9 saves (~45 s each)'; a step outside the
    seconds the plan's error bar allows says so: '(plan 9.3, +45%: outside its 5.3-12 s)'."""
    head = f"step {e['step']}" + (f"/{e['total_steps']}" if e.get("total_steps") is not None else "")
    off = f": outside its {range_text(*e['plan_range_s'])}" if e.get("in_plan_range") is False else ""
    plan = f" (plan {e['plan_step_s']:g}, {e['vs_plan']:+.0%}{off})" if e.get("plan_step_s") else ""
    text = f"{head}: {e['step_s']:g} s/step{plan}"
    if e.get("total_steps") is None:
        return text + ", total steps unknown (verl counts them from the data and has not said them yet)"
    if not e.get("steps_left"):
        return text + ", last step"
    parts, untimed = [], []
    for name in ("saves", "validations"):
        k = e.get(f"{name}_left")
        if k is None:
            untimed.append(f"{name} not counted (trainer.{'save' if name == 'saves' else 'test'}_freq unknown)")
        elif k and e.get(f"{name[:-1]}_s"):
            parts.append(f"{k} {name if k > 1 else name[:-1]} (~{duration(e[f'{name[:-1]}_s'])} each)")
        elif k:
            untimed.append(f"{k} {name if k > 1 else name[:-1]} not timed yet")
    text += f", ~{duration(e['left_s'])} left" + (" incl. " + " and ".join(parts) if parts else "")
    return text + "".join(f"; {u}" for u in untimed)


def duration(s: float) -> str:
    """0.05 s, 45 s, 4m10s, 38m, 1h38m, 2d4h."""
    if s < 9.5:
        return f"{max(0.0, s):.2g} s"
    s = int(round(s))
    if s < 60:
        return f"{s} s"
    if s < 600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 3600:
        return f"{s // 60}m"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600}h"


MATERIAL = 0.10  # a new line when the time per step, or the projected end, moved by this much
FOLLOW_EVERY = (0.0, 300.0)  # the terminal follow: any step that moves the estimate, else every 5 minutes
WATCH_EVERY = (600.0, 3600.0)  # watch events (and the user's notify command): at most every 10 min, else hourly


class EtaTicker:
    """When a reader says the estimate again: the first one (step 2, or the second of a resumed start), then on a
    new step only when it moved materially (time per step or projected end by 10%, at least a minute; the total
    learned) or `every_s` has passed, never sooner than `min_gap_s` after the last."""

    def __init__(self, every: tuple[float, float] = FOLLOW_EVERY):
        self.min_gap_s, self.every_s = every
        self.said: Optional[Mapping[str, Any]] = None
        self.at = 0.0

    def due(self, est: Optional[Mapping[str, Any]], now: float) -> Optional[str]:
        if not est:
            return None
        said = self.said
        if said is not None:
            if est["step"] == said["step"] or now - self.at < self.min_gap_s:
                return None
            if now - self.at < self.every_s and not self._moved(said, est, now):
                return None
        self.said, self.at = est, now
        return est["text"]

    def _moved(self, said: Mapping[str, Any], est: Mapping[str, Any], now: float) -> bool:
        if est.get("total_steps") != said.get("total_steps"):
            return True
        if abs(est["step_s"] - said["step_s"]) >= MATERIAL * max(said["step_s"], 1e-3):
            return True
        if est.get("left_s") is None or said.get("left_s") is None:
            return False
        shift = abs((now + est["left_s"]) - (self.at + said["left_s"]))
        return shift >= max(60.0, MATERIAL * est["left_s"])
