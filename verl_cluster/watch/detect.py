"""What the watcher looks at: the GCS's node table and the workers' raylet ports (node lost), and the job's log
(progress, hang). Everything is read through Ray (its GCS on the head, its Jobs API): no agent of our own."""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path
from typing import Any, Optional

from verl_cluster.config.cluster import ClusterSpec
from verl_cluster.errors import ClusterError, RunnerError
from verl_cluster.nodes.auth import node_token_path
from verl_cluster.nodes.agent import Node, index_by_ip
from verl_cluster.watch.progress import Progress



SILENT_LOOKS = 4  # connects that time out in a row, to a raylet port that answered before, before asking the head
# the head's own look at a worker's raylet port (Ray's nodes reach each other there, or the cluster could not run)
HEAD_LOOK = "import socket, sys; socket.create_connection((sys.argv[1], int(sys.argv[2])), 3).close()"


def _port_state(ip: str, port: int, timeout: float = 1.0) -> str:
    """open | refused (the host answers but nothing listens: its raylet is gone) | silent (no answer: a host that is
    gone or cut off — or a firewall between us and it, so silence alone proves nothing)."""
    try:
        with socket.create_connection((ip, port), timeout=timeout):
            return "open"
    except ConnectionRefusedError:
        return "refused"
    except OSError:
        return "silent"


class NodeMonitor:
    """Which of the nodes a run started on have left the cluster, with the evidence."""

    def __init__(self, spec: ClusterSpec):
        self.spec = spec
        self.head = Node(spec, "head", spec.head)
        self.token: Optional[str] = None
        self.refusals: dict[str, int] = {}
        self.silent: dict[str, int] = {}  # looks in a row with no answer, for ports seen open from here
        self.seen_open: set[str] = set()

    def _gcs_nodes(self) -> dict[str, dict]:
        return index_by_ip(self._gcs_table(), self.spec.head_ip)

    def _gcs_table(self) -> list[dict]:
        if self.token is None and self.spec.security.auth == "token":
            self.token = node_token_path(self.spec, self.head.probe().home)
        return self.head.gcs(token_path=self.token).get("nodes", [])

    def alive_ips(self) -> set[str]:
        """Addresses of the configured nodes the GCS has alive now."""
        by_ip = self._gcs_nodes()
        return {ip for ip, x in by_ip.items() if x["alive"]}

    def gpus_by_ip(self) -> dict[str, int]:
        """GPUs each alive node registered with (what NVML should still see there)."""
        return {ip: int(x.get("resources", {}).get("GPU", 0)) for ip, x in self._gcs_nodes().items() if x["alive"]}

    def stale(self, gone: frozenset[str] = frozenset()) -> list[str]:
        """Addresses the GCS still lists alive by mistake: twice (a node restarted after its host died, whose old
        registration the GCS has not yet marked dead — its health check takes a while), or at all for a node
        known to be gone. A job started now could place work on the dead registration."""
        seen: dict[str, int] = {}
        for x in self._gcs_table():
            if x["alive"]:
                seen[x["ip"]] = seen.get(x["ip"], 0) + 1
        return sorted(ip for ip, k in seen.items() if k > 1 or ip in gone)

    def lost(self, expected: set[str]) -> Optional[tuple[str, str]]:
        """(node, evidence) for one expected node that is gone, else None. The head itself unreachable is a lost
        head."""
        port = self.spec.ray.ports.node_manager
        for ip in sorted(expected - {self.spec.head_ip}):
            state = _port_state(ip, port)
            if state == "refused":
                self.refusals[ip] = self.refusals.get(ip, 0) + 1
                if self.refusals[ip] >= 2:  # twice in a row: not a blip while a raylet restarts
                    return ip, f"raylet port {ip}:{port} refuses connections (the raylet or the host is gone)"
            else:
                self.refusals.pop(ip, None)
            if state == "open":
                self.seen_open.add(ip)
                self.silent.pop(ip, None)
            elif state == "silent" and ip in self.seen_open:
                # a host cut off (its link down) answers nothing: Ray's GCS takes ~5 x (3 s + 10 s) to mark it dead
                self.silent[ip] = self.silent.get(ip, 0) + 1
                if self.silent[ip] >= SILENT_LOOKS and not self._head_reaches(ip, port):
                    return ip, (f"raylet port {ip}:{port} has not answered for {self.silent[ip]} looks, from here nor "
                                "from the head (the host or its network is gone)")
        try:
            by_ip = self._gcs_nodes()
        except RunnerError as e:
            return self.spec.head_ip, f"the head's GCS cannot be asked: {e.reason}"
        for ip in sorted(expected):
            x = by_ip.get(ip)
            if x is None or not x["alive"]:
                return ip, "the GCS marks this node dead" if x else "the GCS does not list this node"
        return None

    def _head_reaches(self, ip: str, port: int) -> bool:
        """Whether the head connects to that port (a failed look from the head itself counts as not reaching)."""
        try:
            res = self.head.runner.run([self.head.python, "-c", HEAD_LOOK, ip, str(port)], timeout=15)
        except RunnerError:
            return True  # the head cannot be asked: the GCS check below says what is wrong with it
        if res.ok:
            self.silent.pop(ip, None)  # reachable from the head: the silence is this machine's path to it
        return res.ok

    def close(self) -> None:
        self.head.close()


class LogTracker:
    """A running attempt's log as the watcher reads it: only the bytes written since the last look
    (verl_logs/job_log.py), the training progress they show (read once, as they arrive: steps and checkpoints for
    the watcher, verl's metrics for the end of the attempt), the last lines (bounded), and when the log last moved.
    Its offset and what it parsed are kept in the run folder (`state_file`): a watcher started again resumes there
    and never reads the log from its start again."""

    SAVE_EVERY_S = 10.0

    def __init__(self, source: Any, state_file: Optional[Path] = None, predicted: Optional[dict] = None):
        from verl_cluster.verl_logs.job_log import LogFollower
        from verl_cluster.verl_logs.verl_log import KEEP_STEPS, VerlProgress

        self.progress = Progress()
        self.verl = VerlProgress(predicted=predicted, keep_steps=KEEP_STEPS)
        self.state_file, self.saved_at, self.seen = state_file, 0.0, False
        self.failures, self.error = 0, ""  # consecutive failed reads, the last one's message
        self._out, self._skipping = None, False  # show(): the terminal writer, a backlog being skipped
        self.last_change = time.monotonic()
        offset = self._load(predicted)
        self.follower = LogFollower(source, offset, [self.progress.feed, self.verl.feed], on_restart=self._afresh)
        self.resumed_at = offset  # where this reader started (0: the log's start)
        self._seed = offset > 0  # the lines before the offset, for the tail: read with the first update

    def _load(self, predicted: Optional[dict]) -> int:
        from verl_cluster.verl_logs.verl_log import KEEP_STEPS, VerlProgress

        if self.state_file is None:
            return 0
        try:
            doc = json.loads(self.state_file.read_text())
            progress = Progress.from_json(doc["progress"])
            verl = VerlProgress.from_json(doc["verl"], predicted, KEEP_STEPS)
            offset = int(doc["offset"])
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return 0  # none yet (or cut short): read from the start
        self.progress, self.verl = progress, verl
        return max(0, offset)

    def _afresh(self) -> None:
        """The log started over (a new one under the same name): so does what was read of it."""
        self.progress = Progress()
        self.verl = type(self.verl)(predicted=self.verl.predicted, keep_steps=self.verl.keep_steps)
        self.follower.on_lines = [self.progress.feed, self.verl.feed]

    @property
    def tail(self) -> list[str]:
        return list(self.follower.tail)

    def update(self, limit: Optional[int] = None) -> str:
        """Fetches what the job wrote since the last look (at most `limit` bytes); returns it."""
        from verl_cluster.verl_logs.job_log import CHUNK

        if self._seed:
            self.follower.seed_tail()
            self._seed = False
        new = self.follower.poll(limit or CHUNK)
        if new:
            self.last_change, self.seen = time.monotonic(), True
            if time.monotonic() - self.saved_at >= self.SAVE_EVERY_S:
                self.save()
        return new

    @property
    def behind(self) -> int:
        return self.follower.behind

    def read(self, api: Any) -> str:
        """update() through `api` (the watcher's current connection); a failed read returns "" and counts in
        `failures` (its message in `error`), and stops the hang clock: a log that cannot be read is no hang."""
        self.follower.source.use(api)
        try:
            new = self.update()
        except ClusterError as e:
            self.failures, self.error = self.failures + 1, e.message
            self.last_change = time.monotonic()
            return ""
        self.failures, self.error = 0, ""
        return new

    def show(self, stream: Any, new: str, sid: str) -> None:
        """The job's new output on `stream` (made safe on a terminal); a backlog more than a chunk long (a watcher
        attaching to a long run) is read for its progress but not printed."""
        from verl_cluster.verl_logs.job_log import CHUNK
        from verl_cluster.terminal_text import TerminalWriter

        if stream is None or not new:
            return
        if self.behind > CHUNK:
            if not self._skipping:
                self._skipping = True
                stream.write(f"[watch] reading {self.behind / 2**20:.0f} MiB of log written before this watcher "
                             f"(not shown: verl-cluster logs {sid})\n")
            return
        self._skipping = False
        if self._out is None or self._out.stream is not stream:
            self._out = TerminalWriter(stream)
        self._out.write(new)

    def quiet_for(self) -> float:
        return time.monotonic() - self.last_change

    def save(self) -> None:
        """Offset and parse state into the run folder, whole or not at all, private to the user."""
        self.saved_at = time.monotonic()
        if self.state_file is None:
            return
        doc = {"offset": self.follower.line_offset, "progress": self.progress.to_json(), "verl": self.verl.to_json()}
        tmp = self.state_file.with_name(self.state_file.name + ".tmp")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
            with os.fdopen(fd, "w") as fh:
                fh.write(json.dumps(doc) + "\n")
            os.replace(tmp, self.state_file)
        except OSError:
            pass  # best effort: a watcher started again then reads more of the log, nothing worse

    def finish(self) -> Progress:
        """The attempt's end: a last line without its newline is read too; the state is saved."""
        self.follower.flush()
        self.progress.flush()
        self.verl.flush()
        self.save()
        return self.progress
