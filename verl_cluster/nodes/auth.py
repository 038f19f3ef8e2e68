"""Ray token auth: one token per cluster, generated once, 0600 here and on every node."""

from __future__ import annotations

import os
import secrets
from pathlib import Path

from verl_cluster.config.cluster import ClusterSpec
from verl_cluster.errors import ConfigError
from verl_cluster.nodes.token_bind import bind, own_token
from verl_cluster.runners.local import private_dirs


def remote_token_path(spec: ClusterSpec) -> str:
    """Where the token lives on each node (home-relative; resolved when copied)."""
    return f"~/.verl-cluster/{spec.cluster_name}/auth_token"


def node_token_path(spec: ClusterSpec, home: str) -> str:
    """The token's absolute path on a node whose home directory is `home`."""
    return remote_token_path(spec).replace("~", home, 1)


def ensure_token(spec: ClusterSpec) -> Path | None:
    """Create the cluster's token file once (0600 in a 0700 dir) and bind it to this cluster's head; None when auth
    is off."""
    if spec.security.auth == "none":
        return None
    path = spec.token_file
    own_token(spec)  # never another cluster's token: it would be bound to this head below
    if path.exists():
        if path.stat().st_mode & 0o077:
            os.chmod(path, 0o600)  # tighten, never loosen
        if not path.read_text().strip():
            raise ConfigError(f"token file {path} is empty", "delete it; `up` generates a new one")
    else:
        private_dirs(path.parent)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_hex(32) + "\n")
    bind(spec, Path(os.path.realpath(path)))  # the token goes to this head only (nodes/token_bind.py)
    return path


def open_cluster_warnings(spec: ClusterSpec) -> list[str]:
    """What `up` and `status` say, loudly, about a cluster that lets others run code on it."""
    sec, out = spec.security, []
    if sec.auth == "none":
        out.append(f"security.auth is none: Ray runs WITHOUT authentication. Anyone who can reach the GCS port "
                   f"({spec.head.gcs_port}), the Ray Client port ({spec.head.ray_client_port}) or a node's ports can "
                   "run code on every node. Use it only on a network where everyone may; set security.auth: token.")
    if sec.dashboard_host == "all":
        out.append(f"the dashboard/Jobs API listens on 0.0.0.0:{spec.head.dashboard_port}: anyone who reaches the "
                   "port can run code on this cluster (ShadowRay, CVE-2023-48022)"
                   + (", and auth is off." if sec.auth == "none" else ". Keep token auth on."))
    return out


def refuse_open_dashboard(spec: ClusterSpec) -> None:
    """dashboard_host all + auth none is a cluster anyone on the network can take over: only when acknowledged."""
    sec = spec.security
    if sec.dashboard_host == "all" and sec.auth == "none" and not sec.allow_open_dashboard:
        raise ConfigError(f"{spec.source}: security.dashboard_host all with security.auth none: anyone who reaches "
                          f"port {spec.head.dashboard_port} could run code on every node (ShadowRay)",
                          "set security.auth: token (or dashboard_host: loopback); if this network is yours alone, "
                          "say so with security.allow_open_dashboard: true")


def ray_auth_env(spec: ClusterSpec, token_path: str | os.PathLike | None = None) -> dict[str, str]:
    """Environment a Ray process (node, driver, Jobs client) needs to join this cluster.
    Default token_path: the local token file."""
    if spec.security.auth == "none":
        return {"RAY_AUTH_MODE": "disabled"}
    return {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token_path or spec.token_file)}
