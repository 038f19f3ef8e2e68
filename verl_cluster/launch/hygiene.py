"""Run hygiene for verl's trainers: settings that do not fail the run but lose its results or stop it at start.

- trainer.default_local_dir unset (or relative) while the run saves checkpoints: verl's default,
  checkpoints/<project>/<experiment>, is relative to the driver's working directory, which for a Ray job is a
  Ray temp folder: the checkpoints land where no one looks, and go with it.
- trainer.logger with wandb (verl's default, [console, wandb], when unset) and no way for wandb to log in on the
  nodes: wandb.init fails in the trainer, minutes into the start-up.
"""

from __future__ import annotations

from typing import Any, Mapping

from verl_cluster.config.job import JobSpec

VERL_DEFAULT_CKPT = "checkpoints/${trainer.project_name}/${trainer.experiment_name}"
NO_LOGIN_MODES = ("offline", "disabled")


def is_verl_trainer_module(job: JobSpec) -> bool:
    """verl's trainers (PPO/GRPO, SFT): their config has trainer.logger, save_freq and default_local_dir."""
    return (job.entrypoint or "").startswith("verl.trainer.")


def save_freq(overrides: Mapping[str, Any]) -> int:
    try:
        return int(overrides.get("trainer.save_freq", -1))
    except (TypeError, ValueError):
        return -1


def checkpoint_dir_findings(job: JobSpec, overrides: Mapping[str, Any]) -> list:
    """A warning when the run saves checkpoints into a folder relative to the driver's working directory."""
    from verl_cluster.launch.preflight import Finding

    freq = save_freq(overrides)
    if not is_verl_trainer_module(job) or freq <= 0:
        return []
    folder = overrides.get("trainer.default_local_dir")
    hint = "set trainer.default_local_dir to an absolute folder on storage every node writes, e.g. " \
           f"trainer.default_local_dir=/shared/ckpt/{job.name}"
    where = "relative to the working directory of the job's driver, a Ray temp folder: the checkpoints land " \
            "where no one looks, and are gone with that folder"
    if not folder:
        return [Finding("warning", "checkpoint", f"trainer.default_local_dir is not set: verl saves a checkpoint "
                                                 f"every {freq} step(s) under {VERL_DEFAULT_CKPT}, {where}", hint)]
    text = str(folder)
    if not text.startswith(("/", "~", "$", "hdfs://", "s3://", "gs://")):
        return [Finding("warning", "checkpoint", f"trainer.default_local_dir `{text}` is a relative path: verl "
                                                 f"saves a checkpoint every {freq} step(s) {where}", hint)]
    return []


def wants_wandb(job: JobSpec, overrides: Mapping[str, Any]) -> bool:
    """Does the run log to wandb: trainer.logger names it, or is unset in a verl trainer (its default does)."""
    if not is_verl_trainer_module(job):
        return False
    logger = overrides.get("trainer.logger")
    if logger is None:
        return True
    items = logger if isinstance(logger, (list, tuple)) else [logger]
    return any("wandb" in str(x) for x in items)


def _login_in(env: Mapping[str, Any]) -> bool:
    return bool(env.get("WANDB_API_KEY")) or str(env.get("WANDB_MODE") or "") in NO_LOGIN_MODES


def wandb_unknown(spec: Any, job: JobSpec, overrides: Mapping[str, Any]) -> bool:
    """True when the run logs to wandb and nothing here gives it a login: the nodes are asked then (their env,
    their ~/.netrc from `wandb login`). The job's secrets, its env and the cluster's env count."""
    if not wants_wandb(job, overrides):
        return False
    from verl_cluster.launch.node_paths import job_env

    if "WANDB_API_KEY" in job.secrets or _login_in(job_env(job)) or _login_in(spec.ray.env):
        return False
    nodes = [n for _, n in spec.nodes()]
    return not (nodes and all(_login_in(n.env) for n in nodes))


def wandb_findings(results: Mapping[str, Any]) -> list:
    """The warning naming the nodes where wandb cannot log in (node_files.wandb_login), if any."""
    from verl_cluster.launch.preflight import Finding

    lacking = [h for h, r in results.items() if isinstance(r, dict) and r.get("wandb_login") is False]
    if not lacking:
        return []
    return [Finding("warning", "env", "trainer.logger includes wandb (verl's default when trainer.logger is unset), "
                                      "but WANDB_API_KEY is not in the job's env and "
                                      f"{', '.join(lacking)} {'has' if len(lacking) == 1 else 'have'} no wandb "
                                      "login: wandb.init fails when the trainer starts",
                    "add `secrets: [WANDB_API_KEY]` to the job (read from your shell at submit), "
                    "or log without it: trainer.logger=[console]")]
