#!/usr/bin/env python3
"""Sample NVML GPU memory per device and per process while a job runs (GPU machine runs, docs/BENCHMARKS.md).

    python3 scripts/gpu_mem_sampler.py OUT.jsonl [--interval 0.2] [--stop-file PATH] [--log PATH --log-out PATH]

One JSON line per change: {"t": unix time, "gpus": [used MiB per GPU], "procs": [[gpu, pid, MiB, title], ...]}.
The process title tells roles apart (Ray sets `ray::WorkerDict...`, vLLM `VLLM::Worker...`). Stops on SIGTERM/
SIGINT or when --stop-file appears; the last line is {"summary": ...} with the peak per GPU and per process.
--log: a file another process writes (the job's log); its new lines go to --log-out, each prefixed with the
time this sampler saw it, so memory can be lined up with what the job was doing.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time


def title(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = f.read().split(b"\0")
        return b" ".join(a for a in argv if a).decode(errors="replace")[:120]
    except OSError:
        return "?"


def sample(nvml, handles) -> tuple[list[int], list[list]]:
    used, procs = [], []
    for i, h in enumerate(handles):
        used.append(int(nvml.nvmlDeviceGetMemoryInfo(h).used // 2**20))
        for p in nvml.nvmlDeviceGetComputeRunningProcesses(h):
            mib = int((p.usedGpuMemory or 0) // 2**20)
            procs.append([i, int(p.pid), mib, title(int(p.pid))])
    return used, sorted(procs)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--interval", type=float, default=0.2)
    ap.add_argument("--stop-file")
    ap.add_argument("--log")
    ap.add_argument("--log-out")
    args = ap.parse_args(argv)
    import pynvml as nvml  # nvidia-ml-py

    nvml.nvmlInit()
    handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(nvml.nvmlDeviceGetCount())]
    stop = {"now": False}
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.update(now=True))
    peak_gpu = [0] * len(handles)
    peak_proc: dict[str, dict] = {}
    last = None
    tail = {"pos": 0, "part": ""}

    def copy_log(out) -> None:
        if not (args.log and os.path.exists(args.log)):
            return
        with open(args.log, errors="replace") as src:
            src.seek(tail["pos"])
            text = tail["part"] + src.read()
            tail["pos"] = src.tell()
        lines = text.split("\n")
        tail["part"] = lines.pop()
        now = time.time()
        for line in lines:
            out.write(f"{now:.2f} {line}\n")
        out.flush()

    logf = open(args.log_out, "w") if args.log_out else None
    with open(args.out, "w") as f:
        while not stop["now"] and not (args.stop_file and os.path.exists(args.stop_file)):
            if logf:
                copy_log(logf)
            used, procs = sample(nvml, handles)
            peak_gpu = [max(a, b) for a, b in zip(peak_gpu, used)]
            for gpu, pid, mib, name in procs:
                key = f"{gpu}:{pid}"
                if mib >= peak_proc.get(key, {}).get("mib", -1):
                    peak_proc[key] = {"gpu": gpu, "pid": pid, "mib": mib, "title": name, "t": round(time.time(), 2)}
            if (used, procs) != last:
                f.write(json.dumps({"t": round(time.time(), 3), "gpus": used, "procs": procs}) + "\n")
                f.flush()
                last = (used, procs)
            time.sleep(args.interval)
        f.write(json.dumps({"summary": {"peak_gpu_mib": peak_gpu, "peak_proc": list(peak_proc.values())}}) + "\n")
    if logf:
        copy_log(logf)
        logf.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
