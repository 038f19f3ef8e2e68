"""The request objects `submit` builds before it touches the cluster: a Ray job or a torchrun launch.

Plan, then apply: `build_*` are pure given their inputs; `--dry-run` prints `describe()` (secrets masked);
ray_jobs.py / torchrun.py apply them.
"""

from __future__ import annotations

import os
import re
import shlex
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Optional

from verl_cluster import vc_hooks
from verl_cluster.config.cluster import ClusterSpec
from verl_cluster.config.job import JobSpec
from verl_cluster.config.names import MASK, masked_env  # noqa: F401 - MASK: what tests and callers compare with
from verl_cluster.errors import ConfigError
from verl_cluster.verl_scripts.hydra_values import to_hydra

PYTHONS = ("python", "python3")


def override_args(overrides: Mapping[str, Any]) -> list[str]:
    return [f"{k}={to_hydra(v)}" for k, v in overrides.items()]


def submission_id(name: str, now: Optional[float] = None) -> str:
    """name + timestamp, e.g. gsm8k-ppo-20261121-085016-123 (ms keeps quick resubmits apart)."""
    t = time.time() if now is None else now
    safe = re.sub(r"[^A-Za-z0-9_-]+", "-", name).strip("-") or "job"
    return f"{safe}-{time.strftime('%Y%m%d-%H%M%S', time.gmtime(t))}-{int(t * 1000) % 1000:03d}"


def secret_values(job: JobSpec, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """Values of the job's secrets from the submitting shell; a missing one is bad input."""
    environ = os.environ if environ is None else environ
    missing = [n for n in job.secrets if n not in environ]
    if missing:
        raise ConfigError(f"{job.source}: secret{'s' if len(missing) > 1 else ''} {', '.join(missing)} "
                          "not set in this shell", f"export {missing[0]}=... before submitting")
    return {n: environ[n] for n in job.secrets}


def effective_overrides(job: JobSpec, plan_overrides: Mapping[str, Any]) -> dict[str, Any]:
    """Planner overrides first, the job's own (file, script + command line) on top: the job wins."""
    return merge_overrides(job, plan_overrides)[0]


@dataclass(frozen=True)
class NotApplied:
    """A planner suggestion left out, and why (the user's own setting wins)."""
    key: str
    value: Any
    reason: str

    def line(self) -> str:
        return f"{self.key}={to_hydra(self.value)}: {self.reason}"


def key_origin(job: JobSpec, key: str) -> str:
    """'file:line' of a verl key in the job file's `overrides` (or the script's line), else 'the command line'."""
    from verl_cluster.config.loader import read_yaml
    from verl_cluster.verl_scripts.script_import import is_script, script_key_origin

    if job.source == "<command line>":
        return "the command line"
    if is_script(job.source):
        return script_key_origin(job.source, key) or "the command line"
    try:
        _, lines = read_yaml(job.source)
    except Exception:  # noqa: BLE001 - a job built in memory, or a file gone since: no line to name
        return job.source
    bare = key.lstrip("+")
    for path in (("overrides", *bare.split(".")), ("overrides", bare), ("overrides", key)):
        if path in lines:
            return f"{job.source}:{lines[path]}"
    return "the command line"


# planner keys verl 0.9.1's ppo_megatron_trainer config lacks (its workers have no FSDP settings)
NOT_IN_MEGATRON = ("fsdp_config.", "critic.fsdp.", "critic.forward_micro_batch_size_per_gpu")


def uses_megatron(job: JobSpec) -> bool:
    """verl's Megatron workers (ppo_megatron_trainer config): no fsdp_config keys there."""
    from verl_cluster.placement.settings import uses_megatron as megatron

    return megatron(job)


def merge_overrides(job: JobSpec, plan_overrides: Mapping[str, Any]) -> tuple[dict[str, Any], list[NotApplied]]:
    """(what verl gets, the planner's suggestions not applied). The user's keys always win, compared without
    Hydra's +/++ prefixes (two spellings of one key would make Hydra fail), and a per-GPU micro batch is not
    added where the user set the global one (verl refuses both)."""
    own = job.verl_overrides()
    bare = {k.lstrip("+"): k for k in own}
    megatron = uses_megatron(job)
    applied: dict[str, Any] = {}
    skipped: list[NotApplied] = []
    for key, value in plan_overrides.items():
        b = key.lstrip("+")
        mine = bare.get(b) or (bare.get(b[:-len("_per_gpu")]) if b.endswith("_per_gpu") else None)
        if mine is not None:
            said = f"you set {mine}={to_hydra(own[mine])} ({key_origin(job, mine)})"
            if mine.lstrip("+") != b:
                skipped.append(NotApplied(key, value, f"{said}; verl refuses both"))
            elif to_hydra(own[mine]).lower() != to_hydra(value).lower():
                skipped.append(NotApplied(key, value, said))
            continue
        if megatron and any(m in b for m in NOT_IN_MEGATRON):
            skipped.append(NotApplied(key, value, "not a key of verl's Megatron config, which the job uses (the "
                                                  "planner models FSDP workers: its numbers are estimates here)"))
            continue
        applied[key] = value
    return {**applied, **own}, skipped


def program_argv(job: JobSpec, python: str, overrides: Mapping[str, Any]) -> list[str]:
    """What runs: `python -m MODULE ARGS OVERRIDES` or the command (its `python` made absolute)."""
    if job.entrypoint:
        base = [python, "-m", job.entrypoint]
    else:
        base = list(job.command)
        if base[0] in PYTHONS:
            base[0] = python  # over SSH and in Ray's job shell the venv is not on PATH
    return base + list(job.args) + override_args(overrides)


def resolve_working_dir(job: JobSpec) -> Optional[str]:
    if not job.working_dir:
        return None
    p = Path(os.path.expanduser(job.working_dir))
    if not p.is_absolute():
        p = Path(job.source).parent / p
    if not p.is_dir():
        raise ConfigError(f"{job.source}: working_dir `{job.working_dir}` is not a directory ({p})",
                          "name the folder that holds the job's code (shipped to every node; the command runs in it)")
    return str(p.resolve())


@dataclass(frozen=True)
class RayJobRequest:
    submission_id: str
    argv: list[str]
    runtime_env: dict[str, Any]
    metadata: dict[str, str]
    secret_names: tuple[str, ...] = ()

    @property
    def entrypoint(self) -> str:
        return shlex.join(self.argv)

    def describe(self) -> dict[str, Any]:
        env = self.runtime_env.get("env_vars", {})
        return {"launcher": "ray", "submission_id": self.submission_id, "entrypoint": self.entrypoint,
                "runtime_env": {**self.runtime_env, "env_vars": masked_env(env, self.secret_names)},
                "metadata": self.metadata}


def build_ray_request(job: JobSpec, spec: ClusterSpec, overrides: Mapping[str, Any], backend_env: Mapping[str, str],
                      secrets: Mapping[str, str], plan_meta: str = "", now: Optional[float] = None) -> RayJobRequest:
    argv = program_argv(job, spec.python_executable(spec.head), overrides)
    env = {**dict(backend_env), **job.env, **dict(secrets)}
    runtime_env: dict[str, Any] = {k: v for k, v in job.runtime_env.items() if k != "env_vars"}
    runtime_env["env_vars"] = {**(job.runtime_env.get("env_vars") or {}), **env}
    wd = resolve_working_dir(job)
    if wd:
        runtime_env["working_dir"] = wd
    if gc_freezes(job, runtime_env):
        add_gc_freeze(job, runtime_env)
    sid = submission_id(job.name, now)
    meta = {"verl_cluster.job": job.name, "verl_cluster.cluster": spec.cluster_name,
            "verl_cluster.source": str(job.source)}
    if plan_meta:
        meta["verl_cluster.plan"] = plan_meta
    return RayJobRequest(sid, argv, runtime_env, meta, tuple(secrets))


GC_HOOK = "vc_hooks.setup"  # verl_cluster/vc_hooks, shipped to every node as a module of its own


# the fields the freeze ships at the job's level: a driver's own ray.init(runtime_env=...) naming one of them makes
# Ray refuse to merge the two ("Failed to merge the Job's runtime env"); verl's main_ppo takes its from these keys
GC_FIELDS = ("py_modules", "worker_process_setup_hook")
VERL_RAY_ENV = "ray_kwargs.ray_init.runtime_env."


def gc_freezes(job: JobSpec, runtime_env: Mapping[str, Any]) -> bool:
    """`auto` (the default) freezes unless the job brought its own worker set-up hook, which Ray runs alone, or
    verl's ray.init is given py_modules or a hook of its own (Ray would refuse the two runtime_envs): batch R
    (docs/BENCHMARKS.md) measured the workers' 50 ms+ pauses at 0.38 s a step without it, none with it."""
    if job.python_gc == "auto":
        keys = [*job.verl_overrides(), *(w.split("=", 1)[0] for w in (*job.command, *job.args) if "=" in w)]
        driver = any(k.lstrip("+").startswith(VERL_RAY_ENV + f) for k in keys for f in GC_FIELDS)
        return not runtime_env.get("worker_process_setup_hook") and not driver
    return job.python_gc == "freeze"


def add_gc_freeze(job: JobSpec, runtime_env: dict[str, Any]) -> None:
    """Ray runs GC_HOOK in every worker process of the job; the job's own hook would be replaced, so it is refused."""
    own = runtime_env.get("worker_process_setup_hook")
    if own and own != GC_HOOK:
        raise ConfigError(f"{job.source}: python_gc: freeze needs Ray's worker_process_setup_hook, and "
                          f"runtime_env.worker_process_setup_hook is set ({own})",
                          "drop python_gc: freeze, or call gc.freeze() in your own hook")
    mods = runtime_env.get("py_modules") or []
    runtime_env["py_modules"] = [*mods, str(Path(vc_hooks.__file__).parent)]
    runtime_env["worker_process_setup_hook"] = GC_HOOK
    runtime_env["env_vars"]["VERL_CLUSTER_GC"] = "freeze"


# ---- torchrun ----
@dataclass(frozen=True)
class NodeLaunch:
    host: str
    rank: int
    argv: list[str]
    env: dict[str, str]
    workdir: Optional[str] = None  # where the job's code is copied on that node


@dataclass(frozen=True)
class TorchrunRequest:
    run_id: str
    master_addr: str
    master_port: int
    nproc_per_node: int
    nodes: list[NodeLaunch]
    local_working_dir: Optional[str] = None
    secret_names: tuple[str, ...] = ()
    notes: list[str] = field(default_factory=list)

    def describe(self) -> dict[str, Any]:
        return {"launcher": "torchrun", "run_id": self.run_id, "master": f"{self.master_addr}:{self.master_port}",
                "nproc_per_node": self.nproc_per_node, "working_dir": self.local_working_dir,
                "nodes": [{"host": n.host, "rank": n.rank, "command": shlex.join(n.argv), "workdir": n.workdir,
                           "env": masked_env(n.env, self.secret_names)} for n in self.nodes]}


# python's own flags before the script, as the environment torchrun's workers inherit (torchrun starts them with
# its own interpreter: `python -u train.py` must not become `torchrun ... -u train.py`, a torchrun flag error)
PYTHON_FLAG_ENV = {"-u": ("PYTHONUNBUFFERED", "1"), "-B": ("PYTHONDONTWRITEBYTECODE", "1"),
                   "-O": ("PYTHONOPTIMIZE", "1"), "-OO": ("PYTHONOPTIMIZE", "2")}


def python_flags(cmd: list[str], source: str = "the job") -> tuple[list[str], dict[str, str]]:
    """(the command after `python` and its own flags, the environment those flags become); a flag torchrun's
    workers cannot be given (-c, -X, -I, ...) is a ConfigError naming `command`."""
    from verl_cluster.errors import ConfigError

    rest, env = list(cmd[1:]), {}
    while rest and rest[0].startswith("-") and rest[0] != "-m":
        flag = rest.pop(0)
        if flag in PYTHON_FLAG_ENV:
            k, v = PYTHON_FLAG_ENV[flag]
            env[k] = v
        elif flag.startswith("-W"):
            env["PYTHONWARNINGS"] = flag[2:] or (rest.pop(0) if rest else "")
        else:
            raise ConfigError(f"{source}: command: python {flag} cannot go through torchrun (it starts each rank "
                              "with its own interpreter, running a script or -m MODULE)",
                              "launcher: ray runs the command as written; or make it a script (-c) / drop the flag")
    return rest, env


def torchrun_program(job: JobSpec, overrides: Mapping[str, Any]) -> list[str]:
    """The part after torchrun's own flags: `-m MODULE ...`, `SCRIPT ...` or `--no-python CMD ...`."""
    return torchrun_program_env(job, overrides)[0]


def torchrun_program_env(job: JobSpec, overrides: Mapping[str, Any]) -> tuple[list[str], dict[str, str]]:
    """torchrun_program and the environment the python flags before the script become (`python -u` ...)."""
    tail = list(job.args) + override_args(overrides)
    if job.entrypoint:
        return ["-m", job.entrypoint] + tail, {}
    cmd = list(job.command)
    if cmd[0] in PYTHONS or cmd[0].endswith("/python") or cmd[0].endswith("/python3"):
        rest, env = python_flags(cmd, str(job.source or "the job"))
        return rest + tail, env
    return ["--no-python"] + cmd + tail, {}


def build_torchrun_request(job: JobSpec, spec: ClusterSpec, overrides: Mapping[str, Any],
                           backend_env: Mapping[str, Mapping[str, str]], secrets: Mapping[str, str],
                           gpus_per_node: Optional[int] = None, now: Optional[float] = None) -> TorchrunRequest:
    if job.python_gc == "freeze":
        raise ConfigError(f"{job.source}: python_gc: freeze is done by Ray in the job's workers; torchrun has no such "
                          "hook", "drop python_gc: freeze, or run the job with launcher: ray")
    nodes = spec.nodes()
    nproc = job.torchrun.nproc_per_node or gpus_per_node or spec.head.gpus or 1
    run_id = submission_id(job.name, now)
    wd_local = resolve_working_dir(job)
    wd_remote = f"{spec.temp_dir}/jobs/{run_id}" if wd_local else None
    program, flag_env = torchrun_program_env(job, overrides)
    launches = []
    for rank, (_, node) in enumerate(nodes):
        python = spec.python_executable(node)
        argv = [python, "-m", "torch.distributed.run", "--nnodes", str(len(nodes)), "--nproc-per-node", str(nproc),
                "--node-rank", str(rank), "--master-addr", spec.head_ip, "--master-port", str(job.torchrun.master_port),
                "--rdzv-conf", f"timeout={int(job.torchrun.rdzv_timeout_s)}", *program]
        if wd_remote:
            argv = ["env", "-C", wd_remote] + argv
        env = {**dict(backend_env.get(node.host, {})), **node.env, **flag_env, **job.env, **dict(secrets)}
        launches.append(NodeLaunch(node.host, rank, argv, env, wd_remote))
    return TorchrunRequest(run_id, spec.head_ip, job.torchrun.master_port, nproc, launches, wd_local, tuple(secrets))
