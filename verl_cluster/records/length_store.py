"""The lengths verl logged for a job's last run: ~/.verl-cluster/lengths/<job name>.json.

`submit` follows a verl run's console log (verl_log.VerlProgress); when it ends (or the user detaches) the run's
`prompt_length/mean` and `response_length/mean` are kept here, keyed by the job's name, so the next `plan` or
`submit` of the same job plans at the lengths the data really has. One record per job: the newest run wins.
"""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path
from typing import Any, Optional

STORE_DIR = "~/.verl-cluster/lengths"


def store_dir() -> Path:
    return Path(os.path.expanduser(STORE_DIR))


def _file(job_name: str) -> Path:
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", job_name).lstrip(".") or "_"
    return store_dir() / f"{safe}.json"


def record(job_name: str, lengths: dict[str, Any], submission_id: str) -> bool:
    """Keep what a run logged (VerlProgress.lengths()); best effort: a read-only home only costs the next plan
    these lengths. False when there was nothing to keep."""
    if not job_name or not lengths.get("steps"):
        return False
    doc = {"job": job_name, "submission_id": submission_id, "recorded_at": time.time(), **lengths}
    try:
        store_dir().mkdir(mode=0o700, parents=True, exist_ok=True)
        tmp = _file(job_name).with_suffix(".tmp")
        tmp.write_text(json.dumps(doc) + "\n")
        tmp.replace(_file(job_name))
    except OSError:
        return False
    return True


def lookup(job_name: str) -> Optional[dict[str, Any]]:
    """The last run's logged lengths for this job, or None."""
    try:
        doc = json.loads(_file(job_name).read_text())
    except (OSError, ValueError):
        return None
    ok = isinstance(doc, dict) and doc.get("job") == job_name and doc.get("steps")
    return doc if ok else None


def remember_run(submission_id: str, progress: Any) -> bool:
    """After following a run: record its logged lengths under the job name `submit` recorded for the id."""
    from verl_cluster.records import job_records

    rec = job_records.lookup(submission_id)
    lengths = progress.lengths() if progress is not None and hasattr(progress, "lengths") else {}
    return bool(rec and rec.get("job")) and record(str(rec["job"]), lengths, submission_id)
