"""A watched run on disk: ~/.verl-cluster/<cluster>/runs/<run>/ with run.json (the chain of submissions, the
restart count, the state), events.jsonl, watcher.log (--detach) and watch.lock (one watcher per run)."""

from __future__ import annotations

import fcntl
import json
import os
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Optional

from verl_cluster.config.state_files import read_state_json
from verl_cluster.enums import StrEnum
from verl_cluster.errors import ClusterError, ConfigError
from verl_cluster.records import job_records
from verl_cluster.watch.private import open_private, private_dir, write_private

if TYPE_CHECKING:
    from verl_cluster.submit.job_input import JobInput

RUNS_ROOT = "~/.verl-cluster"


class RunStatus(StrEnum):
    """Where a watched run stands; the value is what run.json and `watch` print."""

    WATCHING = "watching"
    SUCCEEDED = "succeeded"
    FAILED = "failed"  # a failure a restart cannot help
    GAVE_UP = "gave-up"  # restart budget spent, or nodes that did not come back
    STOPPED = "stopped"  # by someone else


FINAL = tuple(s for s in RunStatus if s is not RunStatus.WATCHING)


def run_dir(cluster: str, run: str) -> Path:
    return Path(os.path.expanduser(RUNS_ROOT)) / cluster / "runs" / run


@dataclass
class RunState:
    run: str  # the first submission id
    cluster: str
    cluster_file: str
    job_file: str = ""  # runs recorded before job_input: the job file ...
    overrides: list[str] = field(default_factory=list)  # ... and the key=value words (re-planned after an OOM)
    input: dict = field(default_factory=dict)  # JobInput.to_json() of the first submit: every attempt loads it
    attempts: list[dict] = field(default_factory=list)  # {submission_id, started_at, status, class, evidence}
    restarts: int = 0
    state: RunStatus = RunStatus.WATCHING
    pending: Optional[str] = None  # a resubmission being made (a killed watcher may leave it behind)
    nodes: Optional[int] = None  # nodes the run continues on, when fewer than configured
    submit_dir: str = ""  # the folder submit ran in: a module the nodes lack is looked for there ("": unknown)

    @property
    def dir(self) -> Path:
        return run_dir(self.cluster, self.run)

    def job_input(self, extra: list[str] = ()) -> "JobInput":
        """The job as submitted, with the run's current key=value words (an OOM re-plan changes them)."""
        from verl_cluster.submit.job_input import JobInput

        if not self.input:  # a run.json from before the three forms were kept
            return JobInput.from_words(self.job_file, list(self.overrides) + list(extra))
        return replace(JobInput.from_json(self.input), overrides=tuple(self.overrides) + tuple(extra))

    @property
    def current(self) -> str:
        return self.attempts[-1]["submission_id"]

    def save(self) -> None:
        private_dir(self.dir)
        tmp = self.dir / "run.json.tmp"
        write_private(tmp, json.dumps(asdict(self), indent=1) + "\n")
        tmp.replace(self.dir / "run.json")  # atomic: a killed watcher never leaves half a file

    @classmethod
    def load(cls, cluster: str, run: str) -> Optional["RunState"]:
        doc = read_state_json(run_dir(cluster, run) / "run.json")  # bounded, a regular file of ours only
        if not isinstance(doc, dict):
            return None
        try:
            if "state" in doc:
                doc["state"] = RunStatus(doc["state"])
        except (TypeError, ValueError):
            return None
        return cls(**{k: doc[k] for k in cls.__dataclass_fields__ if k in doc})


def submit_dir() -> str:
    """The folder this process runs in, as submit records it for the run ("" when it was removed)."""
    try:
        return os.getcwd()
    except OSError:
        return ""


def new_run(sid: str, cluster: str, cluster_file: str, job_input: "JobInput", submit_dir: str = "") -> RunState:
    st = RunState(sid, cluster, str(Path(cluster_file).resolve()), job_input.path, list(job_input.overrides),
                  input=job_input.to_json(), attempts=[{"submission_id": sid, "started_at": time.time()}],
                  submit_dir=submit_dir)
    st.save()
    return st


def find_run(job_id: str) -> RunState:
    """The run a submission id belongs to (any id in its chain), or a new run for a job `submit` recorded."""
    rec = job_records.lookup(job_id)
    if rec is None:
        raise ConfigError(f"job {job_id} was not submitted from this machine (no record under "
                          f"{job_records.jobs_dir()})",
                          "watch jobs submitted here: `verl-cluster submit JOB.yaml --watch`, or see `verl-cluster jobs`")
    run = rec.get("run") or job_id
    st = RunState.load(rec["cluster"], run)
    if st is not None:
        return st
    from verl_cluster.submit.job_input import JobInput

    ji = JobInput.from_record(rec)
    if ji is None:
        raise ConfigError(f"job {job_id} has no job on record, so it could not be resubmitted",
                          "submit it again with `verl-cluster submit JOB.yaml --watch`")
    return new_run(job_id, rec["cluster"], rec["cluster_file"], ji, str(rec.get("submit_dir") or ""))


class RunLock:
    """An flock on watch.lock, held for the watcher's life; the kernel drops it when the process dies."""

    def __init__(self, st: RunState):
        self.path = st.dir / "watch.lock"
        self.run = st.run
        self.fh = None

    def holder(self) -> str:
        try:
            return self.path.read_text().strip()
        except OSError:
            return ""

    def acquire(self) -> "RunLock":
        fh = open_private(self.path)
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            fh.close()
            who = self.holder() or "another process"
            raise ClusterError(f"run {self.run} is already watched ({who})",
                               f"one watcher per run: see its log {self.path.parent / 'watcher.log'} or "
                               f"{self.path.parent / 'events.jsonl'}; stop that watcher first to take over")
        fh.seek(0)
        fh.truncate()
        fh.write(f"pid {os.getpid()} since {time.strftime('%Y-%m-%d %H:%M:%S')}\n")
        fh.flush()
        self.fh = fh
        return self

    def is_held(self) -> bool:
        if not self.path.exists():
            return False
        with open_private(self.path) as fh:
            try:
                fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return True
            fcntl.flock(fh, fcntl.LOCK_UN)
        return False

    def release(self) -> None:
        if self.fh:
            self.fh.close()
            self.fh = None


def run_summary(cluster: str, run: str) -> str:
    """`watched: N restart(s), last: CLASS -> ACTION` for `jobs`; "" when the run is not watched from here."""
    from verl_cluster.watch.events import read_events

    st = RunState.load(cluster, run)
    if st is None:
        return ""
    events = [e for e in read_events(st.dir / "events.jsonl") if e.get("class") != "info"] or \
        read_events(st.dir / "events.jsonl")
    last = f", last: {events[-1]['class']} -> {events[-1]['action']}" if events else ""
    return f"{st.state}: {st.restarts} restart(s){last}"[:120]
