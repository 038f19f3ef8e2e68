#!/usr/bin/env python3
"""Check the product's ctypes NVML reader against nvidia-smi on a GPU machine (device run; no Ray, no verl).

    python3 scripts/gpu/gpu_nvml_check.py [--out FILE]

Puts a process on GPU 0 (torch, ~2 GiB) when torch can, then compares what the shipped node script reports —
GPUs and memory (`gpus()`), compute processes and their MiB (`gpu_procs()`, what `jobprocs` and watch's clean
slate use), `gpuhealth` run as shipped (`python -I -c SOURCE`, only what was shipped) — with nvidia-smi's view
at the same moment. Prints one JSON document; exit 1 when they disagree.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

# the node script exactly as shipped (the NVML reader's source, then the script's), run here in a namespace of
# its own: no package import, so a bare GPU machine with only the checkout can run it
ROOT = Path(__file__).resolve().parents[2] / "verl_cluster"
SCRIPT = "".join((ROOT / f).read_text() + "\n" for f in ("facts/nvml_node.py", "nodes/node_script.py"))
node = {"__name__": "vc_node_script"}
exec(compile(SCRIPT, "node_script", "exec"), node)

HOLD = "import torch, time; x = torch.empty(2 * 2**30, dtype=torch.uint8, device='cuda'); print('ready', flush=True); time.sleep(120)"


def smi(query: str, what: str) -> list[list[str]]:
    out = subprocess.run(["nvidia-smi", f"--query-{what}={query}", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True, timeout=30).stdout
    return [[c.strip() for c in line.split(",")] for line in out.strip().splitlines() if line.strip()]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out")
    args = ap.parse_args()
    holder = subprocess.Popen([sys.executable, "-c", HOLD], stdout=subprocess.PIPE, text=True)
    ready = holder.stdout.readline().strip() == "ready"
    time.sleep(1.0)
    doc: dict = {"holder_pid": holder.pid, "holder_ready": ready}
    ours, why = node["gpus"]()
    theirs = smi("index,name,memory.total,memory.used", "gpu")
    doc["gpus"] = {"reader": ours, "reader_error": why, "nvidia_smi": theirs}
    procs = node["gpu_procs"]()
    smi_procs = {int(p): int(m) for p, m in smi("pid,used_memory", "compute-apps")}
    doc["procs"] = {"reader": {str(k): v for k, v in procs.items()}, "nvidia_smi": smi_procs}
    r = subprocess.run([sys.executable, "-I", "-c", SCRIPT, "gpuhealth", "0", str(len(theirs))],
                       capture_output=True, text=True, timeout=60)
    doc["gpuhealth"] = json.loads(r.stdout.strip().splitlines()[-1].split(node["MARK"], 1)[1]) \
        if node["MARK"] in r.stdout else {"error": r.stderr[-1000:]}
    holder.kill()
    problems = []
    if len(ours) != len(theirs):
        problems.append(f"{len(ours)} GPUs read, nvidia-smi lists {len(theirs)}")
    for g, row in zip(ours, theirs):
        if g["name"] != row[1] or abs(g["memory_total_mib"] - int(row[2])) > 1:
            problems.append(f"GPU {g['index']}: {g['name']} {g['memory_total_mib']} MiB vs {row[1]} {row[2]} MiB")
    if set(procs) != set(smi_procs):
        problems.append(f"processes {sorted(procs)} vs nvidia-smi {sorted(smi_procs)}")
    problems += [f"pid {p}: {procs[p][1]} MiB vs {m} MiB" for p, m in smi_procs.items()
                 if p in procs and abs(procs[p][1] - m) > 2]
    if ready and holder.pid not in procs:
        problems.append(f"the holder (pid {holder.pid}, 2 GiB) is not among the processes read")
    if not doc["gpuhealth"].get("nvml") or doc["gpuhealth"].get("faults"):
        problems.append(f"gpuhealth: {doc['gpuhealth']}")
    doc["problems"] = problems
    text = json.dumps(doc, indent=1, default=str)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
