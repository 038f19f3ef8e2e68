"""Failure classes for `watch`: what the log and Ray say a run died of, and whether a restart can help.

verl_log.classify finds the cause in the log text; here it is folded into the classes the watcher acts on.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from verl_cluster.launch.verl_log import classify as classify_log

CLASSES = ("node-lost", "gpu-fault", "nccl-timeout", "oom", "user-code", "hang", "unknown")
# the run's own mistakes: a restart would fail the same way
NOT_RETRIED = {"user-code", "missing-package", "bad-override", "config"}
_FOLD = {"missing-package": "user-code", "bad-override": "user-code", "config": "user-code"}

# what Ray itself says when the job's driver or its node went away (JobInfo.message)
_RAY_LOST = ("Job supervisor actor died", "node died", "has been marked dead", "Owner's node has crashed",
             "NodeDiedError", "driver exited unexpectedly", "Job driver died")


@dataclass(frozen=True)
class Diagnosis:
    cls: str  # one of CLASSES
    what: str
    evidence: str
    fix: str = ""
    detail: str = ""  # the finer verl_log kind, e.g. missing-package

    @property
    def retry(self) -> bool:
        return self.cls != "user-code"

    def to_json(self) -> dict:
        return {"class": self.cls, "what": self.what, "evidence": self.evidence, "fix": self.fix,
                "detail": self.detail}


def diagnose(lines: list[str], ray_message: str = "", lost_node: Optional[str] = None) -> Diagnosis:
    """The class of a failed attempt. A node we saw die wins over what the log says (a dead rank's peers print
    tracebacks and NCCL errors too); then the log; then Ray's own job message."""
    if lost_node:
        return Diagnosis("node-lost", "a node left the cluster", lost_node,
                         "watch restarts it (the heal path of `up`)")
    found = classify_log(lines)
    if found is not None and found.kind != "user-code":
        return Diagnosis(_FOLD.get(found.kind, found.kind), found.what, found.line, found.fix, found.kind)
    if any(t in ray_message for t in _RAY_LOST):
        return Diagnosis("node-lost", "Ray lost the job's driver or its node", ray_message.strip()[:300],
                         "verl-cluster status; watch restarts dead nodes")
    if found is not None:
        return Diagnosis("user-code", found.what, found.line, found.fix, found.kind)
    last = next((x.strip() for x in reversed(lines) if x.strip()), "")
    return Diagnosis("unknown", "the job ended without a known cause", (ray_message.strip() or last)[:300])
