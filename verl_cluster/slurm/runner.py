"""Run commands on a node of the allocation through `srun` (the CommandRunner protocol beside SSH and local).

Every command is its own job step: `srun --overlap --nodes=1 --ntasks=1 --nodelist=NODE --export=ALL -- argv`.
argv goes to execve on the node as is (no shell, no quoting). The environment travels in srun's own environment
(`--export=ALL`), so values never appear on a command line.

Ray is the exception: a step that ends takes its processes with it under proctrack/cgroup, and under
proctrack/linuxproc a daemonised `ray start` escapes the step and outlives even the allocation (measured with
Slurm 22.05, see docs/troubleshooting.md). So `run_held` starts `ray start --block` as one long-running step per node whose
srun client lives on in the background: the allocation's end (or `down`) ends the step and every Ray process.
"""

from __future__ import annotations

import os
import re
import secrets
import subprocess
import time
from pathlib import Path
from typing import Mapping, Optional, Sequence

from verl_cluster.errors import ConnectError, RunnerError
from verl_cluster.runners.base import CommandTimeout, Result
from verl_cluster.runners.local import LocalProcess

READY_LINE = "Ray runtime started"  # what `ray start` prints once its processes are up (2.52 .. 2.60)
# srun's own failures: the node could not be reached, not the command failing
_STEP_FAILED = re.compile(r"srun: error: (Unable to create step|Task launch|.*Communication connection failure|"
                          r"Invalid job id|Unable to confirm allocation|.*already completing|Invalid node name|"
                          r".*not in the allocation|Requested node configuration)", re.I)
_PUT = ('p=$1; case "$p" in "~/"*) p="$HOME/${p#\\~/}";; esac; umask 077; mkdir -p "$(dirname "$p")" && '
        't="$p.tmp-$3" && cat > "$t" && chmod "$2" "$t" && mv -f "$t" "$p" && printf "%s\\n" "$p"')


class SlurmRunner:
    def __init__(self, node: str, job_id: str, *, srun: str = "srun", extra_args: Sequence[str] = (),
                 cpus: Optional[int] = None, log_dir: str | os.PathLike = "~/.verl-cluster/slurm"):
        self.host = node
        self.job_id = job_id
        self.srun = srun
        self.extra_args = list(extra_args)
        self.cpus = cpus
        self.log_dir = Path(os.path.expanduser(str(log_dir)))

    def srun_argv(self, argv: Sequence[str], *, held: bool = False, timeout: float | None = None) -> list[str]:
        """The srun command line for argv on this node (what --dry-run shows)."""
        full = [self.srun, f"--jobid={self.job_id}", "--overlap", "--nodes=1", "--ntasks=1",
                f"--nodelist={self.host}", "--export=ALL", "--quiet", "--kill-on-bad-exit=1",
                f"--job-name=vc-{'ray' if held else 'cmd'}"]
        if held and self.cpus:
            full.append(f"--cpus-per-task={self.cpus}")  # the node's whole share: Ray's workers run in this step
        full += self.extra_args + ["--"]
        if timeout:  # stops it on the node too, should the srun client here be killed
            full += ["timeout", "-k", "5", str(max(1, int(timeout)))]
        return full + list(argv)

    def _env(self, env: Mapping[str, str] | None) -> dict[str, str]:
        return {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}

    def _popen(self, full: list[str], env: Mapping[str, str] | None, **kw) -> subprocess.Popen:
        try:
            return subprocess.Popen(full, env=self._env(env), start_new_session=True, **kw)
        except FileNotFoundError:
            raise RunnerError(self.host, f"`{self.srun}` not found",
                              "run inside the allocation on a node with Slurm's commands (or set slurm.srun)")

    def _failed_step(self, res: Result) -> None:
        if res.rc != 0 and _STEP_FAILED.search(res.stderr):
            line = next(ln for ln in res.stderr.splitlines() if _STEP_FAILED.search(ln))
            raise ConnectError(self.host, f"srun could not reach the node: {line.strip()[:300]}",
                               f"is {self.host} still in allocation {self.job_id}? `scontrol show node {self.host}`")

    def run(self, argv: Sequence[str], *, env: Mapping[str, str] | None = None,
            timeout: float = 60.0, stdin: str | None = None) -> Result:
        p = self._popen(self.srun_argv(argv, timeout=timeout), env, text=True, stdout=subprocess.PIPE,
                        stderr=subprocess.PIPE, stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL)
        try:
            out, err = p.communicate(stdin, timeout=timeout + 15)  # the step's own `timeout` fires first
        except subprocess.TimeoutExpired:
            LocalProcess(p).terminate()  # SIGTERM: srun passes it to the step, then ends
            raise CommandTimeout(self.host, f"`{argv[0]}` did not finish within {timeout:.0f}s")
        res = Result(p.returncode, out, err)
        self._failed_step(res)
        if res.rc == 124 and timeout:
            raise CommandTimeout(self.host, f"`{argv[0]}` did not finish within {timeout:.0f}s")
        return res

    def popen(self, argv: Sequence[str], *, env: Mapping[str, str] | None = None) -> LocalProcess:
        p = self._popen(self.srun_argv(argv), env, text=True, bufsize=1, stdout=subprocess.PIPE,
                        stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        return LocalProcess(p)

    def run_held(self, argv: Sequence[str], *, env: Mapping[str, str] | None = None,
                 timeout: float = 90.0, ready: str = READY_LINE) -> Result:
        """Start argv (`ray start ... --block`) as a step that stays; return once it printed `ready`.
        Its output goes to a log file here; the srun client is detached so it outlives this process."""
        self.log_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        log = self.log_dir / f"{self.job_id}-{self.host}.log"
        with open(log, "wb") as f:
            p = self._popen(self.srun_argv(argv, held=True), env, stdin=subprocess.DEVNULL, stdout=f,
                            stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while True:
            text = log.read_text(errors="replace")
            if ready in text:
                return Result(0, text, "")
            rc = p.poll()
            if rc is not None:
                res = Result(rc or 1, text, text)
                self._failed_step(res)
                return res
            if time.monotonic() > deadline:
                LocalProcess(p).terminate()
                raise CommandTimeout(self.host, f"`{argv[0]}` did not start within {timeout:.0f}s (log: {log})")
            time.sleep(0.1)

    def put_text(self, text: str, remote_path: str, mode: int = 0o600) -> str:
        """Write through the step's stdin into a private temporary file, renamed into place."""
        # a random suffix: nodes sharing a home (usual on Slurm) may write one path at once, with equal PIDs
        res = self.run(["sh", "-c", _PUT, "sh", remote_path, f"{mode:o}", secrets.token_hex(6)], stdin=text,
                       timeout=30)
        if not res.ok or not res.stdout.strip():
            raise RunnerError(self.host, f"copying to {remote_path} failed: {res.tail(3) or f'exit {res.rc}'}")
        return res.stdout.strip().splitlines()[-1]

    def put_file(self, local_path: str, remote_path: str, mode: int = 0o600) -> str:
        return self.put_text(Path(local_path).read_text(), remote_path, mode)

    def close(self) -> None:
        pass
