"""A Ray job's driver log, read by byte ranges: whatever its size, a reader holds a bounded tail, never the log.

Ray's Jobs SDK can only give the whole log (`get_job_logs`) or stream it from byte 0 on every connect
(`tail_job_logs`); the State API's `/api/v0/logs/{file,stream}` can start N lines from the end but takes no byte
offset, so after a dropped connection it can only be re-tailed and guessed at. The dashboard agent of the driver's
node (`driver_agent_http_address` in the job's info) serves its log folder at `/logs/<file>` and honours HTTP
`Range` (Ray 2.54 and 2.60 alike, behind the same token check as the rest of the agent), so a reader asks for
exactly the bytes after the offset it has: each poll moves what the job wrote since the last one, a reconnect or a
restarted watcher resumes from its offset, and the head's dashboard does no work for it.

The agent is reached the way the dashboard is: through an SSH tunnel from the head when the dashboard is on the
head's loopback (the head reaches every node's agent: Ray's Jobs API does the same), else directly.
"""

from __future__ import annotations

import codecs
import http.client
import os
import socket
import time
import urllib.parse
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Optional

from verl_cluster.errors import ClusterError

CHUNK = 4 << 20  # the most one request asks for: a reader catching up holds at most this much at once
TAIL_LINES = 2000  # the last lines kept (the failure classifier reads them)
TAIL_LINE_CHARS = 2000  # of a longer line the tail keeps its start
MAX_LINE = 256 << 10  # a line longer than this (a progress bar without newlines) is cut into pieces
REQUEST_TIMEOUT_S = 30.0


@dataclass
class FetchStats:
    """What a reader asked for, for tests and benchmarks: requests, bytes of log received, the last one's bytes."""
    requests: int = 0
    bytes: int = 0
    last_bytes: int = 0


class AgentLog:
    """Byte ranges of one job's driver log (`job-driver-<submission id>.log`) from the agent of its driver's node."""

    def __init__(self, api: Any, sid: str, timeout_s: float = REQUEST_TIMEOUT_S):
        self.api, self.sid, self.timeout_s = api, sid, timeout_s
        self.stats = FetchStats()
        self._conn: Optional[http.client.HTTPConnection] = None
        self._base: Optional[tuple[str, int]] = None  # host, port as this machine reaches the agent

    def _resolve(self) -> bool:
        """Finds the driver's agent; False while the job has no driver yet (PENDING)."""
        info = self.api.call(self.api.client.get_job_info, self.sid)
        if not getattr(info, "submission_id", None):
            raise ClusterError(f"job {self.sid} was not submitted through the Jobs API (a driver started by hand): "
                               "Ray keeps no log of it", "its output is in the terminal that started it")
        address = getattr(info, "driver_agent_http_address", None)
        if not address:
            return False
        self._base = agent_endpoint(self.api, str(address))
        return True

    def use(self, api: Any) -> None:
        """Reads through `api` from now on (a watcher reconnects after losing the head: the old tunnels are gone)."""
        if api is not self.api:
            self.close()
            self.api, self._base = api, None

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def _get(self, range_value: str) -> tuple[int, dict[str, str], bytes]:
        if self._base is None and not self._resolve():
            return 0, {}, b""
        host, port = self._base
        path = "/logs/" + urllib.parse.quote(f"job-driver-{self.sid}.log")
        headers = {**self.api.headers, "Range": range_value}
        for attempt in (0, 1):  # a kept-alive connection the agent closed meanwhile is opened once more
            if self._conn is None:
                self._conn = http.client.HTTPConnection(host, port, timeout=self.timeout_s)
            try:
                self._conn.request("GET", path, headers=headers)
                r = self._conn.getresponse()
                body = r.read()
                hdrs = {k.lower(): v for k, v in r.getheaders()}
                if hdrs.get("connection", "").lower() == "close":
                    self.close()
                self.stats.requests += 1
                return r.status, hdrs, body
            except (OSError, http.client.HTTPException) as e:
                self.close()
                if attempt:
                    self._base = None  # the driver may have moved (a new head): ask again next time
                    raise ClusterError(f"cannot read job {self.sid}'s log from the Ray agent at {host}:{port}: "
                                       f"{str(e)[:200] or type(e).__name__}",
                                       "is the cluster up? `verl-cluster status`; the agent listens on "
                                       "ray.ports.dashboard_agent_listen of the driver's node") from e
        raise AssertionError("unreachable")

    def _answer(self, status: int, hdrs: dict[str, str], body: bytes) -> tuple[bytes, Optional[int]]:
        if status == 0:
            return b"", None  # no driver yet
        if status in (401, 403):
            raise ClusterError(f"the Ray agent refused our token reading job {self.sid}'s log",
                               "the token file does not match the running cluster: run `verl-cluster up` again")
        if status == 404:
            return b"", None  # not written yet, or its Ray session ended
        total = _total(hdrs.get("content-range", ""))
        if status == 416:
            return b"", total
        if status == 206 and total is not None:
            self.stats.bytes += len(body)
            self.stats.last_bytes = len(body)
            return body, total
        raise ClusterError(f"the Ray agent answered HTTP {status} to a byte range of job {self.sid}'s log "
                           f"({_short(body)})")

    def fetch(self, start: int, limit: int = CHUNK) -> tuple[bytes, Optional[int]]:
        """(up to `limit` bytes from `start`, the log's size); size None while there is no log (yet)."""
        return self._answer(*self._get(f"bytes={start}-{start + max(1, limit) - 1}"))

    def last(self, nbytes: int) -> tuple[bytes, Optional[int]]:
        """(the log's last `nbytes` bytes, its size)."""
        return self._answer(*self._get(f"bytes=-{max(1, nbytes)}"))


def _total(content_range: str) -> Optional[int]:
    """The size in `bytes 0-99/1234` or `bytes */1234`."""
    _, _, total = content_range.rpartition("/")
    return int(total) if total.strip().isdigit() else None


def _short(body: bytes) -> str:
    lines = [x for x in body.decode(errors="replace").strip().splitlines() if x.strip()]
    return lines[-1][:200] if lines else "no body"


def this_machine(host: str) -> bool:
    """Whether `host` is an address of this machine (one a socket here can bind to)."""
    try:
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind((host, 0))
        return True
    except OSError:
        return False


def agent_endpoint(api: Any, address: str) -> tuple[str, int]:
    """(host, port) this machine reaches the agent at `address` (from the Jobs API: an untrusted reply) through:
    only an address of one of the cluster's own nodes on its agent port is accepted, as the token goes there."""
    u = urllib.parse.urlsplit(address)
    try:
        host, port = u.hostname, u.port
    except ValueError:
        host, port = None, None
    if u.scheme != "http" or not host or not port:
        raise ClusterError(f"the Jobs API named the driver's agent {address[:100]!r}, not an http://host:port")
    spec = getattr(api, "spec", None)
    if spec is None:  # a client made by hand (tests): no cluster to hold the address against
        return host, port
    nodes = {spec.node_ip(n) for _, n in spec.nodes()} | {spec.head_ip}
    if spec.head.is_local and host not in nodes and this_machine(host):
        # a head on this machine: Ray names the driver's agent by the machine's own address, not the loopback the
        # head was started on (--node-ip-address 127.0.0.1); the agent listens on both, and it is still this one
        nodes.add(host)
    if host not in nodes or port != spec.ray.ports.dashboard_agent_listen:
        raise ClusterError(f"the Jobs API named {host}:{port} as the driver's agent, which is not one of the "
                           f"cluster's nodes on ray.ports.dashboard_agent_listen "
                           f"({spec.ray.ports.dashboard_agent_listen}): the token is not sent there",
                           "is the cluster file the one this cluster was started with?")
    return api.agent_route(host, port)


class LogFollower:
    """Follows a log from a byte offset. Each poll fetches the bytes written since the last one (at most CHUNK),
    hands complete lines to `on_lines`, keeps the last TAIL_LINES lines, and returns the new text for printing.
    `line_offset` is where the last complete line ends: where a later reader resumes."""

    def __init__(self, source: AgentLog, offset: int = 0, on_lines: Iterable[Callable[[str], Any]] = (),
                 tail_lines: int = TAIL_LINES, on_restart: Optional[Callable[[], None]] = None):
        self.source, self.offset, self.on_lines, self.on_restart = source, offset, list(on_lines), on_restart
        self.size: Optional[int] = None  # the log's size at the last fetch
        self.partial = b""
        self.tail: deque[str] = deque(maxlen=tail_lines)
        self._text = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.restarted = False  # the log was found shorter than the offset: it was read afresh

    @property
    def line_offset(self) -> int:
        return self.offset - len(self.partial)

    @property
    def behind(self) -> int:
        """Bytes written that this reader has not fetched yet (as of its last fetch)."""
        return max(0, (self.size or 0) - self.offset)

    def poll(self, limit: int = CHUNK) -> str:
        data, size = self.source.fetch(self.offset, limit)
        if size is None:
            return ""
        if size < self.offset:  # a new log under the same name: read it afresh
            self.offset, self.partial, self.restarted = 0, b"", True
            self._text.reset()
            self.tail.clear()
            if self.on_restart is not None:
                self.on_restart()
            data, size = self.source.fetch(0, limit)
            size = size or 0
        self.size = size
        self.offset += len(data)
        return self._take(data)

    def _take(self, data: bytes) -> str:
        if not self.on_lines and not self.tail.maxlen:  # a plain copy (`logs`): no line is looked at
            return self._text.decode(data)
        buf = self.partial + data
        cut = buf.rfind(b"\n") + 1
        whole, self.partial = buf[:cut], buf[cut:]
        if len(self.partial) > MAX_LINE:
            whole, self.partial = whole + self.partial + b"\n", b""
        if whole:
            self._lines(whole.decode(errors="replace"))
        return self._text.decode(data)

    def _lines(self, text: str) -> None:
        for fn in self.on_lines:
            fn(text)
        self.tail.extend(x[:TAIL_LINE_CHARS] for x in text.splitlines())

    def flush(self) -> str:
        """The end of the log: a last line without its newline is read as a line."""
        if self.partial:
            text, self.partial = self.partial.decode(errors="replace"), b""
            self._lines(text + "\n")
        return self._text.decode(b"", final=True)

    def seed_tail(self, nbytes: int = 256 << 10) -> None:
        """The lines before the offset, into the tail only (a reader resuming at an offset has not seen them)."""
        start = max(0, self.line_offset - nbytes)
        if self.line_offset <= start:
            return
        data, size = self.source.fetch(start, self.line_offset - start)
        if start > 0:
            data = data[data.find(b"\n") + 1:]  # from the first whole line
        self.tail.extend(x[:TAIL_LINE_CHARS] for x in data.decode(errors="replace").splitlines())

    def catch_up(self, deadline: float, limit: int = CHUNK) -> str:
        """Polls until nothing is left behind or the deadline passes; the new text, up to the last 64 KiB."""
        out = self.poll(limit)
        while self.behind and time.monotonic() < deadline:
            out = (out + self.poll(limit))[-(64 << 10):]
        return out


def last_lines(source: AgentLog, n: int, max_bytes: int = 64 << 20) -> tuple[bytes, Optional[int]]:
    """(the log's last `n` lines, where they start), reading backwards in growing ranges (at most `max_bytes`)."""
    nbytes = max(64 << 10, n * 256)
    while True:
        data, size = source.last(nbytes)
        if size is None:
            return b"", None
        body = data[:-1] if data.endswith(b"\n") else data
        if body.count(b"\n") >= n or len(data) >= size or nbytes >= max_bytes:
            parts = body.split(b"\n")
            keep = b"\n".join(parts[-n:]) + data[len(body):] if n > 0 else b""
            return keep, size - len(keep)
        nbytes *= 4


def print_log(api: Any, sid: str, out: Any, tail: Optional[int] = None) -> bool:
    """The job's log (or its last `tail` lines) to `out` as it streams, made safe on a terminal; False when the
    job has no log (yet)."""
    from verl_cluster.terminal_text import TerminalWriter

    source, writer = AgentLog(api, sid), TerminalWriter(out)
    try:
        if tail is not None:
            data, start = last_lines(source, tail)
            writer.write(data.decode(errors="replace"))
        else:
            f = LogFollower(source, tail_lines=0)
            drain(f, writer.write)
            writer.write(f.flush())
            start = f.size
        writer.close()
    finally:
        source.close()
    return start is not None


def tail_offset(api: Any, sid: str, n: int) -> int:
    """Where the log's last `n` lines start (0 when it has no log yet)."""
    source = AgentLog(api, sid)
    try:
        return last_lines(source, n)[1] or 0
    finally:
        source.close()


DRAIN_S = 3.0  # after a job's terminal status, how long its last lines may still take to reach the log


def drain(f: LogFollower, write: Callable[[str], None]) -> int:
    """Polls until the reader is level with the log; returns the bytes it fetched."""
    before = f.offset
    while True:
        text = f.poll()
        if text:
            write(text)
        if not f.behind:
            return f.offset - before


@dataclass(frozen=True)
class FollowResult:
    status: str  # a terminal status, or "DETACHED"
    message: str
    tail: list[str]
    verl: Optional[dict] = None  # verl_log.VerlProgress.summary() when the job is a verl trainer
    failure: Optional[dict] = None  # verl_log.Failure.to_json() when the job did not succeed
    stats: Optional[FetchStats] = None


def follow(api: Any, job_id: str, out: Any = None, status_out: Any = None, poll_s: float = 1.0,
           tail_lines: int = 20, progress: Optional[Any] = None, offset: int = 0) -> FollowResult:
    """Print the job's log from `offset` until the job ends (made safe when `out` is a terminal); status changes
    go to `status_out`. Ctrl-C raises KeyboardInterrupt (the caller decides: detach or stop). `progress` (a
    verl_log.VerlProgress) is fed every line; from the second step of a start, its time per step and time left
    go to `status_out` when they move (verl_logs/run_eta.py). The job's end is decided by its status, not by its
    log: processes it left behind (vLLM's workers, say) can write long after it SUCCEEDED."""
    import sys

    from verl_cluster.jobs import ray_jobs
    from verl_cluster.verl_logs.run_eta import EtaTicker
    from verl_cluster.terminal_text import TerminalWriter

    out, status_out = out or sys.stdout, status_out or sys.stderr
    t0, seen = time.monotonic(), {"status": ""}
    f = LogFollower(AgentLog(api, job_id), offset, [progress.feed] if progress is not None else [])
    writer, ticker, learned = TerminalWriter(out), EtaTicker(), False

    def show_status(status: str) -> None:
        if status != seen["status"]:
            seen["status"] = status
            print(f"── {job_id}: {status} ({time.monotonic() - t0:.1f}s)", file=status_out, flush=True)

    try:
        while True:
            row = ray_jobs.job_info(api, job_id)
            if progress is not None and not learned:  # the run's length, until its log says it
                progress.learn_command(row.entrypoint)
                learned = True
            show_status(row.status)
            drain(f, writer.write)
            if row.status in ray_jobs.TERMINAL:
                break
            line = ticker.due(progress.estimate(), time.monotonic()) if progress is not None else None
            if line:
                print(f"── {line}", file=status_out, flush=True)  # our own figures: nothing to make safe
            time.sleep(poll_s)
        deadline = time.monotonic() + DRAIN_S
        while drain(f, writer.write) and time.monotonic() < deadline:  # lines still landing after the end
            time.sleep(0.2)
        writer.write(f.flush())
        writer.close()
    except KeyboardInterrupt:  # detached: what the run logged so far still tells the next plan its lengths
        _remember_lengths(job_id, progress)
        raise
    failure = None
    if row.status != "SUCCEEDED":  # any job: its own module not shipped is said with the command that ships it
        from verl_cluster.verl_logs.verl_log import classify

        found = classify(list(f.tail), here=_here())
        failure = found.to_json() if found else None
    summary = progress.summary() if progress is not None else None
    _remember_lengths(job_id, progress, summary)
    return FollowResult(row.status, row.message, list(f.tail)[-tail_lines:], summary, failure, f.source.stats)


def _here() -> Optional[str]:
    try:
        return os.getcwd()
    except OSError:  # the folder was removed since: nothing to look in
        return None


def _remember_lengths(job_id: str, progress: Optional[Any], summary: Optional[dict[str, Any]] = None) -> None:
    """What the next plan of the job (its lengths) and of these machines (their host speed) takes from the run;
    SUMMARY: progress.summary() when made already (its vs_plan_host is the run's host fit)."""
    if progress is not None:
        from verl_cluster.records import host_speed
        from verl_cluster.records.length_store import remember_run

        remember_run(job_id, progress)
        if summary is None:
            host_speed.remember_run(job_id, progress)
        else:
            host_speed.remember(job_id, progress.predicted, summary.get("vs_plan_host"))
