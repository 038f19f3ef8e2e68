"""Run a TorchrunRequest: torchrun on every node at once over the runners, rank 0's output streamed.

If any node fails, the others get a grace period to exit on their own (so their real exit codes are seen),
then are stopped; the result has every node's exit code and last lines.
"""

from __future__ import annotations

import collections
import os
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional, TextIO

from verl_cluster.config.cluster import ClusterSpec
from verl_cluster.errors import ConfigError, RunnerError
from verl_cluster.jobs.request import TorchrunRequest
from verl_cluster.launchers import runner_for
from verl_cluster.runners import CommandRunner, fan_out

MAX_UPLOAD_BYTES = 50 * 1024 * 1024


@dataclass
class NodeRun:
    host: str
    rank: int
    rc: Optional[int] = None  # None: no exit status (lost connection or stopped by us)
    state: str = "running"  # running | exited | stopped | lost | failed-to-start
    tail: collections.deque = field(default_factory=lambda: collections.deque(maxlen=20))
    ended_at: Optional[float] = None

    @property
    def failed(self) -> bool:
        return self.state in ("lost", "failed-to-start") or (self.state == "exited" and self.rc != 0)


@dataclass(frozen=True)
class TorchrunResult:
    nodes: list[NodeRun]
    interrupted: bool = False

    @property
    def ok(self) -> bool:
        return not self.interrupted and all(n.state == "exited" and n.rc == 0 for n in self.nodes)

    def to_json(self) -> dict:
        return {"ok": self.ok, "interrupted": self.interrupted,
                "nodes": [{"host": n.host, "rank": n.rank, "state": n.state, "rc": n.rc, "last_lines": list(n.tail)}
                          for n in self.nodes]}


def upload_working_dir(runners: dict[str, CommandRunner], local_dir: str, remote_dir: str) -> None:
    """Copy the job's code folder to every node (small folders only; large data belongs on shared storage)."""
    files = [p for p in Path(local_dir).rglob("*") if p.is_file() and "__pycache__" not in p.parts]
    total = sum(p.stat().st_size for p in files)
    if total > MAX_UPLOAD_BYTES:
        raise ConfigError(f"working_dir {local_dir} holds {total / 2**20:.0f} MiB; torchrun copies at most "
                          f"{MAX_UPLOAD_BYTES // 2**20} MiB to each node", "keep data and models out of working_dir")

    def put(runner: CommandRunner) -> None:
        for p in files:
            mode = 0o700 if os.access(p, os.X_OK) else 0o600
            runner.put_file(str(p), f"{remote_dir}/{p.relative_to(local_dir).as_posix()}", mode)

    bad = [r for r in fan_out(list(runners.values()), put, key=lambda r: r.host) if not r.ok]
    if bad:
        raise RunnerError(bad[0].host, f"copying working_dir failed: {bad[0].reason}")


def run_torchrun(spec: ClusterSpec, req: TorchrunRequest, out: TextIO = sys.stdout,
                 grace_s: float = 15.0, on_line: Optional[Callable[[int, str], None]] = None) -> TorchrunResult:
    runners = {node.host: runner_for(spec, node) for _, node in spec.nodes()}
    try:
        if req.local_working_dir and req.nodes[0].workdir:
            upload_working_dir(runners, req.local_working_dir, req.nodes[0].workdir)
        return _run(runners, req, out, grace_s, on_line)
    finally:
        for r in runners.values():
            r.close()


def _run(runners: dict[str, CommandRunner], req: TorchrunRequest, out: TextIO, grace_s: float,
         on_line: Optional[Callable[[int, str], None]]) -> TorchrunResult:
    runs = [NodeRun(n.host, n.rank) for n in req.nodes]
    procs: dict[int, object] = {}
    changed = threading.Event()
    lock = threading.Lock()

    def watch(i: int) -> None:
        launch, run = req.nodes[i], runs[i]
        try:
            proc = runners[launch.host].popen(launch.argv, env=launch.env)
        except (RunnerError, OSError) as e:
            run.tail.append(str(getattr(e, "reason", e)))
            run.state, run.ended_at = "failed-to-start", time.monotonic()
            changed.set()
            return
        procs[i] = proc
        try:
            for line in proc.lines():
                run.tail.append(line)
                if on_line:
                    on_line(launch.rank, line)
                if launch.rank == 0:
                    with lock:
                        out.write(line + "\n")
                        out.flush()
        except (OSError, EOFError, RunnerError):
            pass
        try:
            rc = proc.wait(timeout=3)
            if rc == -1 and type(proc).__name__ == "SshProcess":
                raise EOFError  # paramiko's "no exit status": the connection closed under it
            run.rc = rc
            if run.state == "running":
                run.state = "exited"
        except (RunnerError, OSError, EOFError):
            if run.state == "running":
                run.state = "lost"  # output ended with no exit status: host down or connection cut
                run.tail.append("(connection lost: no exit status)")
        run.ended_at = time.monotonic()
        changed.set()

    threads = [threading.Thread(target=watch, args=(i,), daemon=True) for i in range(len(runs))]
    for t in threads:
        t.start()
    interrupted = False
    first_failure: Optional[float] = None
    try:
        while any(t.is_alive() for t in threads):
            changed.wait(0.2)
            changed.clear()
            if first_failure is None and any(r.failed for r in runs):
                first_failure = time.monotonic()
            if first_failure is not None and time.monotonic() - first_failure > grace_s:
                _stop(runs, procs, "after another node failed")
                for t in threads:
                    t.join(10)
                break
    except KeyboardInterrupt:
        interrupted = True
        _stop(runs, procs, "on Ctrl-C (interrupted)")
        for t in threads:
            t.join(10)
    return TorchrunResult(runs, interrupted)


def _stop(runs: list[NodeRun], procs: dict[int, object], why: str) -> None:
    for i, run in enumerate(runs):
        if run.state == "running" and i in procs:
            run.state = "stopped"
            run.tail.append(f"(stopped by verl-cluster {why})")
            try:
                procs[i].terminate()
            except (OSError, EOFError, RunnerError):
                pass
