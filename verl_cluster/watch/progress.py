"""What an attempt's log says about training progress: the steps it ran, the checkpoints it saved, and where it
started — so the watcher can say "resumed from step N", count the steps a failure cost, and catch an attempt that
silently started again from step 1 while a checkpoint exists (verl's resume has such failure modes: a tracker file
on storage the new driver does not see, a relative default_local_dir under another working folder).

verl 0.9 prints `Saving checkpoint to DIR/global_step_N` when a save starts and its `step:N - ...` metrics line
after it ends; `Resuming from DIR/global_step_N, setting global step to N` or `Training from scratch` when it
starts. Older trainers print `local_global_step_folder: DIR/global_step_N`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Optional

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_PREFIX = re.compile(r"^\s*(?:\([^)]*\)\s*)?")  # Ray's "(TaskRunner pid=12) " before an actor's line
STEP = re.compile(r"^step[: ](\d+)\b")
SAVE = re.compile(r"(?:Saving checkpoint to|local_global_step_folder:)\s*(\S*global_step_(\d+))")
RESUMED = re.compile(r"Resuming from (\S*global_step_(\d+))")
SCRATCH = re.compile(r"Training from scratch")


@dataclass
class Progress:
    steps: list[int] = field(default_factory=list)  # step numbers in the order they were logged
    saves: list[tuple[int, bool]] = field(default_factory=list)  # (step, complete: progress logged after it)
    resumed_from: Optional[int] = None  # the step verl says it loaded; 0 for "Training from scratch"
    resume_path: str = ""

    @property
    def first_step(self) -> Optional[int]:
        return self.steps[0] if self.steps else None

    @property
    def last_step(self) -> int:
        return max(self.steps, default=0)

    @property
    def checkpoint(self) -> int:
        """The newest checkpoint this attempt finished saving (0: none)."""
        return max((s for s, done in self.saves if done), default=0)

    def lost(self, since: int = 0) -> int:
        """Steps done after the newest finished checkpoint (by this attempt or, `since`, an earlier one)."""
        return max(0, self.last_step - max(self.checkpoint, since))


def read_progress(text: str) -> Progress:
    p = Progress()
    pending: list[int] = []  # saves started, not yet followed by progress
    for raw in text.splitlines():
        line = _ANSI.sub("", raw)
        m = RESUMED.search(line)
        if m:
            p.resumed_from, p.resume_path = int(m.group(2)), m.group(1).rstrip(",")
            continue
        if p.resumed_from is None and SCRATCH.search(line):
            p.resumed_from = 0
            continue
        m = SAVE.search(line)
        if m:
            if "local_global_step_folder" in line and "Saving" not in line:
                p.saves.append((int(m.group(2)), True))  # printed once written (the CPU stand-in, older verl)
            else:
                pending.append(int(m.group(2)))
            continue
        m = STEP.match(_PREFIX.sub("", line, count=1))
        if m:
            n = int(m.group(1))
            p.steps.append(n)
            done = [s for s in pending if s <= n]
            p.saves += [(s, True) for s in done]
            pending = [s for s in pending if s > n]
    p.saves += [(s, False) for s in pending]
    # the same step logged twice (a progress bar and the metrics line) counts once
    seen: set[int] = set()
    p.steps = [s for s in p.steps if not (s in seen or seen.add(s))]
    return p


def resume_verdict(prev: Progress, new: Progress, checkpoint: int) -> tuple[str, str]:
    """("resumed" | "scratch" | "unknown", evidence) for a new attempt, given the newest finished checkpoint
    `checkpoint` of the run so far."""
    if new.resumed_from:
        first = new.first_step
        tail = f"; first step {first}" if first is not None else ""
        if checkpoint and new.resumed_from < checkpoint:
            return "resumed", (f"resumed from step {new.resumed_from} ({new.resume_path}), older than the newest "
                               f"checkpoint global_step_{checkpoint}{tail}")
        return "resumed", f"resumed from step {new.resumed_from} ({new.resume_path}){tail}"
    started_over = new.resumed_from == 0 or (new.first_step == 1 and checkpoint > 0)
    if started_over and checkpoint:
        return "scratch", (f"started again from step 1 while global_step_{checkpoint} exists: verl did not find "
                           "it (its latest_checkpointed_iteration.txt under trainer.default_local_dir, on storage "
                           "the new driver reads)")
    if new.first_step is not None:
        return "unknown", f"first step {new.first_step} (no resume line in the log)"
    return "unknown", ""
