"""One preflight finding: what a check found, at which level, with its fix (preflight.py re-exports it)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional


@dataclass(frozen=True)
class Finding:
    level: str  # error | warning | ok | skipped
    check: str  # data | model | paths | verl-config | checkpoint | resources | cluster | env | placement
    message: str
    hint: Optional[str] = None
    # where the check ran: "here" (this machine), "on HOST" (the head's Python), "on every node"; None: not a probe
    where: Optional[str] = None
