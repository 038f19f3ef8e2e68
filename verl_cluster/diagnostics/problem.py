"""What a check found wrong: where, what, the fix, and how bad."""

from __future__ import annotations

from dataclasses import dataclass

ERROR, WARNING = "error", "warning"


@dataclass(frozen=True)
class Problem:
    node: str  # a host, "a -> b" for a pair, or "cluster"
    what: str
    fix: str
    severity: str = ERROR

    def to_json(self) -> dict:
        return {"node": self.node, "what": self.what, "fix": self.fix, "severity": self.severity}
