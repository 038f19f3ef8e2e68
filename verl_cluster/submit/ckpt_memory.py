"""A checkpoint folder in RAM: files under tmpfs count as used memory (Ray's memory monitor and verl's
cpu_memory_used_gb see them), so every save kept there grows the node's RAM by the checkpoint's size."""

from __future__ import annotations

import os
from typing import Optional

RAM_FS = ("tmpfs", "ramfs")


def mount_fs(path: str, mounts_text: Optional[str] = None) -> Optional[str]:
    """The file system type of the mount that holds `path` (the longest mount point above it; the path need not
    exist yet), from /proc/mounts; None when unknown."""
    if mounts_text is None:
        try:
            with open("/proc/mounts") as f:
                mounts_text = f.read()
        except OSError:
            return None
    real = os.path.realpath(os.path.expanduser(path))
    best, fs = "", None
    for line in mounts_text.splitlines():
        parts = line.split()
        if len(parts) < 3:
            continue
        point = parts[1].replace("\\040", " ")
        inside = real == point or real.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= len(best):
            best, fs = point, parts[2]
    return fs


def ram_checkpoint_warning(folder: str, save_freq: int, mounts_text: Optional[str] = None) -> Optional[tuple[str, str]]:
    """(message, hint) when checkpoints will be saved into RAM, else None."""
    if save_freq <= 0 or not folder:
        return None
    fs = mount_fs(folder, mounts_text)
    if fs not in RAM_FS:
        return None
    return (f"trainer.default_local_dir {folder} is on {fs}: every checkpoint saved there stays in RAM, counted as "
            f"used (Ray's memory monitor kills workers on it); a save is ~12 bytes per trained parameter, kept up to "
            f"trainer.max_actor_ckpt_to_keep saves",
            "save to a disk: trainer.default_local_dir=/path/on/disk")
