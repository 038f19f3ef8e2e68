"""A run folder holds what a job logged, its processes' stacks and Ray's actor table, and the hang bundle is made
to be attached to bug reports: folders 0700 and files 0600 from their first byte, whatever the umask or the
cluster's auth setting; a folder or file an older version left looser is tightened when written to."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TextIO

STATE_ROOT = "~/.verl-cluster"


def private_dir(folder: Path) -> Path:
    """`folder` and each folder on the way to it from ~/.verl-cluster (or from the first that exists), 0700."""
    folder = Path(folder)
    root = Path(os.path.expanduser(STATE_ROOT))
    chain = [p for p in [folder, *folder.parents] if p == root or root in p.parents]
    chain = chain or [folder]
    chain[-1].parent.mkdir(parents=True, exist_ok=True)  # above ~/.verl-cluster: the user's own (their home)
    for p in reversed(chain):
        try:
            p.mkdir(mode=0o700)
        except FileExistsError:
            pass
        st = p.lstat()
        if st.st_uid == os.getuid() and st.st_mode & 0o077:
            os.chmod(p, 0o700)  # mkdir's mode goes through the umask; an older folder may be 0755
    return folder


def _open(path: Path, flags: int) -> int:
    private_dir(Path(path).parent)
    fd = os.open(path, flags | os.O_CREAT | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0), 0o600)
    os.fchmod(fd, 0o600)  # a file an older version made 0644
    return fd


def write_private(path: Path, text: str) -> None:
    with os.fdopen(_open(path, os.O_WRONLY | os.O_TRUNC), "w") as f:
        f.write(text)


def append_private(path: Path) -> TextIO:
    return os.fdopen(_open(path, os.O_WRONLY | os.O_APPEND), "a")


def open_private(path: Path) -> TextIO:
    """Read and append, without truncating (a lock file)."""
    return os.fdopen(_open(path, os.O_RDWR | os.O_APPEND), "a+")
