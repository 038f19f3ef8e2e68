"""Run commands on this machine (subprocess, argv lists, no shell)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from pathlib import Path
from typing import Iterator, Mapping, Sequence

from verl_cluster.errors import RunnerError
from verl_cluster.runners.base import CommandTimeout, Result


class LocalProcess:
    def __init__(self, proc: subprocess.Popen):
        self._proc = proc

    def lines(self) -> Iterator[str]:
        assert self._proc.stdout is not None
        for line in self._proc.stdout:
            yield line.rstrip("\n")

    def wait(self, timeout: float | None = None) -> int:
        try:
            return self._proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise CommandTimeout("localhost", f"still running after {timeout:.0f}s")

    def terminate(self) -> None:
        # the child leads its own process group, so its children go too
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(self._proc.pid, sig)
            except ProcessLookupError:
                return
            try:
                self._proc.wait(5)
                return
            except subprocess.TimeoutExpired:
                continue


class LocalRunner:
    host = "localhost"

    def __init__(self, host: str = "localhost"):
        self.host = host

    def _env(self, env: Mapping[str, str] | None) -> dict[str, str]:
        return {**os.environ, **(env or {})}

    def run(self, argv: Sequence[str], *, env: Mapping[str, str] | None = None,
            timeout: float = 60.0, stdin: str | None = None) -> Result:
        try:
            p = subprocess.Popen(list(argv), env=self._env(env), stdin=subprocess.PIPE if stdin is not None
                                 else subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 text=True, start_new_session=True)
        except FileNotFoundError:
            raise RunnerError(self.host, f"`{argv[0]}` not found", "check the executable path in the config")
        except PermissionError:
            raise RunnerError(self.host, f"`{argv[0]}` is not executable")
        try:
            stdout, stderr = p.communicate(stdin, timeout=timeout)
        except subprocess.TimeoutExpired:
            # the whole process group: a timed-out command must not leave children behind
            LocalProcess(p).terminate()
            raise CommandTimeout(self.host, f"`{argv[0]}` did not finish within {timeout:.0f}s")
        return Result(p.returncode, stdout, stderr)

    def popen(self, argv: Sequence[str], *, env: Mapping[str, str] | None = None) -> LocalProcess:
        try:
            proc = subprocess.Popen(list(argv), env=self._env(env), stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, text=True, bufsize=1,
                                    start_new_session=True)
        except FileNotFoundError:
            raise RunnerError(self.host, f"`{argv[0]}` not found", "check the executable path in the config")
        except PermissionError:
            raise RunnerError(self.host, f"`{argv[0]}` is not executable")
        return LocalProcess(proc)

    def put_file(self, local_path: str, remote_path: str, mode: int = 0o600) -> str:
        dst = Path(os.path.expanduser(remote_path))
        dst.parent.mkdir(parents=True, exist_ok=True)
        if Path(local_path).resolve() != dst.resolve():
            shutil.copyfile(local_path, dst)
        os.chmod(dst, mode)
        return str(dst)

    def put_text(self, text: str, remote_path: str, mode: int = 0o600) -> str:
        dst = Path(os.path.expanduser(remote_path))
        dst.parent.mkdir(parents=True, exist_ok=True)
        tmp = dst.with_name(f"{dst.name}.tmp-{os.getpid()}-{id(text)}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.chmod(tmp, mode)
        os.replace(tmp, dst)  # atomic: a reader never sees a half-written file
        return str(dst)

    def close(self) -> None:
        pass
