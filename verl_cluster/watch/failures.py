"""Failure classes for `watch`: what the log and Ray say a run died of, and whether a restart can help.

verl_log.classify finds the cause in the log text; here it is folded into the classes the watcher acts on.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Optional

from verl_cluster.enums import StrEnum
from verl_cluster.verl_logs.verl_log import classify as classify_log


class FailureClass(StrEnum):
    """What an attempt died of; the value is what events.jsonl and the run's state carry."""

    NODE_LOST = "node-lost"  # heal the node
    WORKER_DIED = "worker-died"  # a process died on a live node: clean up, resume
    GPU_FAULT = "gpu-fault"
    NCCL_TIMEOUT = "nccl-timeout"
    OOM = "oom"  # re-plan with room
    HANG = "hang"
    USER_CODE = "user-code"  # the run's own mistake: never retried
    UNKNOWN = "unknown"

    @property
    def retried(self) -> bool:
        return self is not FailureClass.USER_CODE


# finer verl_log kinds that are the run's own mistakes: a restart would fail the same way
_USER = {"missing-package", "bad-override", "config", "entrypoint", "bad-command", "hydra-refused"}
# those that happen before the program ran a line: Ray's job message (the log's last lines) tells them too
_BEFORE_THE_PROGRAM = {"entrypoint", "bad-command", "hydra-refused"}

# what Ray itself says when the job's driver or its node went away (JobInfo.message)
_RAY_LOST = ("Job supervisor actor died", "node died", "has been marked dead", "Owner's node has crashed",
             "NodeDiedError", "driver exited unexpectedly", "Job driver died")
# Hydra's wrapper around any exception verl's main() raises; alone (nothing else classified, no step run) it
# means verl refused the command line before training: a restart runs the same line
_HYDRA_REFUSED = "Error executing job with overrides"
_EXIT_CODE = re.compile(r"exit code (\d+)")


@dataclass(frozen=True)
class Diagnosis:
    cls: FailureClass
    what: str
    evidence: str
    fix: str = ""
    detail: str = ""  # the finer verl_log kind, e.g. missing-package

    @property
    def retry(self) -> bool:
        return self.cls.retried

    def signature(self) -> str:
        """What makes two failures 'the same': the class and the evidence without numbers (pids, addresses,
        times differ from one attempt to the next)."""
        return self.cls + ":" + re.sub(r"\d+", "N", self.evidence)[:200]

    def to_json(self) -> dict:
        return {"class": self.cls, "what": self.what, "evidence": self.evidence, "fix": self.fix,
                "detail": self.detail}


def _cwd() -> Optional[str]:
    try:
        return os.getcwd()
    except OSError:  # removed since the watcher started: nothing to look in
        return None


def actor_death(lines: list[str]) -> str:
    """'WorkerDict pid 5552 on 10.0.0.2 died: UNEXPECTED_SYSTEM_EXIT (Worker unexpectedly exits ...)' from Ray's
    ActorDiedError text, or ''."""
    text = "\n".join(lines[-400:])
    at = text.rfind("ActorDiedError")
    if at < 0:
        return ""
    block = text[at:at + 3000]

    def field(name: str) -> str:
        m = re.search(rf"\b{name}:\s*(\S+)", block)
        return m.group(1) if m else "?"

    exit_type = re.search(r"Worker exit type:\s*(\S+)", block)
    detail = re.search(r"Worker exit detail:\s*(.+?)(?:\.\s|$)", block, re.M)
    creation = re.search(r"raised in its creation task, ([\w.]+)", block)
    what = f"{field('class_name')} pid {field('pid')} on {field('ip')} died"
    if creation:
        what += f" while being created ({creation.group(1)})"
    if exit_type:
        what += f": {exit_type.group(1)}"
    if detail:
        what += f" ({detail.group(1).strip()[:160]})"
    return what


def diagnose(lines: list[str], ray_message: str = "", lost_node: Optional[str] = None,
             made_progress: bool = True, here: Optional[str] = None) -> Diagnosis:
    """The class of a failed attempt. A node we saw die wins over what the log says (a dead rank's peers print
    tracebacks and NCCL errors too); then the log; then Ray's own job message. `made_progress`: whether the
    attempt ran a training step (verl refusing its command line happens before the first). `here`: the folder
    the job was submitted from (default: this process's; "": unknown), where an entrypoint the nodes lack is
    looked for."""
    if lost_node:
        return Diagnosis(FailureClass.NODE_LOST, "a node left the cluster", lost_node,
                         "watch restarts it (the heal path of `up`)")
    here = (here if here is not None else _cwd()) or None
    found = classify_log(lines, here=here)
    if found is None and not made_progress and ray_message:  # the log unread: Ray's message quotes its end
        said = classify_log(ray_message.splitlines(), here=here)
        found = said if said is not None and said.kind in _BEFORE_THE_PROGRAM else None
    if found is not None and found.kind == FailureClass.WORKER_DIED:
        return Diagnosis(FailureClass.WORKER_DIED, found.what, actor_death(lines) or found.line, found.fix, found.kind)
    if found is not None and found.kind != FailureClass.USER_CODE:
        cls = FailureClass.USER_CODE if found.kind in _USER else FailureClass(found.kind)
        return Diagnosis(cls, found.what, found.line, found.fix, found.kind)
    if any(t in ray_message for t in _RAY_LOST):
        return Diagnosis(FailureClass.NODE_LOST, "Ray lost the job's driver or its node", ray_message.strip()[:300],
                         "verl-cluster status; watch restarts dead nodes")
    if found is not None:
        return Diagnosis(FailureClass.USER_CODE, found.what, found.line, found.fix, found.kind)
    refused = any(_HYDRA_REFUSED in x for x in lines)
    if refused and not made_progress:
        code = _EXIT_CODE.search(ray_message)
        return Diagnosis(FailureClass.USER_CODE, "verl stopped before its first step (Hydra: error executing the job)",
                         (ray_message.strip() or next(x for x in lines if _HYDRA_REFUSED in x).strip())[:300],
                         "run the same command with --dry-run; read the lines after 'Error executing job with "
                         "overrides' (verl-cluster logs JOB)", "refused" + (f"-exit-{code.group(1)}" if code else ""))
    last = next((x.strip() for x in reversed(lines) if x.strip()), "")
    return Diagnosis(FailureClass.UNKNOWN, "the job ended without a known cause", (ray_message.strip() or last)[:300])
