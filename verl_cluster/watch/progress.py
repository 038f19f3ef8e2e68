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


KEEP = 64  # step numbers kept: the first and the newest (a week-long run logs tens of thousands)


@dataclass
class Progress:
    """Fed the log as it grows (`feed`); a line is read once it is complete (`flush` reads a last one without its
    newline). Holds the same few hundred bytes at step 10 and at step 100,000."""
    steps: list[int] = field(default_factory=list)  # step numbers as first logged: the first and the KEEP newest
    resumed_from: Optional[int] = None  # the step verl says it loaded; 0 for "Training from scratch"
    resume_path: str = ""
    count: int = 0  # steps logged
    _finished: list[int] = field(default_factory=list, repr=False)  # saves followed by progress
    _pending: list[int] = field(default_factory=list, repr=False)  # saves started, nothing logged after them yet
    _partial: str = field(default="", repr=False)

    @property
    def saves(self) -> list[tuple[int, bool]]:
        """(step, finished) for every checkpoint save the log shows."""
        return [(s, True) for s in self._finished] + [(s, False) for s in self._pending]

    @property
    def first_step(self) -> Optional[int]:
        return self.steps[0] if self.steps else None

    @property
    def last_step(self) -> int:
        return max(self.steps, default=0)

    @property
    def checkpoint(self) -> int:
        """The newest checkpoint this attempt finished saving (0: none)."""
        return max(self._finished, default=0)

    def to_json(self) -> dict:
        return {"steps": self.steps, "count": self.count, "resumed_from": self.resumed_from,
                "resume_path": self.resume_path, "finished": self._finished, "pending": self._pending}

    @classmethod
    def from_json(cls, doc: dict) -> "Progress":
        p = cls([int(x) for x in doc.get("steps") or []], doc.get("resumed_from"), str(doc.get("resume_path") or ""),
                int(doc.get("count") or 0))
        p._finished, p._pending = [int(x) for x in doc.get("finished") or []], [int(x) for x in doc.get("pending") or []]
        return p

    def lost(self, since: int = 0) -> int:
        """Steps done after the newest finished checkpoint (by this attempt or, `since`, an earlier one)."""
        return max(0, self.last_step - max(self.checkpoint, since))

    def feed(self, text: str) -> "Progress":
        lines = (self._partial + text).split("\n")
        self._partial = lines.pop()
        for raw in lines:
            self._line(raw)
        return self

    def flush(self) -> "Progress":
        if self._partial:
            self._line(self._partial)
            self._partial = ""
        return self

    def _line(self, raw: str) -> None:
        if "tep" not in raw and "raining from scratch" not in raw and "global_step" not in raw:
            return  # most of a run's log is its workers' output: the patterns below need one of these
        line = _ANSI.sub("", raw)
        m = RESUMED.search(line)
        if m:
            self.resumed_from, self.resume_path = int(m.group(2)), m.group(1).rstrip(",")
            return
        if self.resumed_from is None and SCRATCH.search(line):
            self.resumed_from = 0
            return
        m = SAVE.search(line)
        if m:
            if "local_global_step_folder" in line and "Saving" not in line:
                self._finished.append(int(m.group(2)))  # printed once written (the CPU stand-in, older verl)
            else:
                self._pending.append(int(m.group(2)))
            return
        m = STEP.match(_PREFIX.sub("", line, count=1))
        if m:
            n = int(m.group(1))
            if n not in self.steps:  # a step logged twice (a progress bar and the metrics line) counts once
                self.steps.append(n)
                self.count += 1
                if len(self.steps) > KEEP:
                    del self.steps[1]
            self._finished += [s for s in self._pending if s <= n]
            self._pending = [s for s in self._pending if s > n]
            del self._finished[:-16]


def read_progress(text: str) -> Progress:
    return Progress().feed(text).flush()


def resume_verdict(new: Progress, checkpoint: int) -> tuple[str, str]:
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
