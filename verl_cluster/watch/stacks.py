"""Stack dumps of a hung job: py-spy on every node of the run, through the node-side script (no agent of ours)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

from verl_cluster.config.cluster import ClusterSpec
from verl_cluster.lifecycle.nodes import fan_out


def collect(spec: ClusterSpec, sid: str, ray_job_id: str, out: Path) -> tuple[Optional[Path], str, list[str]]:
    """(file written or None, one-line summary, the driver's stack's first lines)."""
    def args(node) -> tuple[str, ...]:
        pyspy = os.path.join(os.path.dirname(node.spec.ray_executable(node.node)), "py-spy")
        return node.spec.temp_dir, sid, ray_job_id, pyspy

    found = fan_out(spec, "stacks", args, timeout=120)
    text, dumped, why, first = [], 0, [], []
    for r in found:
        if "error" in r:
            why.append(f"{r['ip']}: {r['error']}")
            continue
        if r["processes"] and not r["pyspy"]:
            why.append(f"{r['ip']}: py-spy is not installed (pip install py-spy)")
        for d in r["dumps"]:
            head = f"== {r['ip']} pid {d['pid']} ({d['role']}) {d['cmd']}"
            if d["stack"]:
                dumped += 1
                text += [head, d["stack"].rstrip(), ""]
                if d["role"] == "driver" and not first:
                    first = d["stack"].strip().splitlines()[:12]
            else:
                why.append(f"{r['ip']} pid {d['pid']}: {d['error'] or 'py-spy printed nothing'}")
    if not text:
        return None, "; ".join(why) or "no process of this job found on any node", []
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(text) + "\n")
    note = f"; {len(why)} not dumped: {'; '.join(why)[:300]}" if why else ""
    return out, f"{dumped} process stack(s) in {out}{note}", first
