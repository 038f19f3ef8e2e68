"""The Slurm allocation this process runs in, as facts: its nodes (name, address, state), CPUs and GPUs per node.

Read from the allocation's environment (SLURM_JOB_ID, SLURM_JOB_NODELIST, SLURM_JOB_CPUS_PER_NODE, the GPU
variables) and from `scontrol` (node list expansion, node addresses and states). Parsing is pure and unit
tested; `read_allocation` is the one place that runs commands.
"""

from __future__ import annotations

import ipaddress
import os
import re
import shutil
import socket
import subprocess
from dataclasses import dataclass, field
from typing import Callable, Mapping, Optional, Sequence

from verl_cluster.errors import ConfigError

ALLOC_HINT = ("run it inside an allocation: `salloc -N 2 --gpus-per-node=8` then `verl-cluster up --slurm`, "
              "or as a batch job: `verl-cluster sbatch JOB.yaml --nodes 2 --gpus-per-node 8 --submit`")
TOOLS = ("srun", "scontrol")


@dataclass(frozen=True)
class SlurmNode:
    name: str  # Slurm's node name: what `srun -w` takes
    addr: str  # the IPv4 address Ray advertises
    state: str = ""  # scontrol's State, e.g. MIXED, ALLOCATED+DRAIN
    reason: str = ""  # why it is drained/down, when Slurm says
    cpus: Optional[int] = None  # CPUs of this job on the node
    gpus: Optional[int] = None  # GPUs of this job on the node (None: requested but not countable here)

    @property
    def drained(self) -> bool:
        flags = set(self.state.upper().split("+"))
        return bool(flags & {"DRAIN", "DRAINING", "DRAINED", "DOWN", "FAIL", "FAILING", "NOT_RESPONDING"})


@dataclass(frozen=True)
class Allocation:
    job_id: str
    nodes: list[SlurmNode] = field(default_factory=list)
    gpus_requested: bool = False
    partition: str = ""

    @property
    def head(self) -> SlurmNode:
        return self.nodes[0]


Run = Callable[[Sequence[str]], str]  # argv -> stdout; raises ConfigError when the command fails


def expand_counts(text: str) -> list[int]:
    """SLURM_JOB_CPUS_PER_NODE / SLURM_TASKS_PER_NODE: '8(x2),4' -> [8, 8, 4]."""
    out: list[int] = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        m = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part)
        if not m:
            raise ConfigError(f"cannot read the Slurm count list `{text}`")
        out += [int(m.group(1))] * int(m.group(2) or 1)
    return out


def expand_nodelist(text: str) -> list[str]:
    """A Slurm host list ('gpu[01-03,07],login1') expanded here, for when scontrol is not asked.
    Handles one bracket group per name, as Slurm prints them; zero padding is kept."""
    names, depth, cur = [], 0, ""
    for ch in text:
        if ch == "," and depth == 0:
            names.append(cur)
            cur = ""
            continue
        depth += ch == "["
        depth -= ch == "]"
        cur += ch
    names.append(cur)
    out: list[str] = []
    for name in filter(None, (n.strip() for n in names)):
        m = re.fullmatch(r"([^\[\]]*)\[([^\]]+)\]([^\[\]]*)", name)
        if not m:
            out.append(name)
            continue
        pre, body, post = m.groups()
        for rng in body.split(","):
            lo, _, hi = rng.partition("-")
            width = len(lo)
            for i in range(int(lo), int(hi or lo) + 1):
                out.append(f"{pre}{i:0{width}d}{post}")
    return out


def gpus_per_node(env: Mapping[str, str]) -> tuple[bool, Optional[int]]:
    """(GPUs requested?, GPUs per node if the environment says) from the allocation's variables."""
    for key in ("SLURM_GPUS_ON_NODE", "SLURM_GPUS_PER_NODE"):
        v = env.get(key, "").strip()
        if v:
            m = re.search(r"(\d+)$", v.split(",")[0])  # '8' or 'h100:8'
            return True, int(m.group(1)) if m else None
    jobs_gpus = env.get("SLURM_JOB_GPUS", "").strip() or env.get("SLURM_STEP_GPUS", "").strip()
    if jobs_gpus:
        return True, len([g for g in jobs_gpus.split(",") if g.strip()])
    if env.get("SLURM_GPUS", "").strip() or env.get("SLURM_GPUS_PER_TASK", "").strip() \
            or "gpu" in env.get("SLURM_TRES_PER_TASK", ""):
        return True, None  # requested in a shape we cannot divide per node: NVML counts them
    return False, None


def parse_gres(text: str) -> tuple[bool, Optional[int]]:
    """TresPerNode / Gres from `scontrol show job`: 'gres/gpu:4', 'gres:gpu:h100:8', 'gpu:2'."""
    m = re.search(r"gpu(?::[\w.-]+)?[:=](\d+)", text or "")
    if m:
        return True, int(m.group(1))
    return ("gpu" in (text or "")), None


def parse_records(text: str) -> list[dict[str, str]]:
    """`scontrol show ... -o` output: one record a line of Key=Value words (values may hold spaces only at
    the end, as Reason does)."""
    records = []
    for line in text.splitlines():
        if "=" not in line:
            continue
        rec: dict[str, str] = {}
        key = None
        for word in line.split(" "):
            k, eq, v = word.partition("=")
            if eq and re.fullmatch(r"[A-Za-z][\w/:.]*", k):
                key = k
                rec[key] = v
            elif key is not None and word:
                rec[key] += " " + word  # a value with spaces (Reason=node is sick [root@...])
        records.append(rec)
    return records


def resolve_addr(name: str, addr: str) -> str:
    """The node's IPv4 address: NodeAddr when it is one, else what the name resolves to here."""
    for candidate in (addr, name):
        try:
            return str(ipaddress.IPv4Address(candidate))
        except ValueError:
            pass
    try:
        infos = socket.getaddrinfo(addr or name, None, socket.AF_INET)
    except OSError:
        infos = []
    ips = [i[4][0] for i in infos if not i[4][0].startswith("127.")]
    if not ips:
        raise ConfigError(f"Slurm node `{name}` (NodeAddr {addr or name}) does not resolve to an IPv4 address here",
                          "Ray needs each node's address: fix the name's DNS/hosts entry, or NodeAddr in slurm.conf")
    return ips[0]


def _local_run(argv: Sequence[str]) -> str:
    try:
        r = subprocess.run(list(argv), capture_output=True, text=True, timeout=30)
    except FileNotFoundError:
        raise ConfigError(f"Slurm command `{argv[0]}` not found", "run on a Slurm login/compute node "
                          "(or `module load slurm`) so that srun and scontrol are on PATH")
    except subprocess.TimeoutExpired:
        raise ConfigError(f"`{' '.join(argv[:3])}` did not answer within 30s", "is slurmctld up? try `scontrol ping`")
    if r.returncode != 0:
        why = (r.stderr.strip() or r.stdout.strip()).splitlines()
        raise ConfigError(f"`{' '.join(argv[:4])}` failed: {why[-1] if why else f'exit {r.returncode}'}",
                          "is slurmctld up and this allocation still running? try `scontrol ping`, `squeue --me`")
    return r.stdout


def check_tools(which: Callable[[str], Optional[str]] = shutil.which) -> None:
    missing = [t for t in TOOLS if not which(t)]
    if missing:
        raise ConfigError(f"Slurm commands not found: {', '.join(missing)}",
                          "run on a Slurm login/compute node (or `module load slurm`) so srun and scontrol are on PATH")


def job_id_from(env: Mapping[str, str], job_id: Optional[str] = None) -> str:
    jid = job_id or env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID")
    if not jid:
        raise ConfigError("not inside a Slurm allocation (SLURM_JOB_ID is not set)", ALLOC_HINT)
    return str(jid)


def read_allocation(env: Mapping[str, str] | None = None, job_id: Optional[str] = None,
                    run: Run = _local_run) -> Allocation:
    """The allocation's nodes, head first. ConfigError (one line + fix) when not in one or Slurm is missing."""
    env = os.environ if env is None else env
    if run is _local_run:
        check_tools()
    jid = job_id_from(env, job_id)
    same_job = str(env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID") or "") == jid
    nodelist = (env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST")) if same_job else None
    cpus_text = env.get("SLURM_JOB_CPUS_PER_NODE", "") if same_job else ""
    requested, gpus = gpus_per_node(env) if same_job else (False, None)
    partition = env.get("SLURM_JOB_PARTITION", "") if same_job else ""
    if not nodelist or not requested:
        jobs = parse_records(run(["scontrol", "show", "job", "-o", jid]))
        if not jobs:
            raise ConfigError(f"Slurm job {jid} not found", "is it still running? `squeue --me`")
        job = jobs[0]
        if job.get("JobState", "RUNNING") not in ("RUNNING", "CONFIGURING", "COMPLETING"):
            raise ConfigError(f"Slurm job {jid} is {job.get('JobState')}, not running", ALLOC_HINT)
        nodelist = nodelist or job.get("NodeList", "")
        partition = partition or job.get("Partition", "")
        if not requested:
            requested, gpus = parse_gres(job.get("TresPerNode", "") or job.get("Gres", ""))
        if not cpus_text and job.get("NumCPUs") and job.get("NumNodes", "").isdigit():
            cpus_text = f"{int(job['NumCPUs']) // max(1, int(job['NumNodes']))}(x{job['NumNodes']})"
    names = [n for n in run(["scontrol", "show", "hostnames", nodelist]).split() if n]
    if not names:
        raise ConfigError(f"Slurm job {jid} has no nodes yet (NodeList `{nodelist}`)", "wait until it runs: `squeue -j "
                          f"{jid}`")
    info = {r.get("NodeName", ""): r for r in parse_records(run(["scontrol", "show", "node", "-o", ",".join(names)]))}
    cpus = expand_counts(cpus_text) if cpus_text else []
    nodes = []
    for i, name in enumerate(names):
        rec = info.get(name, {})
        nodes.append(SlurmNode(name=name, addr=resolve_addr(name, rec.get("NodeAddr", "")),
                               state=rec.get("State", ""), reason=rec.get("Reason", "").strip(),
                               cpus=cpus[i] if i < len(cpus) else None,
                               gpus=(gpus if requested else 0)))
    return Allocation(jid, nodes, requested, partition)


def node_states(names: Sequence[str], run: Run = _local_run) -> dict[str, SlurmNode]:
    """Current Slurm state of these nodes (for status/check: a node drained mid-allocation)."""
    if not names:
        return {}
    recs = parse_records(run(["scontrol", "show", "node", "-o", ",".join(names)]))
    return {r["NodeName"]: SlurmNode(r["NodeName"], r.get("NodeAddr", ""), r.get("State", ""),
                                     r.get("Reason", "").strip()) for r in recs if r.get("NodeName")}
