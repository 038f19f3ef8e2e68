"""Typed errors. The library raises these; only the CLI turns them into one line, a hint and an exit code."""

from __future__ import annotations

EXIT_OK = 0
EXIT_UNHEALTHY = 1
EXIT_BAD_INPUT = 2


class VerlClusterError(Exception):
    """Base class. `hint` is a suggested fix shown under the message."""

    exit_code = EXIT_UNHEALTHY

    def __init__(self, message: str, hint: str | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return self.message


class ConfigError(VerlClusterError):
    """Bad input: a config file, a job spec, an argument."""

    exit_code = EXIT_BAD_INPUT


class RunnerError(VerlClusterError):
    """A command could not be run on a host (SSH refused, host key unknown, timeout...)."""

    def __init__(self, host: str, message: str, hint: str | None = None):
        super().__init__(f"{host}: {message}", hint)
        self.host = host
        self.reason = message


class ConnectError(RunnerError):
    """The host could not be reached or logged into (refused, timed out, authentication, host key)."""


class KeyFileError(ConnectError):
    """The SSH private key file the config names is missing or unreadable: a setting to fix here; no host was
    dialled."""


class HostKeyError(ConnectError):
    """The SSH host key is unknown or changed; we never accept it silently."""


class ClusterError(VerlClusterError):
    """The cluster (or a job) is not healthy."""


class NoSuchJob(ClusterError):
    """A job ID the cluster does not know: the user's input, not the cluster's health (exit 2)."""

    exit_code = EXIT_BAD_INPUT


class PlanError(VerlClusterError):
    """The placement cannot fit; the message carries the numbers."""
