"""`verl-cluster dashboard [-c CLUSTER.yaml]`: the Ray dashboard of a cluster whose dashboard listens on the head's
loopback, through an SSH tunnel held until Ctrl-C. The token is never printed unless asked (--show-token)."""

from __future__ import annotations

import argparse
import contextlib
import shlex
import signal
import sys
import time

from rich.markup import escape

from verl_cluster.cli.cluster_args import add_cluster_args, load_cluster_args
from verl_cluster.cli.output import err, out, print_json
from verl_cluster.errors import EXIT_OK, EXIT_UNHEALTHY, ConfigError

# Ray 2.60 takes the token as `Authorization: Bearer` (or `X-Ray-Authorization`) or as the cookie
# `ray-authentication-token`, which its page sets after asking for the token once; there is no query form.
TOKEN_COOKIE = "ray-authentication-token"


def _port(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        v = -1
    if not 0 < v < 65536:
        raise argparse.ArgumentTypeError(f"expected a TCP port 1-65535, got {text!r}")
    return v


def add_parsers(sub, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("dashboard", parents=[common], help="open the Ray dashboard (SSH tunnel to the head)",
                       description=__doc__)
    add_cluster_args(p)
    p.add_argument("--port", type=_port, default=0, help="local port of the tunnel (default: a free one)")
    p.add_argument("--open", action="store_true", help="open it in the browser too")
    p.add_argument("--show-token", action="store_true", help="print the auth token (it runs code on the cluster)")
    p.add_argument("--json", action="store_true", help="one line of JSON on stdout, then hold the tunnel")
    p.set_defaults(func=run)


def run(args) -> int:
    from verl_cluster.jobs import ray_jobs

    spec = load_cluster_args(args)
    headers = ray_jobs.auth_headers(spec)  # ClusterError when the token file is missing
    with contextlib.ExitStack() as stack:
        try:
            link = ray_jobs.open_dashboard(spec, stack, args.port)
        except OSError as e:  # the only OSError left here: binding the local port
            raise ConfigError(f"--port {args.port}: cannot listen on 127.0.0.1:{args.port}: {e.strerror or e}",
                              "pick another port, or leave --port out for a free one")
        version, token_ok = ray_jobs.probe_dashboard(link, headers, timeout_s=spec.ssh.connect_timeout_s + 5)
        _describe(args, spec, link, version, token_ok, headers)
        if args.open:
            import webbrowser

            if not webbrowser.open(link.url):
                err.print(f"no browser found here: open {link.url} yourself")
        if link.tunnel is None:
            return EXIT_OK
        return _hold(link)


def _describe(args, spec, link, version: str, token_ok: bool, headers: dict) -> None:
    token_file = str(spec.token_file) if headers else None
    if args.json:
        doc = {"cluster": spec.cluster_name, "url": link.url, "via": link.where, "tunnel": link.tunnel is not None,
               "ray_version": version, "auth": spec.security.auth, "token_file": token_file,
               "token_accepted": token_ok if headers else None,
               "token_header": "Authorization: Bearer <token>" if headers else None}
        if args.show_token and headers:
            doc["token"] = headers["Authorization"].split(" ", 1)[1]
        print_json(doc, indent=None)  # one line: a script reads it while the tunnel is held
        return
    out.print(f"dashboard: {link.url}  Ray {version}, via {escape(link.where)}")
    if not headers:
        out.print("auth: none (security.auth: none) — anyone who reaches the port can run code on the cluster")
        return
    quoted = escape(shlex.quote(token_file))  # pasted into a shell: a crafted path must stay one word
    out.print(f"token: in {escape(token_file)} (`cat {quoted}`); the page asks for it once and keeps "
              f"it in the cookie {TOKEN_COOKIE}")
    out.print(f"API: curl -H \"Authorization: Bearer $(cat {quoted})\" {link.url}/api/jobs/")
    if args.show_token:
        out.print(f"token value: {escape(headers['Authorization'].split(' ', 1)[1])}")
    if not token_ok:
        err.print(f"[yellow]warning:[/] the dashboard refused the token in {escape(token_file)}: it does not match "
                  "the running cluster (run `verl-cluster up` again)")


def _hold(link) -> int:
    """Keep the tunnel until Ctrl-C (or SIGTERM): exit 0. A lost SSH connection is exit 1."""
    def stop(*_):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)
    err.print("tunnel open; Ctrl-C closes it")
    try:
        while link.tunnel.alive:
            time.sleep(0.3)
    except KeyboardInterrupt:
        err.print("tunnel closed")
        return EXIT_OK
    err.print(f"[bold red]error:[/] the SSH connection under the tunnel was lost ({escape(link.where)})")
    return EXIT_UNHEALTHY
