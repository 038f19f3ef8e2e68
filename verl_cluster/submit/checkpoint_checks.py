"""Preflight of a Ray job's checkpoint folder, judged where the folder is visible (shared storage, or one node):
verl resumes the newest checkpoint by default and loads the files of the world size it runs on, so one saved on
another number of GPUs fails it; and saves kept on tmpfs stay in RAM."""

from __future__ import annotations

from typing import Optional

from verl_cluster.config.job import JobSpec
from verl_cluster.config.job_shape import JobShape
from verl_cluster.submit.ckpt_memory import ram_checkpoint_warning
from verl_cluster.submit.findings import Finding


def resume_findings(job: JobSpec, shape: JobShape) -> list[Finding]:
    """An error when the checkpoint verl would resume was saved for another world size than `shape` (the job's
    counts as they will be sent, the plan's included)."""
    from verl_cluster.reshard import resume_world_size_problem

    mode = str(job.get("trainer.resume_mode") or "auto")
    folder = job.get("trainer.resume_from_path") if mode == "resume_path" else job.get("trainer.default_local_dir")
    if mode == "disable" or not folder or not shape.gpus_per_node:
        return []
    problem = resume_world_size_problem(str(folder), shape.verl_world)
    return [Finding("error", "checkpoint", problem, "or trainer.resume_mode=disable to start again")] if problem else []


def ram_checkpoint_findings(job: JobSpec, mounts_text: Optional[str] = None) -> list[Finding]:
    """A warning when checkpoints are saved into a tmpfs folder (`mounts_text`: /proc/mounts, read when None)."""
    try:
        save_freq = int(job.get("trainer.save_freq") or -1)
    except (TypeError, ValueError):
        return []
    found = ram_checkpoint_warning(str(job.get("trainer.default_local_dir") or ""), save_freq, mounts_text)
    return [Finding("warning", "checkpoint", *found)] if found else []


def checkpoint_findings(job: JobSpec, overrides) -> list[Finding]:
    """Both, for the request's overrides (the job's keys with the plan's merged in)."""
    return resume_findings(job, JobShape.of_overrides(overrides)) + ram_checkpoint_findings(job)
