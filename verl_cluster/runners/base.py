"""The CommandRunner protocol, its Result, and a parallel fan-out that never loses a host."""

from __future__ import annotations

import concurrent.futures as cf
from dataclasses import dataclass
from typing import Callable, Generic, Iterator, Mapping, Protocol, Sequence, TypeVar

from verl_cluster.errors import RunnerError

T = TypeVar("T")


@dataclass(frozen=True)
class Result:
    rc: int
    stdout: str
    stderr: str

    @property
    def ok(self) -> bool:
        return self.rc == 0

    def tail(self, n: int = 15) -> str:
        """Last lines of stderr (or stdout), for error messages."""
        text = (self.stderr.strip() or self.stdout.strip()).splitlines()
        return "\n".join(text[-n:])


class CommandTimeout(RunnerError):
    """The command did not finish in time (it was stopped)."""


class Process(Protocol):
    """A running command whose output is read as it comes."""

    def lines(self) -> Iterator[str]: ...  # stdout and stderr merged, line by line, until it ends

    def wait(self, timeout: float | None = None) -> int: ...

    def terminate(self) -> None: ...  # stop it (and what it started)


class CommandRunner(Protocol):
    host: str

    def run(self, argv: Sequence[str], *, env: Mapping[str, str] | None = None,
            timeout: float = 60.0, stdin: str | None = None) -> Result: ...

    def popen(self, argv: Sequence[str], *, env: Mapping[str, str] | None = None) -> Process: ...

    def put_file(self, local_path: str, remote_path: str, mode: int = 0o600) -> str: ...  # absolute path

    def put_text(self, text: str, remote_path: str, mode: int = 0o600) -> str: ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class HostResult(Generic[T]):
    """One host's outcome of a fan-out: a value or the error that stopped it."""

    host: str
    value: T | None = None
    error: BaseException | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def reason(self) -> str:
        if self.error is None:
            return ""
        return getattr(self.error, "reason", None) or f"{type(self.error).__name__}: {self.error}"


def fan_out(items: Sequence[T], fn: Callable[[T], object], key: Callable[[T], str] = str,
            max_workers: int = 32) -> list[HostResult]:
    """Run fn(item) for every item in parallel; one result per item, in input order, errors captured."""
    if not items:
        return []
    with cf.ThreadPoolExecutor(max_workers=min(max_workers, len(items))) as pool:
        futures = [pool.submit(fn, item) for item in items]
        out = []
        for item, fut in zip(items, futures):
            try:
                out.append(HostResult(key(item), value=fut.result()))
            except BaseException as e:  # noqa: BLE001 - every host gets a result
                out.append(HostResult(key(item), error=e))
        return out
