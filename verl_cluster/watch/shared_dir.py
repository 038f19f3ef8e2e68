"""Preflight for a watched run: is trainer.default_local_dir one folder every node reads? verl resumes from the
newest global_step_N it finds there; a node-local folder loses it when the driver's node changes."""

from __future__ import annotations

import secrets

from verl_cluster.config.cluster import ClusterSpec
from verl_cluster.launch.preflight import Finding
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
