"""What this machine remembers: Ray jobs submitted from here (~/.verl-cluster/jobs/<submission id>.json) and
clusters brought up (or taken down) from here (~/.verl-cluster/clusters/<cluster name>.json).

Each job record names the cluster file the job went to, so `logs`/`stop` find the cluster from a job's id alone,
and the shell can complete job ids without asking Ray (a completion must answer in milliseconds). Both kinds of
record together are the clusters `jobs` asks when no cluster is named.
"""

from __future__ import annotations

import json
import os
import re
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Optional

from verl_cluster.config.state_files import finite_time, read_state_json

JOBS_DIR = "~/.verl-cluster/jobs"
CLUSTERS_DIR = "~/.verl-cluster/clusters"
_SAFE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")  # a job id or cluster name: a plain file name, never a path


def jobs_dir() -> Path:
    return Path(os.path.expanduser(JOBS_DIR))


def clusters_dir() -> Path:
    return Path(os.path.expanduser(CLUSTERS_DIR))


def _write_private(folder: Path, name: str, doc: dict) -> None:
    """Best effort: a read-only home only costs `logs` its `-c` and `jobs` this cluster."""
    try:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        # 0600 from the first byte: a record holds overrides
        fd = os.open(folder / f"{name}.json", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(json.dumps(doc) + "\n")
    except OSError:
        pass


def record(submission_id: str, cluster_file: str, cluster_name: str, job_name: str, **extra) -> None:
    """Remember where a job went. `extra`: what `watch` needs to resubmit it (job_file, overrides) and its run
    chain (run, previous)."""
    if not _SAFE_ID.match(submission_id):
        return
    doc = {"submission_id": submission_id, "cluster_file": str(Path(cluster_file).resolve()),
           "cluster": cluster_name, "job": job_name, "submitted_at": time.time(), **extra}
    _write_private(jobs_dir(), submission_id, doc)


def update(submission_id: str, **fields) -> bool:
    """Add to a job's record what was learnt of it later (`jobs --json` keeps the plan-vs-measured pairs it parsed
    from the job's log, so the log is not read again); False when the job has no record here."""
    doc = lookup(submission_id)
    if doc is None:
        return False
    tmp = jobs_dir() / f".{submission_id}.json.{os.getpid()}.tmp"  # whole or not at all: `jobs` may exit mid-write
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(json.dumps(doc | fields) + "\n")
        os.replace(tmp, jobs_dir() / f"{submission_id}.json")
    except OSError:
        return False
    return True


def record_cluster(cluster_name: str, cluster_file: str, overrides: list[str] | tuple[str, ...] = ()) -> None:
    """Remember a cluster `up` brought up (its head runs), with the key=value overrides it was given. Called only
    once the head came up: a failed `up` (a typo in an override included) leaves no record, and keeps an earlier
    one as it was."""
    if not _SAFE_ID.match(cluster_name):
        return
    doc = {"cluster": cluster_name, "cluster_file": str(Path(cluster_file).resolve()),
           "overrides": list(overrides), "at": time.time()}
    _write_private(clusters_dir(), cluster_name, doc)


def record_down(cluster_name: str, cluster_file: str, overrides: list[str] | tuple[str, ...] = ()) -> None:
    """Remember that `down` stopped a cluster: `jobs` names it down, without asking it, until `up` runs on it or a
    job is submitted to it again. What `up` recorded (its file and overrides) and its jobs' records stay; a
    cluster this machine never knew is not made known by its `down`."""
    if not _SAFE_ID.match(cluster_name):
        return
    doc = _read(clusters_dir() / f"{cluster_name}.json")
    if doc is None:  # known, if at all, only through its jobs' records
        if not any(k.name == cluster_name for k in known_clusters()):
            return
        doc = {"cluster": cluster_name, "cluster_file": str(Path(cluster_file).resolve()),
               "overrides": list(overrides), "at": 0.0}
    _write_private(clusters_dir(), cluster_name, doc | {"down_at": time.time()})


def _read(path: Path) -> Optional[dict]:
    doc = read_state_json(path)  # bounded, a regular file of ours only: a FIFO or a link to /dev/zero is none
    return doc if isinstance(doc, dict) and isinstance(doc.get("cluster_file"), str) else None


def lookup(submission_id: str) -> Optional[dict]:
    """The record of a job submitted from here, or None."""
    return _read(jobs_dir() / f"{submission_id}.json") if _SAFE_ID.match(submission_id) else None


def recent_ids(limit: int = 200) -> list[str]:
    """Job ids submitted from here, newest first."""
    try:
        files = [p for p in jobs_dir().glob("*.json") if p.is_file()]
    except OSError:
        return []
    files.sort(key=lambda p: p.stat().st_mtime, reverse=True)
    return [p.stem for p in files[:limit]]


def forget(cluster_name: str) -> list[Path]:
    """Drop what this machine recorded of a cluster: its `up` record and the records of the jobs submitted to it
    (a cluster gone for good: `jobs` no longer asks it). Nothing is stopped, and its token stays. Returns the
    files removed."""
    if not _SAFE_ID.match(cluster_name):
        return []
    gone = []
    paths = [clusters_dir() / f"{cluster_name}.json"]
    paths += [jobs_dir() / f"{sid}.json" for sid in recent_ids(limit=100_000) if _cluster_of(lookup(sid)) == cluster_name]
    for path in paths:
        try:
            path.unlink()
            gone.append(path)
        except FileNotFoundError:
            pass
        except OSError:  # a read-only home: said by the caller, which finds the record still there
            pass
    return gone


def _cluster_of(doc: Optional[dict]) -> str:
    return str(doc.get("cluster") or Path(doc["cluster_file"]).stem) if doc else ""


@dataclass(frozen=True)
class KnownCluster:
    name: str
    cluster_file: str
    overrides: tuple[str, ...] = ()
    last_used: float = 0.0  # when `up` ran on it or a job was last submitted to it (epoch seconds)
    down_at: float = 0.0  # when `down` stopped it from here (0: never)

    @property
    def down(self) -> bool:
        """Taken down from here, and neither brought up nor submitted to since."""
        return self.down_at > self.last_used


def _when(doc: dict, key: str) -> float:
    return finite_time(doc.get(key))


def recorded_clusters() -> list[KnownCluster]:
    """The clusters `up` brought up from here (~/.verl-cluster/clusters), up or taken down since, by name."""
    found = []
    try:
        ups = sorted(clusters_dir().glob("*.json"))
    except OSError:
        ups = []
    for path in ups:
        doc = _read(path)
        if doc and isinstance(doc.get("cluster"), str) and doc["cluster"] == path.stem:
            over = tuple(str(o) for o in doc.get("overrides") or ())
            found.append(KnownCluster(doc["cluster"], doc["cluster_file"], over, _when(doc, "at"),
                                      _when(doc, "down_at")))
    return found


def known_clusters(job_limit: int = 500) -> list[KnownCluster]:
    """Every cluster this machine has brought up or submitted to, one per cluster name, most recently used first.
    A cluster `up` recorded keeps that record's file and overrides (a job record has no cluster overrides)."""
    found: dict[str, KnownCluster] = {k.name: k for k in recorded_clusters()}
    for sid in recent_ids(limit=job_limit):
        doc = lookup(sid)
        name = _cluster_of(doc)
        if not name:
            continue
        at = _when(doc, "submitted_at")
        have = found.get(name)
        if have is None:
            found[name] = KnownCluster(name, doc["cluster_file"], (), at)
        elif at > have.last_used:
            found[name] = replace(have, last_used=at)
    return sorted(found.values(), key=lambda k: k.last_used, reverse=True)
