"""One way to name the cluster and its config overrides, for every command: `-c/--cluster X` and positional
`key=value`. A positional FILE is still accepted where commands took one before (`status my.yaml`).

Which cluster, first that applies (as SkyPilot names clusters):
1. `-c X`: X is a cluster file when that path exists, else the name of a cluster recorded on this machine (`up`
   records each cluster it brought up under ~/.verl-cluster/clusters/, with its file and overrides);
2. $VERL_CLUSTER, read the same way;
3. the one cluster recorded as up (several: an error that lists them);
4. none recorded: the one-node default shipped inside the package (cluster_configs/local.yaml), from any directory.
A name leads to its record's cluster file (an absolute path) and the overrides its `up` was given; the token is
found from that file as from any `-c FILE` (docs/security.md, "From a job record to a cluster file and its token").
"""

from __future__ import annotations

import argparse
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from verl_cluster.errors import ConfigError

ENV_VAR = "VERL_CLUSTER"
_OVERRIDE = re.compile(r"^[A-Za-z_][\w.\-\[\]]*=")  # `ssh.user=me`; a path (`./a=b.yaml`) never matches


def packaged_default() -> str:
    """The one-node cluster file shipped in the package: found from any working directory."""
    return str(Path(__file__).resolve().parent.parent / "cluster_configs" / "local.yaml")


DEFAULT_HELP = "a recorded cluster name or a file; default $VERL_CLUSTER, else the one cluster up here, " \
               "else this machine as a one-node cluster"


@dataclass(frozen=True)
class Chosen:
    """The cluster a command uses, and why."""

    file: str
    overrides: tuple[str, ...] = ()  # what the recorded cluster's `up` was given (a name only)
    name: str = ""  # the recorded name it was named by ("" for a file)
    how: str = ""  # "" (-c), "$VERL_CLUSTER", "the one cluster up here", "the default"


def is_override(word: str) -> bool:
    return bool(_OVERRIDE.match(word))


def add_cluster_args(p: argparse.ArgumentParser, positional: bool = True, default: str = DEFAULT_HELP) -> None:
    if positional:
        p.add_argument("cluster_pos", nargs="?", metavar="CLUSTER", help="same as -c (the older form)")
    p.add_argument("-c", "--cluster", metavar="CLUSTER", help=f"cluster file or name ({default})")
    p.add_argument("--slurm", action="store_true",
                   help="the nodes of this Slurm allocation (launcher: slurm; no cluster file needed)")
    p.add_argument("overrides", nargs="*", metavar="key=value",
                   help="cluster config overrides, e.g. ssh.connect_timeout_s=5 ray.object_store_memory=2e8")


def _names(clusters) -> str:
    return ", ".join(sorted(k.name for k in clusters)) or "none"


def by_word(word: str, how: str = "") -> Chosen:
    """A cluster file when the path exists, else a cluster name recorded here; anything else is an error that
    lists the recorded names."""
    from verl_cluster.records import job_records

    path = os.path.expanduser(word)
    if os.path.exists(path):
        return Chosen(path, how=how)
    known = job_records.known_clusters()
    found = next((k for k in known if k.name == word), None)
    where = f"{how}={word}" if how else f"`{word}`"
    if found is None:
        raise ConfigError(f"{where}: no such file, and no cluster of that name is recorded on this machine "
                          f"(recorded: {_names(known)})",
                          "name a cluster file or a recorded name; `verl-cluster up -c FILE` records a cluster")
    if not os.path.exists(found.cluster_file):
        raise ConfigError(f"{where}: cluster `{word}` is recorded with {found.cluster_file}, which no longer exists",
                          f"put the file back, or drop the record: verl-cluster forget {word}")
    return Chosen(found.cluster_file, tuple(found.overrides), word, how)


def default_cluster() -> Chosen:
    """No cluster named: $VERL_CLUSTER, else the one cluster recorded as up, else the packaged one-node default."""
    from verl_cluster.records import job_records

    env = os.environ.get(ENV_VAR, "").strip()
    if env:
        return by_word(env, "$" + ENV_VAR)
    up = [k for k in job_records.recorded_clusters() if not k.down]
    if len(up) > 1:
        raise ConfigError(f"no cluster named, and {len(up)} are recorded as up here: {_names(up)}",
                          f"name one: -c NAME (or export {ENV_VAR}=NAME)")
    if up:
        return by_word(up[0].name, "the one cluster up here")
    return Chosen(packaged_default(), how="the default: this machine")


def choose(word: Optional[str]) -> Chosen:
    return by_word(word) if word else default_cluster()


def cluster_for_job(job, word: Optional[str]) -> Chosen:
    """`submit`: -c, else the job file's `cluster:` (a file relative to the job file, else a recorded name), else
    as every command chooses."""
    if word:
        return by_word(word)
    from verl_cluster.config.job import job_cluster_path

    path = job_cluster_path(job)
    if path is None:
        return default_cluster()
    if path.exists():
        return Chosen(str(path), how="the job's cluster:")
    from verl_cluster.records import job_records

    if any(k.name == job.cluster for k in job_records.known_clusters()):
        return by_word(job.cluster, "the job's cluster")
    return Chosen(str(path), how="the job's cluster:")  # not found: said by the caller, naming the job's field


def _merge(recorded: tuple[str, ...], given: list[str]) -> list[str]:
    """The recorded overrides, then the given ones; a key given again replaces its recorded value."""
    keys = {w.split("=", 1)[0] for w in given}
    return [w for w in recorded if w.split("=", 1)[0] not in keys] + list(given)


def resolve_cluster(args: argparse.Namespace, fallback: bool = True, use_env: bool = True) -> Optional[str]:
    """Sort the positional words into the cluster and the overrides; sets args.cluster (a file), args.overrides
    and args.chosen. argparse alone cannot: `up a.b=1` fills the optional CLUSTER slot with the override.
    Nothing named: $VERL_CLUSTER (`use_env`), else (`fallback`) the default; else args.cluster is None."""
    words = [w for w in [getattr(args, "cluster_pos", None), *(getattr(args, "overrides", None) or [])] if w]
    files = [w for w in words if not is_override(w)]
    if getattr(args, "cluster", None):
        files = [args.cluster] + [f for f in files if f != args.cluster]
    if len(files) > 1:
        raise ConfigError(f"two clusters given: `{files[0]}` and `{files[1]}`",
                          "name one with -c FILE or -c NAME; overrides are written key=value (e.g. ssh.user=me)")
    args.overrides = [w for w in words if is_override(w)]
    if hasattr(args, "cluster_pos"):
        args.cluster_pos = None  # sorted once: a second call must not count its override again
    if getattr(args, "slurm", False):
        from verl_cluster.launchers import allocation_cluster

        args.cluster, launcher = allocation_cluster(files[0] if files else None)
        args.overrides.append(launcher)
        args.chosen = Chosen(args.cluster, how="this Slurm allocation")
        return args.cluster
    if files:
        chosen = by_word(files[0])
    elif use_env and os.environ.get(ENV_VAR, "").strip():
        chosen = default_cluster()
    elif fallback:
        chosen = default_cluster()
    else:
        args.cluster, args.chosen = None, None
        return None
    args.chosen = chosen
    args.cluster = chosen.file
    args.overrides = _merge(chosen.overrides, args.overrides)
    return args.cluster


def say_cluster(name: str, chosen: Optional[Chosen]) -> None:
    """The one line on stderr that says which cluster a command used (never on stdout: --json stays clean)."""
    from rich.markup import escape

    from verl_cluster.cli.output import err

    if chosen is None:
        return
    why = f"; {chosen.how}" if chosen.how else ""
    err.print(f"[dim]cluster: {escape(name)} ({escape(os.path.abspath(chosen.file))}{escape(why)})[/]",
              soft_wrap=True)


def load_cluster_args(args: argparse.Namespace):
    """The cluster this command uses, loaded with its overrides, and said on stderr."""
    from verl_cluster.launchers import load_cluster

    resolve_cluster(args)
    spec = load_cluster(args.cluster, args.overrides)
    say_cluster(spec.cluster_name, args.chosen)
    return spec


def cluster_word(args: argparse.Namespace, spec) -> str:
    """How a printed next command names this cluster: by name when that is how it was named (or it is the one
    recorded under that name), else by its file."""
    chosen = getattr(args, "chosen", None)
    return chosen.name if chosen and chosen.name else args.cluster
