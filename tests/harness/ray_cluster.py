"""A real Ray cluster on lab hosts for a test module: `up` on entry, `down` on exit."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Sequence

from tests.harness.netns import Host, NetnsLab


@contextlib.contextmanager
def running_cluster(lab: NetnsLab, head: Host, workers: Sequence[Host] = (), name: str | None = None,
                    extra: str = "", backend_env: bool = False) -> Iterator[Path]:
    """Yields the cluster file of a healthy cluster (head + workers); `backend_env`: started as the CLI's `up`
    starts it, with the detected NCCL/Gloo interface in every node's environment (a few seconds more)."""
    from verl_cluster.config.cluster import load_cluster
    from verl_cluster.lifecycle.bring_up import bring_up
    from verl_cluster.lifecycle.down import down
    from verl_cluster.lifecycle.up import up

    path = lab.cluster_yaml(head, list(workers), name=name, extra=extra)
    spec = load_cluster(path)
    report = bring_up(spec).report if backend_env else up(spec)
    assert report.healthy, report.to_json()
    try:
        yield path
    finally:
        down(spec)


@dataclass(frozen=True)
class SharedCluster:
    """The session's shared cluster (tests/conftest.py `shared_cluster`)."""

    lab: NetnsLab
    path: Path
    head: Host
    worker: Host

    @property
    def token(self) -> str:
        from verl_cluster.config.cluster import load_cluster

        return load_cluster(self.path).token_file.read_text().strip()
