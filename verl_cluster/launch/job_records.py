"""Ray jobs submitted from this machine: ~/.verl-cluster/jobs/<submission id>.json.

Each record names the cluster file the job went to, so `logs`/`stop`/`jobs` find the cluster from a job's id
alone, and the shell can complete job ids without asking Ray (a completion must answer in milliseconds).
"""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path
from typing import Optional

JOBS_DIR = "~/.verl-cluster/jobs"
_SAFE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")  # a job id that is a plain file name, never a path


def jobs_dir() -> Path:
    return Path(os.path.expanduser(JOBS_DIR))


def record(submission_id: str, cluster_file: str, cluster_name: str, job_name: str, **extra) -> None:
    """Remember where a job went. Best effort: a read-only home only costs `logs` its `-c`.
    `extra`: what `watch` needs to resubmit it (job_file, overrides) and its run chain (run, previous)."""
    if not _SAFE_ID.match(submission_id):
        return
    doc = {"submission_id": submission_id, "cluster_file": str(Path(cluster_file).resolve()),
           "cluster": cluster_name, "job": job_name, "submitted_at": time.time(), **extra}
    try:
        jobs_dir().mkdir(mode=0o700, parents=True, exist_ok=True)
        # 0600 from the first byte: the record holds the job's overrides
        fd = os.open(jobs_dir() / f"{submission_id}.json", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(json.dumps(doc) + "\n")
    except OSError:
        pass


def lookup(submission_id: str) -> Optional[dict]:
    """The record of a job submitted from here, or None."""
    if not _SAFE_ID.match(submission_id):
        return None
    try:
        doc = json.loads((jobs_dir() / f"{submission_id}.json").read_text())
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) and doc.get("cluster_file") else None


def recent_ids(limit: int = 200) -> list[str]:
    """Job ids submitted from here, newest first."""
    try:
        files = [p for p in jobs_dir().glob("*.json") if p.is_file()]
    except OSError:
        return []
    files.sort(key=lambda p: p.stat().st_mtime, reverse=True)
    return [p.stem for p in files[:limit]]


def latest() -> Optional[dict]:
    """The newest record whose cluster file still exists."""
    for sid in recent_ids(limit=20):
        doc = lookup(sid)
        if doc and Path(doc["cluster_file"]).is_file():
            return doc
    return None
