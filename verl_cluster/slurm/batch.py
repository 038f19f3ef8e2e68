"""`verl-cluster sbatch`: a batch script that runs up (Slurm mode), check --quick, submit, and down on exit.

The script is data built from a BatchRequest (printed by --dry-run); every value is quoted once, here.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from verl_cluster.config.loader import short
from verl_cluster.config.names import path_problem
from verl_cluster.errors import ConfigError

_TIME = re.compile(r"^(\d+|\d+:\d{2}(:\d{2})?|\d+-\d+(:\d{2}){0,2})$")  # Slurm's --time forms


@dataclass(frozen=True)
class BatchRequest:
    job_file: str  # absolute path of the job spec (or verl script)
    job_name: str
    nodes: int
    gpus_per_node: int = 0
    cpus_per_node: Optional[int] = None
    time: Optional[str] = None
    partition: Optional[str] = None
    account: Optional[str] = None
    log_dir: str = "logs/verl-cluster"  # absolute once resolved; one folder per Slurm job under it
    overrides: list[str] = field(default_factory=list)
    cluster_overrides: list[str] = field(default_factory=list)  # key=value for up/check/down
    watch: bool = True
    sbatch_args: list[str] = field(default_factory=list)  # extra #SBATCH lines, e.g. --constraint=h100
    python: str = sys.executable  # the Python that holds verl-cluster, on a filesystem every node sees


def validate(req: BatchRequest) -> None:
    # #SBATCH lines and comments cannot be quoted: a newline in a value there starts a script line that runs
    lines = [("the job file's path", req.job_file), ("--log-dir", req.log_dir), ("the Python path", req.python),
             *(("--sbatch-arg", a) for a in req.sbatch_args)]
    for what, v in lines:
        if path_problem(v):
            raise ConfigError(f"{what} {short(repr(v), 120)} {path_problem(v)}: it would start a new line of the "
                              "batch script", "rename it, or pass a value without newlines or control characters")
    for a in req.sbatch_args:
        if not a.startswith("-"):
            raise ConfigError(f"--sbatch-arg {short(repr(a), 120)} is not an sbatch option",
                              "write it as an option, e.g. --sbatch-arg=--constraint=h100")
    if req.nodes < 1:
        raise ConfigError(f"--nodes must be >= 1, got {req.nodes}")
    if req.gpus_per_node < 0:
        raise ConfigError(f"--gpus-per-node must be >= 0, got {req.gpus_per_node}")
    if req.time and not _TIME.match(req.time):
        raise ConfigError(f"--time `{req.time}` is not a Slurm time", "write MINUTES, HH:MM:SS or D-HH:MM:SS")
    for v in (req.partition, req.account):
        if v is not None and not re.fullmatch(r"[\w.,-]+", v):
            raise ConfigError(f"`{v}` is not a Slurm partition/account name")


def safe_name(job_name: str) -> str:
    """A job's name as one plain file name (Slurm's --job-name, the script's file): no `/`, no leading dot."""
    return re.sub(r"[^\w.-]", "-", job_name)[:60].lstrip(".") or "verl"


def script(req: BatchRequest) -> str:
    """The batch script's text."""
    validate(req)
    q = shlex.quote
    name = safe_name(req.job_name)
    head = ["#!/bin/bash", f"#SBATCH --job-name={name}", f"#SBATCH --nodes={req.nodes}",
            "#SBATCH --ntasks-per-node=1"]
    if req.gpus_per_node:
        head.append(f"#SBATCH --gpus-per-node={req.gpus_per_node}")
    if req.cpus_per_node:
        head.append(f"#SBATCH --cpus-per-task={req.cpus_per_node}")
    for flag, v in (("time", req.time), ("partition", req.partition), ("account", req.account)):
        if v:
            head.append(f"#SBATCH --{flag}={v}")
    head.append(f"#SBATCH --output={req.log_dir}/slurm-%j.out")
    # the time limit sends TERM to this shell 90s early, so the trap can still run `down`
    head.append("#SBATCH --signal=B:TERM@90")
    head += [f"#SBATCH {a}" for a in req.sbatch_args]
    vc = [req.python, "-m", "verl_cluster"]
    cluster = ["--slurm", *req.cluster_overrides]
    submit = [*vc, "submit", req.job_file, "--slurm", *(["--watch"] if req.watch else []), *req.overrides]
    body = f"""
# written by `verl-cluster sbatch` on {time.strftime('%Y-%m-%d %H:%M:%S')} for {req.job_file}
# steps: up (Ray held by one srun step per node), check --quick, submit, and down on any exit
set -u
LOG={q(req.log_dir)}/"$SLURM_JOB_ID"
mkdir -p "$LOG"
echo "verl-cluster: job $SLURM_JOB_ID on $SLURM_JOB_NODELIST; logs in $LOG"
step() {{  # NAME ARGV...: run in the background and wait, so a TERM reaches the trap at once
  local name=$1; shift
  echo "== $name: $(date +%T)"
  "$@" > "$LOG/$name.log" 2>&1 &
  wait $!
  local rc=$?
  echo "== $name: exit $rc ($LOG/$name.log)"
  return $rc
}}
cleanup() {{
  trap - EXIT TERM INT
  step down {shlex.join([*vc, "down", *cluster])}
}}
trap cleanup EXIT
trap 'echo "== stopped by a signal"; exit 143' TERM INT
step up {shlex.join([*vc, "up", *cluster, "--no-check"])} || exit 1
step check {shlex.join([*vc, "check", *cluster, "--quick"])} || exit 1
step submit {shlex.join(submit)}
rc=$?
tail -n 5 "$LOG/submit.log"
exit $rc
"""
    return "\n".join(head) + "\n" + body


def resolve_log_dir(log_dir: str) -> str:
    p = Path(log_dir).expanduser().resolve()
    return str(p)


def write_script(text: str, path: Path, log_dir: str) -> Path:
    """The script at `path` (absolute, executable), and the log folder Slurm's --output needs (it makes none).
    Written to a new file beside it, then renamed over it: a link at `path` is refused, never followed."""
    path = Path(os.path.abspath(path))
    if path.is_symlink():
        raise ConfigError(f"{path} is a symbolic link: refusing to write the batch script through it",
                          "remove the link, or write the script elsewhere with --output")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        Path(log_dir).mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o700)
        with os.fdopen(fd, "w") as f:
            f.write(text)
            os.fchmod(f.fileno(), 0o755)
        os.replace(tmp, path)
    except OSError as e:
        raise ConfigError(f"cannot write the batch script {path}: {e.strerror or e}",
                          "choose a folder you can write with --log-dir or --output")
    return path


def submit_script(path: Path) -> tuple[str, str]:
    """`sbatch --parsable` the script: (Slurm's job id, what sbatch said on stderr besides)."""
    if not shutil.which("sbatch"):
        raise ConfigError("Slurm command `sbatch` not found",
                          "run on a Slurm login node (or `module load slurm`), or submit the written script there")
    try:
        r = subprocess.run(["sbatch", "--parsable", str(path)], capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        raise ConfigError("sbatch did not answer within 60s", "is slurmctld up? try `scontrol ping`")
    if r.returncode != 0:
        lines = (r.stderr.strip() or r.stdout.strip()).splitlines()
        raise ConfigError(f"sbatch refused the script: {lines[-1] if lines else f'exit {r.returncode}'}",
                          f"fix the request (partition, account, time, GPUs) and run again; script: {path}")
    return r.stdout.strip().split(";")[0], r.stderr.strip()
