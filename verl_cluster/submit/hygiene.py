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
from verl_cluster.submit.findings import Finding

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
    from verl_cluster.submit.node_paths import job_env

    if "WANDB_API_KEY" in job.secrets or _login_in(job_env(job)) or _login_in(spec.ray.env):
        return False
    nodes = [n for _, n in spec.nodes()]
    return not (nodes and all(_login_in(n.env) for n in nodes))


def wandb_findings(results: Mapping[str, Any]) -> list:
    """The warning naming the nodes where wandb cannot log in (node_files.wandb_login), if any."""
    lacking = [h for h, r in results.items() if isinstance(r, dict) and r.get("wandb_login") is False]
    if not lacking:
        return []
    return [Finding("warning", "env", "trainer.logger includes wandb (verl's default when trainer.logger is unset), "
                                      "but WANDB_API_KEY is not in the job's env and "
                                      f"{', '.join(lacking)} {'has' if len(lacking) == 1 else 'have'} no wandb "
                                      "login: wandb.init fails when the trainer starts",
                    "add `secrets: [WANDB_API_KEY]` to the job (read from your shell at submit), "
                    "or log without it: trainer.logger=[console]")]


# ---- after a run: how to resume it by hand ----
RESUME = "trainer.resume_mode=auto"


def _not_resume_mode(word: str) -> bool:
    return word.split("=", 1)[0].lstrip("+") != "trainer.resume_mode"


def resume_command(job_input: Any, cluster_file: str) -> str:
    """The `verl-cluster submit` line that runs the same job again from its newest checkpoint: what the user
    typed (JobInput), any trainer.resume_mode of theirs replaced by auto, the cluster file made absolute."""
    import shlex
    from pathlib import Path

    cluster = str(Path(cluster_file).resolve()) if Path(cluster_file).exists() else cluster_file
    own = [w for w in job_input.overrides if _not_resume_mode(w)]
    if job_input.kind == "command":  # every word after `--` is the program's: the key goes at its end
        argv = [w for w in job_input.argv if _not_resume_mode(w)] + [RESUME]
        return shlex.join(["verl-cluster", "submit", "-c", cluster, *own, "--", *argv])
    return shlex.join(["verl-cluster", "submit", job_input.path, *own, RESUME, "-c", cluster])


def checkpoint_folder(argv: Any) -> str:
    """The absolute trainer.default_local_dir a run saves checkpoints into, read from the request's words (the
    paths as the nodes expanded them), or "" when it saves none or saves them where no one finds them."""
    words = dict(w.split("=", 1) for w in argv if isinstance(w, str) and "=" in w and not w.startswith("-"))
    words = {k.lstrip("+"): v for k, v in words.items()}
    folder = words.get("trainer.default_local_dir", "").strip("'\"")
    return folder if save_freq(words) > 0 and folder.startswith("/") else ""


def resume_hint(job_input: Any, cluster_file: str, argv: Any) -> str:
    """The line printed after a run that saved checkpoints into a folder it can resume from; else ""."""
    folder = checkpoint_folder(argv)
    if not folder or job_input is None:
        return ""
    return f"resume it by hand from its newest checkpoint in {folder}: {resume_command(job_input, cluster_file)}"
