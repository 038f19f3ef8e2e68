"""Files this machine keeps under ~/.verl-cluster (job and cluster records, a cluster's measurements, a token's
head) are read as untrusted input: a regular file of this user's, not writable by everyone, within a size bound.
Never a FIFO (the read would wait forever), a device or a link (a link to /dev/zero fills memory), nor a 300 MB
file read whole."""

from __future__ import annotations

import json
import os
import stat
from typing import Any, Optional

MAX_STATE_BYTES = 4 * 2**20  # a job record holds the job's overrides and input: kilobytes


def read_state_bytes(path: str | os.PathLike, limit: int = MAX_STATE_BYTES) -> Optional[bytes]:
    """The file's bytes, or None when it is missing, not a regular file of ours, writable by anyone or over
    `limit` bytes."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError:  # missing, a link (ELOOP), unreadable
        return None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o002 or st.st_size > limit:
            return None
        raw = f.read(limit + 1)
    return raw if len(raw) <= limit else None


def read_state_json(path: str | os.PathLike, limit: int = MAX_STATE_BYTES) -> Optional[Any]:
    """The file's JSON, or None (see read_state_bytes; also when it is not JSON)."""
    raw = read_state_bytes(path, limit)
    if raw is None:
        return None
    try:
        return json.loads(raw)
    except (ValueError, RecursionError):
        return None


def finite_time(v: Any) -> float:
    """A unix time read from such a file: a number from 0 to the year 5000, else 0 (NaN, 1e308, text)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return 0.0
    return float(v) if 0 <= v < 1e11 else 0.0  # NaN fails both comparisons
