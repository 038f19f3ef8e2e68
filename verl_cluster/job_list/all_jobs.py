"""The jobs of every cluster this machine knows (job_records.known_clusters), asked in parallel with one deadline:
each cluster's jobs, or why it gave none. One gone cluster (an allocation long ended, a head switched off) never
hides the others' jobs, nor holds them up past the deadline; one taken down from here is not asked, it is down."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

from verl_cluster.config.cluster import ClusterSpec
from verl_cluster.errors import VerlClusterError
from verl_cluster.jobs import ray_jobs
from verl_cluster.records.job_records import KnownCluster

ANSWER_TIMEOUT_S = 20.0  # SSH connect (its own timeout), tunnel, the Jobs API's version check and list


@dataclass(frozen=True)
class ClusterJobs:
    cluster: str
    cluster_file: str
    rows: Optional[list[ray_jobs.JobRow]] = None  # None: the cluster did not answer
    error: str = ""
    hint: str = ""
    down_at: float = 0.0  # taken down from here then (not asked); 0: asked
    overrides: tuple[str, ...] = ()  # what `up` recorded with the file: the way back needs them too
    pairs: Optional[dict] = None  # submission id -> its predicted vs measured pairs (job_list/job_pairs.py)

    @property
    def answered(self) -> bool:
        return self.rows is not None

    @property
    def down(self) -> bool:
        return self.down_at > 0

    def to_json(self) -> dict:
        d = {"cluster": self.cluster, "cluster_file": self.cluster_file, "answered": self.answered, "down": self.down}
        if self.rows is not None:
            from verl_cluster.job_list.job_pairs import with_pairs

            return d | {"jobs": with_pairs(self.rows, self.pairs or {})}
        if self.down:
            return d | {"down_at": self.down_at}
        return d | {"error": self.error, "hint": self.hint}


Loader = Callable[[str, list], ClusterSpec]  # (cluster file, key=value overrides) -> spec


PAIRS_MARGIN_S = 0.5  # the logs' share of the deadline ends this much before it, so the cluster still answers


def _ask(known: KnownCluster, load: Loader, extra: Sequence[str], pairs_until: Optional[float] = None) -> ClusterJobs:
    try:
        spec = load(known.cluster_file, [*known.overrides, *extra])
        with ray_jobs.connect(spec) as api:
            rows = ray_jobs.list_jobs(api)
            pairs = None
            if pairs_until is not None:
                from verl_cluster.job_list.job_pairs import job_pairs

                pairs = job_pairs(api, rows, max(0.0, pairs_until - time.monotonic()))
            return ClusterJobs(spec.cluster_name, known.cluster_file, rows, pairs=pairs)
    except VerlClusterError as e:
        return ClusterJobs(known.name, known.cluster_file, error=e.message, hint=e.hint or "")
    except Exception as e:  # whatever one cluster raises is its answer: the others are still listed
        return ClusterJobs(known.name, known.cluster_file, error=f"{type(e).__name__}: {str(e)[:300]}")


def jobs_everywhere(clusters: Sequence[KnownCluster], load: Loader, overrides: Sequence[str] = (),
                    timeout_s: float = ANSWER_TIMEOUT_S, pairs: bool = False) -> list[ClusterJobs]:
    """Every cluster's jobs, in the order given; a cluster still silent at the deadline is reported as such (its
    thread is a daemon: it never keeps this process alive). One taken down from here is not asked: it is down.
    `pairs`: also each planned job's predicted vs measured pairs, its log read within the same deadline."""
    answers: dict[int, ClusterJobs] = {i: ClusterJobs(k.name, k.cluster_file, down_at=k.down_at,
                                                             overrides=tuple(k.overrides))
                                       for i, k in enumerate(clusters) if k.down}

    deadline = time.monotonic() + timeout_s
    until = deadline - min(PAIRS_MARGIN_S, timeout_s / 4) if pairs else None

    def ask(i: int, known: KnownCluster) -> None:
        answers[i] = _ask(known, load, overrides, until)

    threads = [threading.Thread(target=ask, args=(i, k), name=f"jobs-{k.name}", daemon=True)
               for i, k in enumerate(clusters) if i not in answers]
    for t in threads:
        t.start()
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    return [answers.get(i) or ClusterJobs(k.name, k.cluster_file, error=f"no answer within {timeout_s:g}s",
                                          hint=f"is its head up? `verl-cluster status -c {k.cluster_file}`")
            for i, k in enumerate(clusters)]
