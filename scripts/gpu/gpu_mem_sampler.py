#!/usr/bin/env python3
"""Sample NVML GPU memory per device and per process, and the node's RAM per process role, while a job runs
(GPU machine runs, docs/BENCHMARKS.md).

    python3 scripts/gpu/gpu_mem_sampler.py OUT.jsonl [--interval 0.2] [--host-interval 1] [--stop-file PATH]
                                       [--log PATH --log-out PATH] [--no-gpu]

GPU, one JSON line per change: {"t": unix time, "gpus": [used MiB per GPU], "procs": [[gpu, pid, MiB, title], ...]}.
The process title tells roles apart (Ray sets `ray::WorkerDict...`, vLLM `VLLM::Worker...`).
Host, one line every --host-interval seconds: {"t": ..., "host": {...}}, MiB: the node's used RAM as verl logs it
(`perf/cpu_memory_used_gb` is psutil.virtual_memory().used, whose Linux definition changed in psutil 7.1.0: both are
recorded, `used` follows the psutil installed here), MemAvailable, Shmem, /dev/shm in use, and per role the
processes' summed RSS (anon and shmem parts from /proc/PID/status) and PSS (/proc/PID/smaps_rollup, RSS where
unreadable; read on every k-th host sample only, k such that those scans take at most a quarter of the time: null
in the others). Roles: ROLES below.
Stops on SIGTERM/SIGINT or when --stop-file appears; the last line is {"summary": ...}: the peak per GPU and per
GPU process, the node's peaks (used, /dev/shm) and lowest MemAvailable, each role's peak, the largest processes.
--log: a file another process writes (the job's log); its new lines go to --log-out, each prefixed with the
time this sampler saw it, so memory can be lined up with what the job was doing.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import sys
import time

MIB = 2**20
# (role, title fragments): the first role one of whose fragments is in a process's title; a process with no match
# takes the role of its nearest ancestor that has one (DataLoader workers, compile workers, resource trackers)
ROLES = (
    ("task_runner", ("ray::TaskRunner",)),
    ("worker_dict", ("ray::WorkerDict",)),
    ("vllm_server", ("ray::vLLMHttpServer", "ray::vLLMServer", "ray::AsyncvLLMServer")),
    ("vllm_engine", ("VLLM::EngineCore",)),
    ("vllm_worker", ("VLLM::Worker",)),
    ("agent_loop", ("ray::AgentLoopWorker",)),
    ("ray_idle", ("ray::IDLE", "default_worker.py")),
    ("ray_system", ("/gcs_server", "/raylet", "ray/dashboard/", "log_monitor.py", "ray/autoscaler/", "monitor.py",
                    "runtime_env/agent", "ray::JobSupervisor", "ray::DashboardAgent", "ray::RuntimeEnvAgent",
                    "ray.util.client.server")),
    ("other_actor", ("ray::",)),
    ("client", ("-m verl_cluster", "bin/verl-cluster")),  # the product's own CLI (submit --watch, plan)
    ("driver", ("verl.trainer.main_ppo", "main_ppo.py")),
)
ROLE_NAMES = tuple(r for r, _ in ROLES) + ("other",)
NODE_KEYS = ("used", "used_available", "used_legacy", "available", "free", "shmem", "dev_shm", "anon_pages",
             "mlocked", "total")


def read_meminfo(path: str = "/proc/meminfo") -> dict[str, int]:
    """/proc/meminfo in bytes, keyed by the kernel's names."""
    out = {}
    with open(path) as f:
        for line in f:
            key, _, rest = line.partition(":")
            parts = rest.split()
            if parts:
                out[key] = int(parts[0]) * (1024 if len(parts) > 1 else 1)
    return out


def psutil_version() -> str | None:
    """The installed psutil's version (its metadata, no import: verl's psutil decides what `used` means)."""
    try:
        from importlib.metadata import version

        return version("psutil")
    except Exception:  # noqa: BLE001 - any failure means "not installed here"
        return None


def uses_available(version: str | None) -> bool:
    """psutil >= 7.1.0 reports used = total - available on Linux; older ones total - free - buffers - cached."""
    if not version:
        return True
    try:
        major, minor = (int(x) for x in version.split(".")[:2])
    except ValueError:
        return True
    return (major, minor) >= (7, 1)


def used_bytes(m: dict[str, int]) -> tuple[int, int]:
    """(psutil >= 7.1's used, psutil < 7.1's used), as psutil's Linux virtual_memory() computes them."""
    total, free = m["MemTotal"], m["MemFree"]
    avail = m.get("MemAvailable") or free + m.get("Cached", 0)  # psutil estimates it on kernels without it
    if avail > total:  # a container seeing the host's figures: psutil falls back to free
        avail = free
    avail = max(avail, 0)
    legacy = total - free - m.get("Buffers", 0) - m.get("Cached", 0) - m.get("SReclaimable", 0)
    if legacy < 0:
        legacy = total - free
    return total - avail, legacy


def dir_used_bytes(path: str = "/dev/shm") -> int:
    try:
        st = os.statvfs(path)
    except OSError:
        return 0
    return (st.f_blocks - st.f_bfree) * st.f_frsize


def title(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = f.read().split(b"\0")
        return b" ".join(a for a in argv if a).decode(errors="replace")[:120]
    except OSError:
        return "?"


def proc_status(pid: int) -> dict[str, int] | None:
    """PPid and the RSS parts (bytes) of one process from /proc/PID/status; None for a kernel thread or a process
    gone meanwhile."""
    try:
        with open(f"/proc/{pid}/status") as f:
            text = f.read()
    except OSError:
        return None
    out = {}
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        if key in ("PPid", "VmRSS", "RssAnon", "RssFile", "RssShmem"):
            v = rest.split()
            out[key] = int(v[0]) * (1024 if key != "PPid" else 1)
    return out if "VmRSS" in out else None


def proc_pss(pid: int) -> int | None:
    """Proportional set size (bytes) from /proc/PID/smaps_rollup; None where it cannot be read."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def role_of(name: str) -> str | None:
    for role, frags in ROLES:
        if any(f in name for f in frags):
            return role
    return None


def scan_processes(with_pss: bool, skip: tuple[int, ...] = ()) -> list[dict]:
    """Every user process on the node: pid, ppid, title, role, rss/anon/shmem and pss in bytes (pss None when not
    asked for; a process whose PSS cannot be read counts its RSS)."""
    procs = {}
    for d in os.listdir("/proc"):
        if not d.isdigit() or int(d) in skip:
            continue
        pid = int(d)
        st = proc_status(pid)
        if st is None:
            continue
        name = title(pid)
        procs[pid] = {"pid": pid, "ppid": st.get("PPid", 0), "title": name, "role": role_of(name),
                      "rss": st["VmRSS"], "anon": st.get("RssAnon", 0), "shmem": st.get("RssShmem", 0),
                      "pss": (proc_pss(pid) or st["VmRSS"]) if with_pss else None}
    for p in procs.values():
        seen, q = set(), p
        while q["role"] is None and q["ppid"] in procs and q["ppid"] not in seen:
            seen.add(q["ppid"])
            q = procs[q["ppid"]]
        p["role"] = q["role"] or "other"
    return list(procs.values())


def by_role(procs: list[dict]) -> dict[str, dict]:
    """Per role: process count and summed rss/anon/shmem/pss, MiB (pss None when not read)."""
    out: dict[str, dict] = {}
    for p in procs:
        r = out.setdefault(p["role"], {"n": 0, "rss": 0, "anon": 0, "shmem": 0, "pss": 0})
        r["n"] += 1
        for k in ("rss", "anon", "shmem"):
            r[k] += p[k]
        r["pss"] = None if p["pss"] is None or r["pss"] is None else r["pss"] + p["pss"]
    for r in out.values():
        for k in ("rss", "anon", "shmem", "pss"):
            if r[k] is not None:
                r[k] = round(r[k] / MIB)
    return dict(sorted(out.items()))


def node_sample(new_psutil: bool) -> dict[str, int]:
    m = read_meminfo()
    used_av, used_legacy = used_bytes(m)
    raw = {"used": used_av if new_psutil else used_legacy, "used_available": used_av, "used_legacy": used_legacy,
           "available": m.get("MemAvailable", 0), "free": m["MemFree"], "shmem": m.get("Shmem", 0),
           "dev_shm": dir_used_bytes(), "anon_pages": m.get("AnonPages", 0), "mlocked": m.get("Mlocked", 0),
           "total": m["MemTotal"]}
    return {k: round(v / MIB) for k, v in raw.items()}


class HostPeaks:
    """The node's peaks (and lowest MemAvailable), each role's peak, and each process's largest RSS."""

    def __init__(self, top: int = 25):
        self.node: dict[str, float] = {}
        self.roles: dict[str, dict] = {}
        self.procs: dict[int, dict] = {}
        self.top = top

    def add(self, t: float, node: dict, roles: dict, procs: list[dict]) -> None:
        for k, v in node.items():
            if k == "available":
                if v < self.node.get("min_available", float("inf")):
                    self.node["min_available"] = v
            elif v > self.node.get(k, -1):
                self.node[k] = v
                if k == "used":
                    self.node["t_used"] = round(t, 2)
        for role, r in roles.items():
            peak = self.roles.setdefault(role, {"n": 0, "rss": 0, "anon": 0, "shmem": 0, "pss": None})
            for k in ("n", "rss", "anon", "shmem"):
                peak[k] = max(peak[k], r[k])
            if r["pss"] is not None:
                peak["pss"] = max(peak["pss"] or 0, r["pss"])
        for p in procs:
            mib = round(p["rss"] / MIB)
            if mib > self.procs.get(p["pid"], {}).get("rss", -1):
                self.procs[p["pid"]] = {"pid": p["pid"], "role": p["role"], "rss": mib,
                                        "pss": None if p["pss"] is None else round(p["pss"] / MIB),
                                        "title": p["title"], "t": round(t, 2)}

    def summary(self) -> dict:
        top = sorted(self.procs.values(), key=lambda p: -p["rss"])[: self.top]
        return {"node": self.node, "roles": dict(sorted(self.roles.items())), "procs": top}


def host_sample(new_psutil: bool, with_pss: bool, skip: tuple[int, ...]) -> tuple[dict, dict, list[dict], float]:
    """(node figures, per-role figures, the processes, seconds the process scan took when it read PSS)."""
    node = node_sample(new_psutil)
    t0 = time.monotonic()
    procs = scan_processes(with_pss, skip)
    spent = time.monotonic() - t0 if with_pss else 0.0
    return node, by_role(procs), procs, spent


def gpu_sample(nvml, handles) -> tuple[list[int], list[list]]:
    used, procs = [], []
    for i, h in enumerate(handles):
        used.append(int(nvml.nvmlDeviceGetMemoryInfo(h).used // MIB))
        for p in nvml.nvmlDeviceGetComputeRunningProcesses(h):
            mib = int((p.usedGpuMemory or 0) // MIB)
            procs.append([i, int(p.pid), mib, title(int(p.pid))])
    return used, sorted(procs)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--interval", type=float, default=0.2, help="seconds between GPU samples")
    ap.add_argument("--host-interval", type=float, default=1.0, help="seconds between host samples (0: none)")
    ap.add_argument("--stop-file")
    ap.add_argument("--log")
    ap.add_argument("--log-out")
    ap.add_argument("--no-gpu", action="store_true", help="host memory only (no NVML)")
    args = ap.parse_args(argv)
    nvml, handles = None, []
    if not args.no_gpu:
        import pynvml as nvml  # nvidia-ml-py

        nvml.nvmlInit()
        handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(nvml.nvmlDeviceGetCount())]
    stop = {"now": False}
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.update(now=True))
    peak_gpu = [0] * len(handles)
    peak_proc: dict[str, dict] = {}
    version = psutil_version()
    new_psutil = uses_available(version)
    host = HostPeaks()
    pss = {"every": 1, "most": 1, "count": 0}  # PSS on every k-th host sample
    me = (os.getpid(),)
    last = None
    next_host = 0.0
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
            if handles:
                used, procs = gpu_sample(nvml, handles)
                peak_gpu = [max(a, b) for a, b in zip(peak_gpu, used)]
                for gpu, pid, mib, name in procs:
                    key = f"{gpu}:{pid}"
                    if mib >= peak_proc.get(key, {}).get("mib", -1):
                        peak_proc[key] = {"gpu": gpu, "pid": pid, "mib": mib, "title": name, "t": round(time.time(), 2)}
                if (used, procs) != last:
                    f.write(json.dumps({"t": round(time.time(), 3), "gpus": used, "procs": procs}) + "\n")
                    f.flush()
                    last = (used, procs)
            if args.host_interval > 0 and time.monotonic() >= next_host:
                next_host = time.monotonic() + args.host_interval
                now = time.time()
                with_pss = pss["count"] % pss["every"] == 0
                pss["count"] += 1
                node, roles, hprocs, spent = host_sample(new_psutil, with_pss, me)
                if with_pss:
                    pss["every"] = max(1, math.ceil(spent / (args.host_interval / 4)))
                    pss["most"] = max(pss["most"], pss["every"])
                host.add(now, node, roles, hprocs)
                f.write(json.dumps({"t": round(now, 3), "host": {**node, "roles": roles}}) + "\n")
                f.flush()
            time.sleep(args.interval if handles else args.host_interval)
        summary = {"peak_gpu_mib": peak_gpu, "peak_proc": list(peak_proc.values())}
        if args.host_interval > 0:
            summary["host"] = {**host.summary(), "psutil": version,
                               "used_is": "total - available" if new_psutil else "total - free - buffers - cached",
                               "pss_every_most": pss["most"]}
        f.write(json.dumps({"summary": summary}) + "\n")
    if logf:
        copy_log(logf)
        logf.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
