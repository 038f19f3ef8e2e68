"""One way to name the cluster and its config overrides, for every command: `-c/--cluster FILE` and positional
`key=value`. A positional FILE is still accepted where commands took one before (`status my.yaml`)."""

from __future__ import annotations

import argparse
import re

from verl_cluster.errors import ConfigError

DEFAULT_CLUSTER = "cluster_configs/local.yaml"
_OVERRIDE = re.compile(r"^[A-Za-z_][\w.\-\[\]]*=")  # `ssh.user=me`; a path (`./a=b.yaml`) never matches


def is_override(word: str) -> bool:
    return bool(_OVERRIDE.match(word))


def add_cluster_args(p: argparse.ArgumentParser, positional: bool = True, default: str = DEFAULT_CLUSTER) -> None:
    if positional:
        p.add_argument("cluster_pos", nargs="?", metavar="CLUSTER.yaml", help="same as -c (the older form)")
    p.add_argument("-c", "--cluster", metavar="CLUSTER.yaml", help=f"cluster config (default {default})")
    p.add_argument("--slurm", action="store_true",
                   help="the nodes of this Slurm allocation (launcher: slurm; no cluster file needed)")
    p.add_argument("overrides", nargs="*", metavar="key=value",
                   help="cluster config overrides, e.g. ssh.connect_timeout_s=5 ray.object_store_memory=2e8")


def resolve_cluster(args: argparse.Namespace, default: str | None = DEFAULT_CLUSTER) -> str | None:
    """Sort the positional words into the cluster file and the overrides; sets args.cluster and args.overrides.
    argparse alone cannot: `up a.b=1` fills the optional FILE slot with the override."""
    words = [w for w in [getattr(args, "cluster_pos", None), *(getattr(args, "overrides", None) or [])] if w]
    files = [w for w in words if not is_override(w)]
    if args.cluster:
        files = [args.cluster] + [f for f in files if f != args.cluster]
    if len(files) > 1:
        raise ConfigError(f"two cluster files given: `{files[0]}` and `{files[1]}`",
                          "name one with -c FILE; overrides are written key=value (e.g. ssh.user=me)")
    args.overrides = [w for w in words if is_override(w)]
    if getattr(args, "slurm", False):
        from verl_cluster.launchers import allocation_cluster

        args.cluster, launcher = allocation_cluster(files[0] if files else None)
        args.overrides.append(launcher)
        return args.cluster
    args.cluster = files[0] if files else default
    return args.cluster


def load_cluster_args(args: argparse.Namespace, default: str = DEFAULT_CLUSTER):
    from verl_cluster.launchers import load_cluster

    resolve_cluster(args, default)
    return load_cluster(args.cluster, args.overrides)
