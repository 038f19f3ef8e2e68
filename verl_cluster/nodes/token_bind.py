"""Which token a cluster file may use, and where it may be sent: each token belongs to the cluster that made it.

A job record names a cluster file; that file's `security.token_file` names the token. A file anyone planted could
name another cluster's token and a head of its own, and the token would go there (over plain HTTP with
`dashboard_host: private/all`). So, before the token is read to be sent:
- a token under ~/.verl-cluster/ must be in the folder of the cluster the file names (~/.verl-cluster/<name>/):
  another cluster's folder is refused, even when the file sets `security.token_file` explicitly; a token outside
  ~/.verl-cluster/ is one the cluster file names explicitly (the default never points there);
- `up` writes beside the token the head it was started for (`<token>.head.json`: cluster name, head host, dashboard
  host and port). The token goes only to that head. A token in its cluster's folder without that file (made by a
  version before it) is refused until `up` runs once; a token elsewhere without it (made by hand) is used as named.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Optional

from verl_cluster.config.cluster import ClusterSpec
from verl_cluster.errors import ClusterError, ConfigError

STATE_ROOT = "~/.verl-cluster"
MAX_BINDING_BYTES = 4096


def binding_path(token: Path) -> Path:
    return token.with_name(token.name + ".head.json")


def head_of(spec: ClusterSpec) -> dict:
    """Where the token goes for this cluster file: the head, and how its dashboard is reached."""
    return {"cluster": spec.cluster_name, "head": spec.head.host, "dashboard_host": spec.security.dashboard_host,
            "dashboard_port": spec.head.dashboard_port}


def _describe(h: dict) -> str:
    return f"cluster `{h.get('cluster')}` at {h.get('head')}:{h.get('dashboard_port')} (dashboard {h.get('dashboard_host')})"


def bind(spec: ClusterSpec, token: Path) -> None:
    """`up`: the token now belongs to this cluster's head (written 0600, replaced whole)."""
    path = binding_path(token)
    tmp = path.with_name(path.name + f".{os.getpid()}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(json.dumps(head_of(spec)) + "\n")
        os.replace(tmp, path)
    except OSError as e:
        raise ConfigError(f"cannot write {path}: {e.strerror or e}",
                          f"the folder of security.token_file ({token.parent}) must be writable by you")


def read_binding(token: Path) -> Optional[dict]:
    """The head the token was made for; None when there is no such file. A binding that is not a small regular
    file holding a JSON object is an error (something else put it there)."""
    path = binding_path(token)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        return None
    except OSError as e:
        raise ClusterError(f"cannot read {path}: {e.strerror or e}", "remove it and run `verl-cluster up` again")
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            raise ClusterError(f"{path} is not a regular file", "remove it and run `verl-cluster up` again")
        raw = f.read(MAX_BINDING_BYTES + 1)
    try:
        doc = json.loads(raw) if len(raw) <= MAX_BINDING_BYTES else None
    except ValueError:
        doc = None
    if not isinstance(doc, dict):
        raise ClusterError(f"{path} does not say which head the token belongs to", "remove it and run "
                                                                                   "`verl-cluster up` again")
    return doc


def _inside(path: Path, folder: Path) -> bool:
    return path == folder or folder in path.parents


def own_token(spec: ClusterSpec) -> Path:
    """The token file of this cluster file, its symlinks resolved; ConfigError when it lies in another cluster's
    folder under ~/.verl-cluster/ (`up` would hand that cluster's token to this head too)."""
    token = spec.token_file
    real = Path(os.path.realpath(token))
    root = Path(os.path.realpath(os.path.expanduser(STATE_ROOT)))
    if _inside(real, root) and not _inside(real, root / spec.cluster_name):
        other = real.relative_to(root).parts[0] if real != root else "."
        raise ConfigError(f"{spec.source}: security.token_file {token} is in {root / other}/, another cluster's "
                          f"folder, not this cluster's (`{spec.cluster_name}`)",
                          f"a cluster uses its own token: remove security.token_file (the default is "
                          f"{STATE_ROOT}/{spec.cluster_name}/auth_token); if a job record led here, delete that "
                          "record from ~/.verl-cluster/jobs/")
    return real


def token_for_sending(spec: ClusterSpec) -> Path:
    """The token file to read and send to this cluster file's head, checked as the module's docstring says;
    ConfigError/ClusterError when it must not go there."""
    token, real = spec.token_file, own_token(spec)
    root = Path(os.path.realpath(os.path.expanduser(STATE_ROOT)))
    own = root / spec.cluster_name
    bound = read_binding(real)
    if bound is None:
        if not real.exists():
            return token  # never brought up: the caller says so ("no auth token ...: start it with up")
        if _inside(real, own):
            raise ClusterError(f"the token {token} does not say which head it belongs to (made by an older "
                               "verl-cluster): it is not sent anywhere until it does",
                               f"run `verl-cluster up -c {spec.source}` once: it records the head the token is for")
        return token  # a token made by hand outside ~/.verl-cluster: the cluster file names it explicitly
    want = head_of(spec)
    if {k: bound.get(k) for k in want} != want:
        raise ClusterError(f"the token {token} belongs to {_describe(bound)}; {spec.source} names "
                           f"{_describe(want)}: refusing to send it there",
                           f"if the head moved and this file is yours, `verl-cluster up -c {spec.source}` records "
                           "the new one; if a job record led here, delete that record from ~/.verl-cluster/jobs/")
    return token
