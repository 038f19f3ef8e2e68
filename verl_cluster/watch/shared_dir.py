"""Preflight for a watched run: is trainer.default_local_dir one folder every node reads? verl resumes from the
newest global_step_N it finds there; a node-local folder loses it when the driver's node changes."""

from __future__ import annotations

import secrets

from verl_cluster.config.cluster import ClusterSpec
from verl_cluster.submit.preflight import Finding
from verl_cluster.launchers import runner_for
from verl_cluster.runners import fan_out

MARK = ".verl-cluster-shared-check"


def check_shared_dir(spec: ClusterSpec, path: str) -> list[Finding]:
    nodes = [n for _, n in spec.nodes()]
    if len(nodes) < 2:
        return []
    token = secrets.token_hex(8)
    head = runner_for(spec, spec.head)
    try:
        res = head.run(["sh", "-c", 'mkdir -p "$1" && printf %s "$2" > "$1/$3"', "sh", path, token, MARK],
                       timeout=20)
    finally:
        head.close()
    if not res.ok:
        return [Finding("warning", "checkpoint", f"cannot write trainer.default_local_dir {path} on the head: "
                        f"{res.tail(2)}", "point it at a writable folder on storage every node mounts")]

    def read(node) -> str:
        r = runner_for(spec, node)
        try:
            return r.run(["cat", f"{path}/{MARK}"], timeout=20).stdout.strip()
        finally:
            r.close()

    missing = [h.host + (f" ({h.reason})" if not h.ok else "")
               for h in fan_out(nodes[1:], read, key=lambda n: n.host) if not h.ok or h.value != token]
    if not missing:
        return [Finding("ok", "checkpoint", f"trainer.default_local_dir {path} is shared by all {len(nodes)} nodes")]
    return [Finding("warning", "checkpoint",
                    f"trainer.default_local_dir {path} is local to the head: not the same folder on "
                    f"{', '.join(missing)}", "a resumed run must find the newest checkpoint after a node is replaced: "
                    "use storage every node mounts (NFS, a shared disk)")]


# On the head: the newest checkpoint's tracker and the rank files its folders hold (~ is the node's home there).
_RANKS = r'''p=$1; case $p in "~/"*) p="$HOME/${p#\~/}";; esac
cd -- "$p" 2>/dev/null || { echo "nofolder"; exit 0; }
s=$(head -c 32 latest_checkpointed_iteration.txt 2>/dev/null | tr -dc 0-9)
[ -n "$s" ] || { echo "notracker"; exit 0; }
echo "step $s"
for d in global_step_$s/*/; do ls -- "$d" 2>/dev/null | sed -n "s|^model_world_size_\([0-9]*\)_rank_\([0-9]*\)\.pt$|${d%/} \1 \2|p"; done'''


def missing_ranks(spec: ClusterSpec, path: str, gone: list[str]) -> str:
    """"" when the newest checkpoint under `path` is whole as the head sees it (or there is none); else why the run
    cannot go on without `gone`: verl's ranks each save their own files, so a folder local to each node loses the
    files of the ranks that ran on a node that is gone."""
    head = runner_for(spec, spec.head)
    try:
        res = head.run(["sh", "-c", _RANKS, "sh", path], timeout=20)
    finally:
        head.close()
    lines = res.stdout.split("\n") if res.ok else []
    if not lines or lines[0] in ("nofolder", "notracker", ""):
        return ""  # no checkpoint: the run starts again from step 1 wherever it is
    step = lines[0].split()[-1]
    held: dict[tuple[str, int], set[int]] = {}
    for line in lines[1:]:
        parts = line.rsplit(" ", 2)
        if len(parts) == 3:
            held.setdefault((parts[0].rsplit("/", 1)[-1], int(parts[1])), set()).add(int(parts[2]))
    for (role, world), ranks in sorted(held.items()):
        lost = sorted(set(range(world)) - ranks)
        if lost:
            return (f"trainer.default_local_dir {path} is not storage every node reads: global_step_{step}/{role} "
                    f"on the head ({spec.head.host}) holds rank file(s) {sorted(ranks)} of {world}; rank(s) {lost} "
                    f"were saved on {', '.join(gone)}, which is gone. Put checkpoints on storage every node mounts "
                    "(NFS, a shared disk), or bring the node back")
    return ""
