"""How a job runs, chosen once per submission (submit/pipeline.decide_launcher), as the cluster launchers are chosen
once per cluster: Ray's Jobs API on this cluster's Ray, or torchrun started on every node over the runners.

Each kind builds its request from the same inputs and starts the job. What differs is said by flags, not
by comparing names: a job on the cluster's Ray gets the cluster's status, GPU fit and checkpoint checks before it
starts, is detached from this process (its log is followed, it can be watched and resumed); a torchrun run lives as
long as this process and streams rank 0 here.
"""

from __future__ import annotations

import sys
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, ClassVar, Mapping, Optional, TextIO, Union

from verl_cluster.config.cluster import ClusterSpec
from verl_cluster.config.job import JobSpec
from verl_cluster.errors import ConfigError
from verl_cluster.jobs.request import RayJobRequest, TorchrunRequest, build_ray_request, build_torchrun_request

Request = Union[RayJobRequest, TorchrunRequest]


@dataclass(frozen=True)
class LaunchInputs:
    """What either kind builds its request from (the pipeline reads it all before choosing)."""

    overrides: Mapping[str, Any]  # verl's keys, the plan's merged under the user's, paths expanded
    env_by_host: Mapping[str, Mapping[str, str]]  # the backend env per node (NCCL/Gloo/UCX interface choice)
    env: Mapping[str, str] = field(default_factory=dict)  # the same, merged for a job Ray places itself
    secrets: Mapping[str, str] = field(default_factory=dict)
    plan_metadata: str = ""  # the plan's predictions, kept with a Ray job for `jobs --json` and the follow
    gpus_per_node: Optional[int] = None  # torchrun's processes per node when the job leaves it to the nodes


class JobLauncher(ABC):
    kind: ClassVar[str]
    on_cluster_ray: ClassVar[bool]  # runs on this cluster's Ray: status, GPU fit and checkpoint checks apply
    detached: ClassVar[bool]  # outlives this process: followed by its log, watchable, resumable

    @abstractmethod
    def request(self, job: JobSpec, spec: ClusterSpec, inputs: LaunchInputs) -> Request:
        """The job as data, nothing started (`submit --dry-run` prints it)."""

    def check_watchable(self) -> None:
        """`--watch` follows attempts through Ray's Jobs API: refused, with the fix, where the kind has none."""
        if not self.detached:
            raise ConfigError(f"--watch needs a Ray job ({self.kind} runs are not watched yet)",
                              "drop --watch, or run the job with launcher: ray")


class RayJobLauncher(JobLauncher):
    kind, on_cluster_ray, detached = "ray", True, True

    def request(self, job: JobSpec, spec: ClusterSpec, inputs: LaunchInputs) -> RayJobRequest:
        return build_ray_request(job, spec, inputs.overrides, inputs.env, inputs.secrets, inputs.plan_metadata)

    def submit(self, api, req: RayJobRequest) -> str:
        """The submission id; the job runs on without this process."""
        from verl_cluster.jobs import ray_jobs

        return ray_jobs.submit(api, req)


class TorchrunLauncher(JobLauncher):
    kind, on_cluster_ray, detached = "torchrun", False, False

    def request(self, job: JobSpec, spec: ClusterSpec, inputs: LaunchInputs) -> TorchrunRequest:
        return build_torchrun_request(job, spec, inputs.overrides, inputs.env_by_host, inputs.secrets,
                                      inputs.gpus_per_node)

    def run(self, spec: ClusterSpec, req: TorchrunRequest, out: TextIO = sys.stdout):
        """Start torchrun on every node and stream rank 0 until every node exits (a node failing stops the rest;
        Ctrl-C stops them all): the run's result per node."""
        from verl_cluster.jobs.torchrun import run_torchrun

        return run_torchrun(spec, req, out=out)


JOB_LAUNCHERS: dict[str, JobLauncher] = {j.kind: j for j in (RayJobLauncher(), TorchrunLauncher())}


def job_launcher_for(kind: str) -> JobLauncher:
    try:
        return JOB_LAUNCHERS[kind]
    except KeyError:
        raise ConfigError(f"launcher: unknown kind {kind!r}", f"one of: {', '.join(JOB_LAUNCHERS)} (or auto)") from None
