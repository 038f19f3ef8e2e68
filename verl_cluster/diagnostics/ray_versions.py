"""Which Ray versions work here, and together. Pure, except `local_ray_version`.

Supported: 2.54 through 2.60 (the newest tested; CI runs the integration tests on both ends). Token auth
(`RAY_AUTH_MODE=token`) came in 2.52, but the dashboard agent of 2.52 and 2.53 runs jobs POSTed to
`dashboard_agent_listen` without the token; 2.54 is the first whose agent checks it. Every `ray start` flag, auth
variable and Jobs SDK call we use exists across that range. The nodes must all run one Ray (a worker of another
version is refused by the head). This machine's Ray may differ from the nodes': it only talks to the head's Jobs API
over HTTP, and Ray's client drops the request fields an older server does not know.
"""

from __future__ import annotations

from typing import Mapping, Optional

from verl_cluster.diagnostics.problem import ERROR, WARNING, Problem

TOKEN_AUTH = (2, 52)  # RAY_AUTH_MODE=token
OLDEST = (2, 54)  # the first whose dashboard agent checks the token
NEWEST = (2, 60)
SUPPORTED = "2.54 to 2.60"
PIN = "ray[default]>=2.54,<2.61"
OPEN_AGENT = ("its dashboard agent runs jobs sent to its HTTP port (ray.ports.dashboard_agent_listen) without the "
              "token (Ray checks it there from 2.54)")


def parse(version: Optional[str]) -> Optional[tuple[int, ...]]:
    """(major, minor, patch) of '2.52.1' (also '2.60.0rc1', '2.61.0.dev0'); None when not a version."""
    if not version:
        return None
    parts = []
    for p in version.split("+")[0].split(".")[:3]:
        digits = ""
        for ch in p:
            if not ch.isdigit():
                break
            digits += ch
        if not digits:
            break
        parts.append(int(digits))
    return tuple(parts) if len(parts) >= 2 else None


def supported(version: Optional[str]) -> Optional[bool]:
    """Whether this Ray version is within the supported range; None when unknown."""
    v = parse(version)
    return None if v is None else OLDEST <= v[:2] <= NEWEST


def has_token_auth(version: Optional[str]) -> bool:
    v = parse(version)
    return v is None or v[:2] >= TOKEN_AUTH  # unknown: let `ray start` speak for itself


def agent_checks_token(version: Optional[str]) -> bool:
    v = parse(version)
    return v is None or v[:2] >= OLDEST


def local_ray_version() -> Optional[str]:
    """The Ray installed beside this CLI (its Jobs SDK is what talks to the cluster)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("ray")
    except PackageNotFoundError:
        return None


def install_hint(version: str) -> str:
    return f"pip install 'ray[default]=={version}'"


def _target(versions: Mapping[str, Optional[str]]) -> str:
    """The version to suggest for every node: the newest supported one already there, else the newest tested."""
    ok = [v for v in versions.values() if supported(v)]
    return max(ok, key=lambda v: parse(v) or ()) if ok else f"{NEWEST[0]}.{NEWEST[1]}.0"


def drift(versions: Mapping[str, Optional[str]], severity: str = ERROR) -> list[Problem]:
    """One problem naming every node's Ray when they are not all the same ('missing' counts as a version)."""
    seen = {v for v in versions.values() if v}
    if len(seen) < 2:
        return []
    detail = ", ".join(f"{h}={v or 'missing'}" for h, v in versions.items())
    fix = (f"install one Ray on every node: {install_hint(_target(versions))} in each node's environment "
           f"(the one beside ray.ray_executable); verl-cluster supports Ray {SUPPORTED}")
    return [Problem("cluster", f"ray differs between nodes: {detail}", fix, severity)]


def range_verdicts(versions: Mapping[str, Optional[str]], token_auth: bool) -> list[Problem]:
    """Nodes whose Ray is outside the supported range."""
    out = []
    for host, v in versions.items():
        p = parse(v)
        if p is None:
            continue
        if p[:2] < OLDEST:
            if token_auth and p[:2] < TOKEN_AUTH:
                out.append(Problem(host, f"Ray {v} has no token auth (it came in Ray 2.52): `up` will not start it",
                                   f"pip install '{PIN}' there (or set security.auth: none, which leaves the "
                                   "cluster open to anyone who reaches its ports)"))
            elif token_auth:
                out.append(Problem(host, f"Ray {v} is older than verl-cluster supports ({SUPPORTED}): {OPEN_AGENT}; "
                                         "`up` will not start it", f"pip install '{PIN}' there"))
            else:
                out.append(Problem(host, f"Ray {v} is older than verl-cluster supports ({SUPPORTED})",
                                   f"pip install '{PIN}' there", WARNING))
        elif p[:2] > NEWEST:
            out.append(Problem(host, f"Ray {v} is newer than verl-cluster was tested with ({SUPPORTED})",
                               f"it may work; to be safe: {install_hint(_target({}))} on every node", WARNING))
    return out


def client_verdicts(cluster_version: Optional[str], client_version: Optional[str]) -> list[Problem]:
    """This machine's Ray against the cluster's: the Jobs API (submit, jobs, logs, dashboard) crosses that line."""
    if not cluster_version or not client_version or parse(cluster_version) == parse(client_version):
        return []
    what = f"this machine's Ray {client_version} differs from the cluster's {cluster_version}"
    if supported(cluster_version) and supported(client_version):
        return [Problem("this machine", what + ": supported (submit, jobs, logs and dashboard use the Jobs HTTP API, "
                                               f"which works across Ray {SUPPORTED})",
                        f"nothing to do; to match anyway: {install_hint(cluster_version)} here", WARNING)]
    return [Problem("this machine", what + f": untested outside Ray {SUPPORTED}; submit or logs may fail",
                    f"{install_hint(cluster_version)} here" if supported(cluster_version)
                    else f"pip install '{PIN}' here and on every node", WARNING)]


def ray_verdicts(versions: Mapping[str, Optional[str]], head: str, client_version: Optional[str],
                 token_auth: bool) -> list[Problem]:
    """Each node's Ray against the supported range, and this machine's against the head's (`head`: its host).
    Drift between nodes is `drift`, which check reports beside the other packages."""
    return range_verdicts(versions, token_auth) + client_verdicts(versions.get(head), client_version)


def start_refusal(node_version: Optional[str], head_version: Optional[str], token_auth: bool) -> Optional[str]:
    """Why `up` must not start this node's Ray (with the fix), or None. `head_version` only for a worker."""
    if token_auth and not has_token_auth(node_version):
        return (f"Ray {node_version} there has no token auth (it came in Ray 2.52); fix: pip install '{PIN}' in "
                "that node's environment, or set security.auth: none (the cluster is then open to anyone who "
                "reaches its ports)")
    if token_auth and not agent_checks_token(node_version):
        return (f"Ray {node_version} there is older than verl-cluster supports ({SUPPORTED}): {OPEN_AGENT}; "
                f"fix: pip install '{PIN}' in that node's environment")
    if head_version and node_version and parse(node_version) != parse(head_version):
        return (f"Ray {node_version} there, {head_version} on the head: Ray refuses a worker of another version; "
                f"fix: {install_hint(head_version)} in that node's environment")
    return None
