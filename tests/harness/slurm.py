"""A real Slurm on namespace hosts: munged (one, in the root namespace, on a private socket), slurmctld on the
first host, one slurmd per host. Node names are `<prefix>n<i>` with NodeAddr = the host's address, so nothing
has to be added to /etc/hosts. ProctrackType=proctrack/linuxproc and TaskPlugin=task/none: no cgroups needed.

Clients (srun, salloc, sbatch, scontrol) find this Slurm through SLURM_CONF (see `SlurmLab.env`).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
from pathlib import Path

from tests.harness.netns import Host, NetnsLab
from tests.harness.wait import wait_for

TOOLS = ("munged", "slurmctld", "slurmd", "srun", "salloc", "sbatch", "scontrol", "sinfo", "squeue")


def slurm_ready() -> str | None:
    """None when Slurm and munge are installed, else what is missing (setup.sh --test installs them)."""
    missing = [t for t in TOOLS if not shutil.which(t) and not Path(f"/usr/sbin/{t}").exists()]
    return f"not installed: {', '.join(missing)} (apt-get install slurmctld slurmd slurm-client munge)" \
        if missing else None


class SlurmLab:
    def __init__(self, lab: NetnsLab, hosts: list[Host], cpus: int = 2):
        self.lab, self.hosts = lab, hosts
        self.dir = lab.dir / "slurm"
        self.dir.mkdir()
        self.names = {h.name: f"{lab.prefix}n{i}" for i, h in enumerate(hosts)}
        self.conf = self.dir / "slurm.conf"
        self.socket = self.dir / "munge.sock"
        self.procs: list[subprocess.Popen] = []
        self.slurmd: dict[str, subprocess.Popen] = {}
        try:
            self._munge()
            self._write_conf(cpus)
            self._start_ctld()
            for h in hosts:
                self.start_slurmd(h)
            wait_for(self._all_idle, 30, "slurmd registration")
        except BaseException:
            self.close()  # munged lives in this machine's namespace: never leave it behind
            raise

    @property
    def env(self) -> dict[str, str]:
        return {"SLURM_CONF": str(self.conf)}

    def node(self, host: Host) -> str:
        return self.names[host.name]

    def _munge(self) -> None:
        key = self.dir / "munge.key"
        key.write_bytes(os.urandom(1024))
        os.chmod(key, 0o400)
        os.chmod(self.dir, 0o755)
        self.procs.append(subprocess.Popen(
            ["munged", "-F", "--force", f"--socket={self.socket}", f"--key-file={key}",
             f"--pid-file={self.dir}/munged.pid", f"--seed-file={self.dir}/munged.seed",
             f"--log-file={self.dir}/munged.log"], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL))
        wait_for(self.socket.exists, 10, "munged")

    def _write_conf(self, cpus: int) -> None:
        head = self.hosts[0]
        lines = [
            f"ClusterName=vc{self.lab.n}",
            f"SlurmctldHost={socket.gethostname()}({head.ip})",
            "AuthType=auth/munge", "CredType=cred/munge", f"AuthInfo=socket={self.socket}",
            "SlurmUser=root", "SlurmdUser=root",
            f"StateSaveLocation={self.dir}/state", f"SlurmdSpoolDir={self.dir}/spool-%n",
            f"SlurmctldPidFile={self.dir}/slurmctld.pid", f"SlurmdPidFile={self.dir}/slurmd-%n.pid",
            f"SlurmctldLogFile={self.dir}/slurmctld.log", f"SlurmdLogFile={self.dir}/slurmd-%n.log",
            "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none",
            "JobAcctGatherType=jobacct_gather/none", "AccountingStorageType=accounting_storage/none",
            "SelectType=select/cons_tres", "SelectTypeParameters=CR_CPU",
            "MpiDefault=none", "ReturnToService=2", "SlurmctldTimeout=30", "SlurmdTimeout=30",
            "InactiveLimit=0", "KillWait=5", "MinJobAge=30", "SchedulerType=sched/builtin",
            "SlurmctldParameters=enable_configless",
        ]
        for h in self.hosts:
            lines.append(f"NodeName={self.names[h.name]} NodeAddr={h.ip} NodeHostname={self.names[h.name]} "
                         f"CPUs={cpus} RealMemory=1000 State=UNKNOWN")
        lines.append("PartitionName=main Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES")
        (self.dir / "state").mkdir()
        self.conf.write_text("\n".join(lines) + "\n")
        # slurmd 22.05 initialises a cgroup plugin even when no cgroup feature is configured
        (self.dir / "cgroup.conf").write_text("CgroupPlugin=cgroup/v1\nCgroupAutomount=no\n")

    def _in_host(self, host: Host, argv: list[str], log: Path) -> subprocess.Popen:
        f = open(log, "ab")
        p = subprocess.Popen(["nsenter", "-t", str(host.init_pid), "-n", "-p", "-m", "--", *argv],
                             stdin=subprocess.DEVNULL, stdout=f, stderr=subprocess.STDOUT,
                             env={**os.environ, **self.env})
        f.close()
        return p

    def _start_ctld(self) -> None:
        self.procs.append(self._in_host(self.hosts[0], ["slurmctld", "-D", "-i", "-f", str(self.conf)],
                                        self.dir / "slurmctld.out"))
        wait_for(lambda: self.scontrol("ping").returncode == 0, 30, "slurmctld")

    def start_slurmd(self, host: Host) -> None:
        name = self.names[host.name]
        (self.dir / f"spool-{name}").mkdir(exist_ok=True)
        self.slurmd[host.name] = self._in_host(host, ["slurmd", "-D", "-N", name, "-f", str(self.conf)],
                                               self.dir / f"slurmd-{name}.out")

    def _all_idle(self) -> bool:
        r = self.run(["sinfo", "-h", "-N", "-o", "%N %t"])
        states = dict(line.split() for line in r.stdout.splitlines() if line.strip())
        return len(states) == len(self.hosts) and all(s == "idle" for s in states.values())

    def run(self, argv: list[str], timeout: float = 30) -> subprocess.CompletedProcess:
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env={**os.environ, **self.env})

    def scontrol(self, *args: str) -> subprocess.CompletedProcess:
        return self.run(["scontrol", *args])

    def _clients(self) -> list[int]:
        """Every process started for this Slurm, by its SLURM_CONF: srun/salloc clients here, the daemons and
        what their steps run in the hosts (all visible from this PID namespace)."""
        mark = f"SLURM_CONF={self.conf}".encode()
        pids = []
        for d in Path("/proc").iterdir():
            if d.name.isdigit() and int(d.name) != os.getpid():
                try:
                    if mark in (d / "environ").read_bytes().split(b"\0"):
                        pids.append(int(d.name))
                except OSError:
                    continue
        return pids

    def close(self) -> None:
        # an srun whose job vanished with slurmctld would wait for it forever (after a test that failed mid-way)
        for pid in self._clients():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for p in list(self.slurmd.values()) + self.procs[::-1]:
            if p.poll() is None:
                p.terminate()
                try:
                    p.wait(5)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait(5)
