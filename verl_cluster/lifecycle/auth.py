"""Ray token auth: one token per cluster, generated once, 0600 here and on every node."""

from __future__ import annotations

import os
import secrets
from pathlib import Path

from verl_cluster.config.cluster import ClusterSpec
from verl_cluster.errors import ConfigError
from verl_cluster.runners.local import private_dirs


def remote_token_path(spec: ClusterSpec) -> str:
    """Where the token lives on each node (home-relative; resolved when copied)."""
    return f"~/.verl-cluster/{spec.cluster_name}/auth_token"


def node_token_path(spec: ClusterSpec, home: str) -> str:
    """The token's absolute path on a node whose home directory is `home`."""
    return remote_token_path(spec).replace("~", home, 1)


def ensure_token(spec: ClusterSpec) -> Path | None:
    """Create the cluster's token file once (0600 in a 0700 dir); None when auth is off."""
    if spec.security.auth == "none":
        return None
    path = spec.token_file
    if path.exists():
        if path.stat().st_mode & 0o077:
            os.chmod(path, 0o600)  # tighten, never loosen
        if not path.read_text().strip():
            raise ConfigError(f"token file {path} is empty", "delete it; `up` generates a new one")
        return path
    private_dirs(path.parent)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(secrets.token_hex(32) + "\n")
    return path


def ray_auth_env(spec: ClusterSpec, token_path: str | os.PathLike | None = None) -> dict[str, str]:
    """Environment a Ray process (node, driver, Jobs client) needs to join this cluster.
    Default token_path: the local token file."""
    if spec.security.auth == "none":
        return {"RAY_AUTH_MODE": "disabled"}
    return {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token_path or spec.token_file)}
