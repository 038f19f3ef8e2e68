"""The extra state of each rank: `{"lr_scheduler": state_dict | None, "rng": {"cpu", "numpy", "random", <device>}}`.

The lr scheduler's state is the same on every rank; new rank j carries it. RNG: a new rank j that existed before
(j < W) carries rank j's generators unchanged, byte for byte. A rank that did not exist (j >= W) is re-seeded:
its CPU, numpy and `random` generators start from a seed derived from rank 0's saved CPU state and j, and a
16-byte CUDA Philox state becomes (that seed, offset 0). Nothing else in the file is changed.
"""

from __future__ import annotations

import hashlib
import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch


def derived_seed(rank0_cpu_state: torch.Tensor, rank: int) -> int:
    digest = hashlib.sha256(rank0_cpu_state.numpy().tobytes() + rank.to_bytes(4, "little")).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def reseeded_rng(rng: dict[str, Any], seed: int) -> tuple[dict[str, Any], list[str]]:
    """A copy of `rng` with every generator started from `seed`; the keys it could not re-seed (copied)."""
    out = dict(rng)
    kept = []
    g = torch.Generator().manual_seed(seed)
    out["cpu"] = g.get_state()
    out["numpy"] = np.random.RandomState(seed % (1 << 32)).get_state()
    out["random"] = random.Random(seed).getstate()
    for key, value in rng.items():
        if key in ("cpu", "numpy", "random"):
            continue
        if isinstance(value, torch.Tensor) and value.dtype == torch.uint8 and value.numel() == 16:
            out[key] = torch.tensor(list(seed.to_bytes(8, "little")) + [0] * 8, dtype=torch.uint8)
        else:
            kept.append(key)
    return out, kept


def load_extra(path: Path) -> dict:
    """verl's extra state, read without running code from the file (torch's weights-only unpickler): tensors,
    plain data and numpy's RNG state (an array), nothing else."""
    core = getattr(np, "_core", None) or np.core
    safe = [core.multiarray._reconstruct, np.ndarray, np.dtype, type(np.dtype(np.uint32))]
    with torch.serialization.safe_globals(safe):
        return torch.load(path, map_location="cpu", weights_only=True)


def write_extra(sources: list[Path], rank: int, dest: Path) -> str:
    """Write new rank `rank`'s extra state to `dest`; returns what was done with its RNG."""
    w = len(sources)
    if rank < w:
        shutil.copyfile(sources[rank], dest)
        return f"rank {rank}: carried"
    state = load_extra(sources[0])
    rng = state.get("rng")
    if not isinstance(rng, dict) or not isinstance(rng.get("cpu"), torch.Tensor):
        torch.save(state, dest)
        return f"rank {rank}: no RNG state in rank 0's file; lr scheduler carried"
    seed = derived_seed(rng["cpu"], rank)
    state["rng"], kept = reseeded_rng(rng, seed)
    torch.save(state, dest)
    note = f"rank {rank}: re-seeded ({seed})"
    return note + (f"; {', '.join(kept)} copied from rank 0" if kept else "")
