"""Run commands on this machine (subprocess, argv lists, no shell)."""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
from pathlib import Path
from typing import Iterator, Mapping, Sequence

from verl_cluster.errors import RunnerError
from verl_cluster.runners.base import CommandTimeout, Result


def private_dirs(folder: Path) -> None:
    """Create the missing folders of `folder`, each 0700 (mkdir(parents=True) makes the parents 0755)."""
    missing = []
    for p in [folder, *folder.parents]:
        if p.exists():
            break
        missing.append(p)
    for p in reversed(missing):
        try:
            p.mkdir(mode=0o700)
        except FileExistsError:  # made meanwhile by another writer: theirs, left as it is
            continue
        os.chmod(p, 0o700)  # mkdir's mode goes through the umask


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
        if dst.exists() and Path(local_path).resolve() == dst.resolve():
            os.chmod(dst, mode)
            return str(dst)
        with open(local_path, "rb") as src:
            return self._put(src.read(), dst, mode)

    def put_text(self, text: str, remote_path: str, mode: int = 0o600) -> str:
        return self._put(text.encode(), Path(os.path.expanduser(remote_path)), mode)

    @staticmethod
    def _put(data: bytes, dst: Path, mode: int) -> str:
        """Missing folders 0700, the file at `mode` from its first byte, renamed into place (a reader never sees
        a half-written file, and a token is never readable by others, even for a moment)."""
        private_dirs(dst.parent)
        tmp = dst.with_name(f"{dst.name}.tmp-{os.getpid()}-{secrets.token_hex(4)}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode & 0o700)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.chmod(tmp, mode)
            os.replace(tmp, dst)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        return str(dst)

    def close(self) -> None:
        pass
