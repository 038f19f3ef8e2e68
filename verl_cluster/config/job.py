"""Job spec schema (launch/*.yaml): one file describes a run for both `plan` and `submit`.

verl settings stay in verl's own key names under `overrides` (the one source of truth); `model` and
`data` are lifted out because preflight and the planner need them, and are turned back into overrides.
"""

from __future__ import annotations

import difflib
import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Optional

from verl_cluster.config.cluster import ENV, PATH
from verl_cluster.config.loader import apply_dotlist, build, read_yaml, short, where
from verl_cluster.config.names import HINTS, env_name_problem
from verl_cluster.errors import ConfigError


def is_verl_module(module: Optional[str]) -> bool:
    """Any of verl's modules (its trainers, SFT included): their Hydra config can be checked, their logs read."""
    return (module or "").startswith("verl.")


# verl's command-line tools that parse argparse flags, not Hydra overrides (verl/model_merger/__main__.py, scripts/)
VERL_ARGPARSE_TOOLS = ("verl.model_merger", "verl.scripts.")


def takes_hydra_overrides(module: Optional[str]) -> bool:
    """verl's Hydra programs (its trainers, generation, eval): their words are key=value overrides of verl's config."""
    m = module or ""
    return is_verl_module(m) and not any(m == t or m.startswith(t if t.endswith(".") else t + ".")
                                         for t in VERL_ARGPARSE_TOOLS)


def is_verl_trainer(module: Optional[str]) -> bool:
    """verl's Ray trainers (verl.trainer.main_ppo, ...): Ray drivers only, planned by the placement planner."""
    return (module or "").startswith("verl.trainer.main_")


@dataclass(frozen=True)
class ModelSpec:
    path: Optional[str] = field(default=None, metadata=PATH)  # local HF dir (on the nodes) or hub name
    catalog: Optional[str] = None  # shape from the shipped catalog, e.g. qwen2.5-0.5b
    # the model's config.json on this machine (plan/submit --model-config), for a model the catalog lacks;
    # relative to the job file. Only the planner reads it: verl still loads model.path
    config: Optional[str] = field(default=None, metadata=PATH)


@dataclass(frozen=True)
class DataSpec:
    train_files: list[str] = field(default_factory=list, metadata=PATH)
    val_files: list[str] = field(default_factory=list, metadata=PATH)


@dataclass(frozen=True)
class PlacementSpec:
    strategy: str = field(default="auto", metadata={"choices": ("auto", "colocate", "split", "separate-reward",
                                                                     "split-nodes")})
    gpus: Optional[str] = None  # hypothetical hardware, e.g. 2x8xH100-80GB (plan --gpus wins)
    allow_lora: bool = False  # the planner may propose LoRA (adapters trained, base frozen) when nothing else fits
    lora_rank: int = 32  # the rank it proposes
    # the planner may run a training phase at the GPU's limit (its live tensors fit, the allocator gives its cache
    # back: verl trains with expandable segments) when nothing fits with room; false: plans with room only
    # (`submit --watch` sets it after an OOM)
    at_limit: bool = True
    # the lengths real sequences have, when the user knows them (plan/submit plan at them as well as at the worst
    # case): average share of prompt+response a sequence uses, or the responses' average in tokens
    fill: Optional[float] = None
    mean_response_tokens: Optional[int] = None
    # factors measured on earlier runs (scripts/plan_factors.py --out FILE from `jobs --json`): plan and submit
    # scale their predicted seconds and host RAM by them (relative to the job file; plan --factors wins)
    factors: Optional[str] = None
    # the host's speed to plan the step time at (placement/learned_host.py): auto, the speed earlier runs showed on
    # the same machines (none kept: the calibrated hosts'); off, the calibrated hosts'; or a number from 0.5 to 2
    host_factor: Any = "auto"  # checked by learned_host.stated (YAML reads a bare `off` as false)


@dataclass(frozen=True)
class TorchrunSpec:
    nproc_per_node: Optional[int] = None  # default: GPUs per node, or 1 on CPU nodes
    master_port: int = 29500
    rdzv_timeout_s: float = 300.0


@dataclass(frozen=True)
class WatchSpec:
    """`submit --watch` / `watch`: how a long run is kept up (verl_cluster/watch)."""
    max_restarts: int = 3
    backoff_s: float = 10.0  # first wait before a restart; doubles each time
    backoff_max_s: float = 300.0
    hang_after: str = "30m"  # no new log line for this long = hung: seconds (90) or 90s / 30m / 2h
    allow_fewer_nodes: bool = False  # continue on the nodes left when a node cannot come back
    node_wait_s: float = 1800.0  # how long to wait for a lost node before giving up
    # allow_fewer_nodes: how long a node stays lost before the run goes on without it (a reboot comes back sooner)
    node_grace_s: float = 60.0
    notify: list[str] = field(default_factory=list)  # argv; gets each event as JSON on stdin


@dataclass(frozen=True)
class JobSpec:
    name: str = "???"
    entrypoint: Optional[str] = None  # a Python module run as `python -m`, e.g. verl.trainer.main_ppo
    command: list[str] = field(default_factory=list)  # or a command (argv)
    args: list[str] = field(default_factory=list)  # extra argv after the module / command
    launcher: str = field(default="auto", metadata={"choices": ("auto", "ray", "torchrun")})
    cluster: Optional[str] = field(default=None, metadata=PATH)  # cluster.yaml relative to this file, or a recorded name
    model: ModelSpec = field(default_factory=ModelSpec)
    data: DataSpec = field(default_factory=DataSpec)
    placement: PlacementSpec = field(default_factory=PlacementSpec)
    overrides: dict[str, Any] = field(default_factory=dict)  # verl Hydra overrides, verl key names
    env: dict[str, str] = field(default_factory=dict, metadata=ENV)
    # names of env vars read from the submitting shell
    secrets: list[str] = field(default_factory=list, metadata={"kind": "env_name"})
    working_dir: Optional[str] = field(default=None, metadata=PATH)  # local code shipped with the job (Ray runtime_env working_dir)
    runtime_env: dict[str, Any] = field(default_factory=dict)  # extra runtime_env keys (pip, excludes, ...)
    # freeze: each Ray worker freezes what survives a slow full collection of Python's collector (verl_cluster/vc_hooks);
    # auto: freeze unless the job sets its own runtime_env.worker_process_setup_hook; default: Python's own collector
    python_gc: str = field(default="auto", metadata={"choices": ("auto", "freeze", "default")})
    torchrun: TorchrunSpec = field(default_factory=TorchrunSpec)
    watch: WatchSpec = field(default_factory=WatchSpec)
    source: str = "<memory>"

    def verl_overrides(self) -> dict[str, Any]:
        """Flat verl overrides: model/data lifted back in, then the user's `overrides` (which win)."""
        out: dict[str, Any] = {}
        if self.model.path:
            out["actor_rollout_ref.model.path"] = self.model.path
            out["critic.model.path"] = self.model.path
        if self.data.train_files:
            out["data.train_files"] = list(self.data.train_files)
        if self.data.val_files:
            out["data.val_files"] = list(self.data.val_files)
        out.update(self.overrides)
        return out

    def get(self, key: str, default: Any = None) -> Any:
        """Effective value of a verl key (`a.b.c`) as this job sets it, else `default`."""
        return self.verl_overrides().get(key, default)

    @property
    def is_ray_only(self) -> bool:
        return is_verl_trainer(self.entrypoint)

    @property
    def runs_verl(self) -> bool:
        """verl's code runs: one of its modules as entrypoint, or `python -m verl...` in the command."""
        return any(is_verl_module(a) for a in [self.entrypoint or ""] + list(self.command))


def flatten(data: Any, prefix: str = "") -> dict[str, Any]:
    """{"a": {"b": 1}} -> {"a.b": 1}; lists stay values."""
    if not isinstance(data, dict):
        return {prefix: data} if prefix else {}
    out: dict[str, Any] = {}
    for k, v in data.items():
        key = f"{prefix}.{k}" if prefix else str(k)
        if isinstance(v, dict) and v:
            out.update(flatten(v, key))
        else:
            out[key] = v
    return out


JOB_KEYS = {f for f in JobSpec.__dataclass_fields__ if f != "source"}
_FREE_FORM = ("env", "runtime_env")  # job fields whose sub-keys are the user's own


def is_spec_key(key: str) -> bool:
    """Does a CLI `key=value` change the job spec (`model.path`, `env.X`) rather than verl
    (`data.train_batch_size` is verl's even though `data` is also a job field)?"""
    parts = key.split(".")
    if parts[0] not in JOB_KEYS or parts[0] == "overrides":
        return False
    if parts[0] in _FREE_FORM or len(parts) == 1:
        return True
    cls = JobSpec.__dataclass_fields__[parts[0]].type
    sub = {"model": ModelSpec, "data": DataSpec, "placement": PlacementSpec, "torchrun": TorchrunSpec,
           "watch": WatchSpec}.get(parts[0])
    return sub is not None and len(parts) == 2 and parts[1] in sub.__dataclass_fields__ and bool(cls)


_OURS = {"placement": PlacementSpec, "torchrun": TorchrunSpec, "watch": WatchSpec}  # sections verl has no keys in


def _no_typo(key: str, src: str) -> None:
    """A CLI key in one of our own sections that names no field is a typo, not a verl override."""
    parts = key.split(".")
    sub = _OURS.get(parts[0])
    if sub is None or len(parts) < 2 or parts[1] in sub.__dataclass_fields__:
        return
    near = difflib.get_close_matches(parts[1], list(sub.__dataclass_fields__), n=1)
    raise ConfigError(f"{src}: `{key}` (command line): `{parts[0]}` has no field `{parts[1]}`",
                      f"did you mean `{parts[0]}.{near[0]}`?" if near else
                      f"its fields: {', '.join(sub.__dataclass_fields__)}")


def load_job(path: str | os.PathLike, cli_overrides: list[str] | None = None) -> JobSpec:
    """Parse a job spec. CLI `key=value` items whose first part is a job field (e.g. `placement.strategy=split`)
    change the spec; all others are verl overrides (`data.train_batch_size=256`)."""
    data, lines = read_yaml(path)
    return job_from_data(data, str(path), cli_overrides, lines)


def job_from_data(data: Any, src: str, cli_overrides: list[str] | None = None, lines: dict | None = None) -> JobSpec:
    """A job spec from parsed YAML (or what `import` builds from a script), checked the same way."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{src}:1: expected a mapping at the top level")
    if isinstance(data.get("overrides"), dict):
        data = dict(data, overrides=flatten(data["overrides"]))
    spec_items, verl_items = [], []
    for item in cli_overrides or []:
        key = item.partition("=")[0].strip().lstrip("+")
        _no_typo(key, src)
        (spec_items if is_spec_key(key) else verl_items).append(item)
    if spec_items:
        data = apply_dotlist(data, spec_items, src)
    if verl_items:
        extra = flatten(apply_dotlist({}, verl_items, src))
        data = dict(data, overrides={**(data.get("overrides") or {}), **extra})
    job = build(JobSpec, data, src, lines or {})
    job = replace(job, source=src)
    for k in (job.runtime_env.get("env_vars") or {}) if isinstance(job.runtime_env.get("env_vars"), dict) else ():
        if env_name_problem(str(k)):
            raise ConfigError(f"{where(src, lines or {}, ('runtime_env', 'env_vars', k))}: `runtime_env.env_vars` key "
                              f"`{short(k, 80)}` {env_name_problem(str(k))}", HINTS["env_name"])
    if bool(job.entrypoint) == bool(job.command):
        raise ConfigError(f"{src}: set exactly one of `entrypoint` (a Python module) or `command` (an argv list)",
                          "e.g. entrypoint: verl.trainer.main_ppo")
    if job.launcher == "torchrun" and job.is_ray_only:
        raise ConfigError(f"{src}: `{job.entrypoint}` runs on Ray; launcher torchrun cannot run it",
                          "use launcher: ray (or auto)")
    return job


def beside_job(job: JobSpec, name: str) -> Path:
    """A path a job file names: relative to the job file only, never to the directory the command runs in (a file
    planted there, in /tmp say, would be taken instead)."""
    p = Path(name).expanduser()
    return p if p.is_absolute() else Path(job.source).parent / p


def job_factors_path(job: JobSpec) -> Optional[str]:
    """The factors file a job names (placement.factors), resolved relative to the job file."""
    return str(beside_job(job, job.placement.factors)) if job.placement.factors else None


def job_model_config(job: JobSpec) -> Optional[str]:
    """The model config.json a job names (model.config), resolved relative to the job file."""
    return str(beside_job(job, job.model.config)) if job.model.config else None


def job_cluster_path(job: JobSpec, default: str | None = None) -> Optional[Path]:
    """The cluster file a job names, resolved relative to the job file."""
    if job.cluster:
        return beside_job(job, job.cluster)
    return Path(default) if default else None
