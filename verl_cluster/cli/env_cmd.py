"""`verl-cluster env [-c CLUSTER]`: the exports that point Ray's own CLI at a cluster, with its token.

    eval "$(verl-cluster env -c NAME)"
    ray status          # the head's GCS (RAY_ADDRESS), when it answers from here
    ray job list        # the Jobs API (RAY_API_SERVER_ADDRESS): direct, or through `verl-cluster dashboard`'s tunnel
    ray list nodes

Only the exports go to stdout. A tunnel the exports need is named on stderr, as the command that holds it open;
a dashboard URL is never printed without it. The token itself is never printed: RAY_AUTH_TOKEN_PATH names its file.
"""

from __future__ import annotations

import argparse
import os
import shlex
import socket
import sys
from dataclasses import dataclass, field
from typing import Optional

from rich.markup import escape

from verl_cluster.cli.cluster_args import add_cluster_args, load_cluster_args
from verl_cluster.cli.dashboard_cmd import _port
from verl_cluster.cli.output import err, print_json
from verl_cluster.errors import EXIT_OK

GCS_PROBE_S = 3.0  # a head whose GCS port does not take a connection in this long is "not reachable from here"
AUTH_VARS = ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN_PATH")


def add_parsers(sub, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("env", parents=[common], help="exports for Ray's own CLI (ray status, ray job list)",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_cluster_args(p)
    p.add_argument("--port", type=_port, default=0,
                   help="local port of the dashboard tunnel, where one is needed (default: the head's dashboard "
                        "port when it is free here, else a free one)")
    p.add_argument("--json", action="store_true", help="the exports and the tunnel command as JSON")
    p.set_defaults(func=run)


@dataclass(frozen=True)
class RayEnv:
    exports: dict[str, str]
    unset: list[str] = field(default_factory=list)
    tunnel: Optional[list[str]] = None  # the command that holds the tunnel RAY_API_SERVER_ADDRESS goes through
    gcs_direct: bool = False  # RAY_ADDRESS is the head's GCS (`ray status` works); else the Jobs API URL

    def shell(self) -> str:
        lines = [f"export {k}={shlex.quote(v)}" for k, v in self.exports.items()]
        if self.unset:
            lines.append("unset " + " ".join(self.unset))
        return "\n".join(lines) + "\n"


def ray_env(spec, word: str, gcs_answers: bool, local_port: int, token_path: Optional[str]) -> RayEnv:
    """What Ray's CLI needs for this cluster. `gcs_answers`: the head's GCS port takes a connection from here;
    `local_port`: where the tunnel listens when the dashboard is on a remote head's loopback; `token_path`: the
    cluster's token file (None: auth none)."""
    from verl_cluster.jobs.ray_jobs import dashboard_target

    host, port, needs_tunnel = dashboard_target(spec)
    api = f"http://127.0.0.1:{local_port}" if needs_tunnel else f"http://{host}:{port}"
    exports = {"RAY_ADDRESS": spec.gcs_address if gcs_answers else api, "RAY_API_SERVER_ADDRESS": api}
    if token_path:
        exports |= {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": token_path}
    tunnel = ["verl-cluster", "dashboard", "-c", word, "--port", str(local_port)] if needs_tunnel else None
    return RayEnv(exports, [] if token_path else list(AUTH_VARS), tunnel, gcs_answers)


def _free_here(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _any_free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(args) -> int:
    from verl_cluster.jobs.ray_jobs import auth_headers, reachable
    from verl_cluster.nodes.token_bind import token_for_sending

    spec = load_cluster_args(args)
    # Ray's CLI sends the token wherever RAY_ADDRESS points: only this cluster's own token, bound to this head,
    # and one that exists (a cluster never brought up has none: ClusterError, naming `up`)
    token = str(token_for_sending(spec)) if auth_headers(spec) else None
    port = args.port or (spec.head.dashboard_port if _free_here(spec.head.dashboard_port) else _any_free_port())
    word = args.chosen.name or os.path.abspath(args.cluster)  # the tunnel command works from any directory
    env = ray_env(spec, word, reachable(spec.head_ip, spec.head.gcs_port, GCS_PROBE_S), port, token)
    if args.json:
        print_json({"cluster": spec.cluster_name, "exports": env.exports, "unset": env.unset,
                    "tunnel_command": env.tunnel, "ray_status": env.gcs_direct}, indent=None)
    else:
        sys.stdout.write(env.shell())
        sys.stdout.flush()
    _explain(spec, env)
    return EXIT_OK


def _explain(spec, env: RayEnv) -> None:
    """What works with these exports, on stderr (the shell's eval reads stdout only)."""
    if env.tunnel:
        err.print(f"the Jobs API is on the head's loopback: keep this open in another terminal for `ray job ...` "
                  f"and `ray list ...` ({escape(env.exports['RAY_API_SERVER_ADDRESS'])}):\n  "
                  f"{escape(shlex.join(env.tunnel))}", soft_wrap=True)
    if env.gcs_direct:
        err.print(f"[dim]`ray status` reads the head's GCS at {escape(spec.gcs_address)} directly[/]", soft_wrap=True)
    else:
        err.print(f"[yellow]note:[/] the head's GCS ({escape(spec.gcs_address)}) does not answer from here, so "
                  "`ray status` cannot run here (RAY_ADDRESS is the Jobs API, for `ray job ...`); "
                  "`verl-cluster status` shows the nodes", soft_wrap=True)
    if "RAY_AUTH_MODE" not in env.exports:
        err.print("[yellow]warning:[/] security.auth is none: Ray's CLI is pointed at a cluster without a token")
