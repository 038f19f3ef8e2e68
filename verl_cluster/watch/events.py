"""Every watch event goes three ways: the terminal, the run's events.jsonl, and the user's notify command."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Optional, TextIO

from verl_cluster.enums import StrEnum
from verl_cluster.watch.failures import FailureClass
from verl_cluster.watch.private import append_private

NOTIFY_TIMEOUT_S = 15.0


class Note(StrEnum):
    """Events that are not a failure class."""

    INFO = "info"  # progress: watching, submitted, healed, succeeded
    LEFTOVER = "leftover"  # the previous attempt's processes did not clear
    RESUME_FAILED = "resume-failed"  # a resumed attempt started again from step 1


@dataclass(frozen=True)
class Event:
    run: str
    submission_id: str
    cls: FailureClass | Note
    action: str  # what the watcher does about it
    evidence: str = ""
    node: str = ""
    lines: list[str] = field(default_factory=list)  # the log tail, where it matters
    time: float = field(default_factory=time.time)

    def to_json(self) -> dict:
        d = asdict(self)
        d["class"] = d.pop("cls")
        d["time_iso"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.time))
        return d


class Reporter:
    """Writes events; a notify command that fails is reported on the terminal, never stops the watcher."""

    def __init__(self, events_file: Path, notify: tuple[str, ...] = (), out: TextIO = sys.stderr,
                 as_json: bool = False, say: Optional[Callable[[str], None]] = None):
        self.events_file, self.notify, self.out, self.as_json = events_file, notify, out, as_json
        self.say = say or (lambda text: print(text, file=self.out, flush=True))

    def emit(self, ev: Event) -> Event:
        doc = ev.to_json()
        line = json.dumps(doc, default=str)
        with append_private(self.events_file) as f:
            f.write(line + "\n")
        if self.as_json:
            sys.stdout.write(line + "\n")
            sys.stdout.flush()
        else:
            where = f" {ev.node}" if ev.node else ""
            self.say(f"[watch {time.strftime('%H:%M:%S', time.localtime(ev.time))}] {ev.cls}{where}: "
                     f"{ev.evidence or '-'} -> {ev.action}")
            for text in ev.lines:
                self.say(f"    | {text}")
        if self.notify:
            self._notify(line)
        return ev

    def _notify(self, line: str) -> None:
        try:
            r = subprocess.run(list(self.notify), input=line + "\n", capture_output=True, text=True,
                               timeout=NOTIFY_TIMEOUT_S)
            if r.returncode != 0:
                self.say(f"[watch] notify command exited {r.returncode}: {(r.stderr or r.stdout).strip()[-200:]}")
        except (OSError, subprocess.TimeoutExpired) as e:
            self.say(f"[watch] notify command failed: {type(e).__name__}: {e}")


def read_events(events_file: Path) -> list[dict]:
    try:
        text = events_file.read_text()
    except OSError:
        return []
    out = []
    for line in text.splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            continue  # a line cut short by a killed watcher
    return out
