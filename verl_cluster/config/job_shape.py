"""A job's shape, read once: nodes x GPUs per node (the world verl runs on) and which launcher runs it.

"Not pinned" (None: the job does not state trainer.nnodes / trainer.n_gpus_per_node, nor placement.gpus) is kept
apart from verl's own default (1 node x 8 GPUs, verl/trainer/config/ppo_trainer.yaml): the planner and the Slurm
fit fit the cluster to an unpinned job, while what verl itself will ask Ray for is the default (`verl_*`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Any, Mapping, Optional

from verl_cluster.errors import ConfigError

VERL_NODES = 1  # trainer.nnodes in verl's config
VERL_GPUS_PER_NODE = 8  # trainer.n_gpus_per_node in verl's config
NODES_KEY, GPUS_KEY = "trainer.nnodes", "trainer.n_gpus_per_node"


def _count(key: str, value: Any) -> Optional[int]:
    """A count the job states (0 allowed: a CPU-only job); None when it states none."""
    if value is None or str(value).strip() == "":
        return None
    try:
        if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
            raise ValueError
        n = int(value) if isinstance(value, (int, float)) else int(str(value).strip())
    except ValueError:
        raise ConfigError(f"overrides: `{key}` must be a whole number, got {value!r}",
                          f"{key}=1 (or leave it out: the cluster is fitted)") from None
    if n < 0:
        raise ConfigError(f"overrides: `{key}` must not be negative, got {n}", f"{key}=1")
    return n


@dataclass(frozen=True)
class JobShape:
    nodes: Optional[int] = None  # trainer.nnodes as stated (else placement.gpus's first number); None: not pinned
    gpus_per_node: Optional[int] = None  # trainer.n_gpus_per_node likewise
    launcher: str = "auto"  # ray | torchrun | auto, as the job names it (submit decides auto against the cluster)
    ray_only: bool = False  # verl's trainers run as Ray drivers only

    @classmethod
    def of_overrides(cls, overrides: Mapping[str, Any], launcher: str = "auto", ray_only: bool = False,
                     gpus_hint: Optional[str] = None) -> "JobShape":
        """From verl's key=value overrides; `gpus_hint` (placement.gpus, `2x8xH100-80GB`) fills what they leave
        unstated."""
        nodes, gpus = _count(NODES_KEY, overrides.get(NODES_KEY)), _count(GPUS_KEY, overrides.get(GPUS_KEY))
        m = re.match(r"^\s*(\d+)\s*x\s*(\d+)\s*x", gpus_hint or "")
        if m:
            nodes = nodes if nodes is not None else int(m.group(1))
            gpus = gpus if gpus is not None else int(m.group(2))
        return cls(nodes, gpus, launcher, ray_only)

    @classmethod
    def of(cls, job) -> "JobShape":
        """From a JobSpec (its overrides, then placement.gpus)."""
        # JobSpec.get reads as a Mapping's .get
        return cls.of_overrides(job, job.launcher, job.is_ray_only, job.placement.gpus)

    @property
    def pinned(self) -> bool:
        return self.nodes is not None or self.gpus_per_node is not None

    @property
    def world(self) -> Optional[int]:
        """GPUs the job pins (nodes x GPUs per node), None unless it states both."""
        return None if self.nodes is None or self.gpus_per_node is None else self.nodes * self.gpus_per_node

    @property
    def verl_nodes(self) -> int:
        return VERL_NODES if self.nodes is None else self.nodes

    @property
    def verl_gpus_per_node(self) -> int:
        return VERL_GPUS_PER_NODE if self.gpus_per_node is None else self.gpus_per_node

    @property
    def verl_world(self) -> int:
        """What verl will ask Ray for: the stated counts, verl's defaults for the rest."""
        return self.verl_nodes * self.verl_gpus_per_node

    @property
    def needs_gpus(self) -> bool:
        """verl's trainers need GPUs even when unstated; anything else when it states some."""
        return bool(self.gpus_per_node) or (self.ray_only and self.gpus_per_node != 0)

    def at_nodes(self, nodes: int) -> "JobShape":
        return replace(self, nodes=nodes)

    def overrides(self) -> dict[str, int]:
        """The keys that pin this shape for verl (only those stated)."""
        out = {}
        if self.nodes is not None:
            out[NODES_KEY] = self.nodes
        if self.gpus_per_node is not None:
            out[GPUS_KEY] = self.gpus_per_node
        return out

