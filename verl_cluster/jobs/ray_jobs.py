"""Ray Jobs API through the cluster's auth token, over an SSH tunnel when the dashboard is on the head's loopback.

The token goes into the client's own Authorization header only: nothing is put into this process's
environment (Ray would otherwise cache it process-wide), into the job, or into its metadata.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import re
import socket
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Optional

from verl_cluster.config.cluster import ClusterSpec
from verl_cluster.errors import ClusterError, NoSuchJob
from verl_cluster.jobs.request import RayJobRequest
from verl_cluster.launchers import runner_for
from verl_cluster.nodes.token_bind import token_for_sending

TERMINAL = ("SUCCEEDED", "FAILED", "STOPPED")


def auth_headers(spec: ClusterSpec) -> dict[str, str]:
    if spec.security.auth != "token":
        return {}
    path = token_for_sending(spec)  # this cluster's own token, and only to the head it was made for
    try:
        token = path.read_text().strip()
    except FileNotFoundError:
        raise ClusterError(f"no auth token for cluster `{spec.cluster_name}` at {path}",
                           "start the cluster with `verl-cluster up` (it writes the token), or fix security.token_file")
    except OSError as e:
        raise ClusterError(f"cannot read the auth token {path}: {e.strerror or e}")
    if not token:
        raise ClusterError(f"auth token file {path} is empty", "run `verl-cluster up` again to write it")
    return {"Authorization": f"Bearer {token}"}


def _api_errors() -> tuple[type, ...]:
    from ray.exceptions import RayError  # AuthenticationError (bad/missing token) is one

    return (RuntimeError, ConnectionError, OSError, ValueError, RayError) + REPLY_ERRORS


# what Ray's client raises on a reply of the wrong shape (a list for an object, a number for text): the server's
# answer is untrusted input, said as an error naming the server, never an internal error
REPLY_ERRORS = (TypeError, KeyError, AttributeError, IndexError)
RETURNS = {"get_job_logs": str, "submit_job": str, "list_jobs": list, "stop_job": bool}  # what each call gives


def _explain(e: BaseException, where: str) -> ClusterError:
    text = str(e)
    # 401/403 as a status of their own: a port (127.0.0.1:40373) is not a refusal
    if type(e).__name__ == "AuthenticationError" or re.search(r"Authentication|Unauthorized|Forbidden|\b40[13]\b",
                                                              text):
        return ClusterError(f"the Jobs API at {where} refused our token",
                            "the token file does not match the running cluster: run `verl-cluster up` again")
    first = _first_line(text) or type(e).__name__
    if isinstance(e, ConnectionError) or "Failed to connect" in text or "Connection refused" in text:
        return ClusterError(f"cannot reach the Ray Jobs API at {where}: {first[:200]}",
                            "is the cluster up? try `verl-cluster status`")
    return ClusterError(f"Ray Jobs API at {where}: {first[:300]}")


def _first_line(text: str) -> str:
    """The line of a server's error that says what went wrong: its first line, or where that line only opens a
    Python traceback (an HTTP 500 of the dashboard), the traceback's last line (the exception) after the prefix."""
    lines = [x.strip() for x in text.strip().splitlines() if x.strip()]
    if not lines:
        return ""
    head, cut, _ = lines[0].partition("Traceback (most recent call last):")
    if cut and len(lines) > 1:
        return f"{head}{lines[-1]}"
    return lines[0]


class JobsApi:
    """A connected JobSubmissionClient plus what it needs to stay connected (the tunnel)."""

    def __init__(self, client: Any, where: str, url: str = "", headers: Optional[dict[str, str]] = None,
                 spec: Optional[ClusterSpec] = None, stack: Optional[contextlib.ExitStack] = None,
                 runner: Optional[Any] = None):
        self.client, self.where, self.url, self.headers = client, where, url, dict(headers or {})
        self.spec, self.stack, self.runner = spec, stack, runner  # to reach the nodes' agents (verl_logs/job_log.py)
        self._routes: dict[tuple[str, int], tuple[tuple[str, int], Any]] = {}
        self._routes_lock = threading.Lock()

    def agent_route(self, host: str, port: int) -> tuple[str, int]:
        """Where this machine reaches a node's dashboard agent: directly, or, when the dashboard itself is behind
        an SSH tunnel (or the agent's port is not reachable from here), through a tunnel from the head."""
        with self._routes_lock:
            found = self._routes.get((host, port))
            if found and (found[1] is None or found[1].alive):
                return found[0]
            spec = self.spec
            _, _, tunnel_needed = dashboard_target(spec)
            if spec.head.is_local or (not tunnel_needed and reachable(host, port)):
                self._routes[(host, port)] = ((host, port), None)
                return host, port
            if self.runner is None:
                self.runner = runner_for(spec, spec.head)
                self.stack.callback(self.runner.close)
            tunnel = self.runner.open_tunnel(host, port)
            self.stack.callback(tunnel.close)
            self._routes[(host, port)] = (("127.0.0.1", tunnel.local_port), tunnel)
            return "127.0.0.1", tunnel.local_port

    def call(self, fn: Callable[..., Any], *args: Any, **kw: Any) -> Any:
        try:
            out = fn(*args, **kw)
        except _api_errors() as e:
            if isinstance(e, REPLY_ERRORS):
                raise self.not_ray(f"{type(e).__name__}: {str(e)[:200]}") from None
            if "does not exist" in str(e):
                raise NoSuchJob(f"no such job on this cluster: {str(e).splitlines()[0][:200]}",
                                   "list them with `verl-cluster jobs`")
            raise _explain(e, self.where) from e
        want = RETURNS.get(getattr(fn, "__name__", ""))
        if want is not None and not isinstance(out, want):
            raise self.not_ray(f"{fn.__name__} gave {type(out).__name__}, not {want.__name__}")
        return out

    def not_ray(self, what: str) -> ClusterError:
        return ClusterError(f"the Jobs API at {self.where} answered with something that is not a Ray Jobs API "
                            f"reply ({what})", "is that this cluster's head? check head.host and head.dashboard_port")


def reachable(host: str, port: int, timeout_s: float = 5.0) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return True
    except OSError:
        return False


def dashboard_target(spec: ClusterSpec) -> tuple[str, int, bool]:
    """(host, port, needs_tunnel) for the Jobs API as seen from this machine."""
    port = spec.head.dashboard_port
    if spec.security.dashboard_host == "loopback":
        return "127.0.0.1", port, not spec.head.is_local
    return spec.head_ip, port, False


_OPEN: dict[tuple, tuple[JobsApi, contextlib.ExitStack]] = {}
_OPEN_LOCK = threading.Lock()


@contextlib.contextmanager
def connect(spec: ClusterSpec) -> Iterator[JobsApi]:
    """A Jobs API client for the cluster. Kept open for the rest of this process (closed at exit), so the
    preflight's health probe and the submit share one SSH tunnel and one version handshake."""
    key = (spec.cluster_name, spec.head.host, spec.head.dashboard_port, str(spec.token_file))
    with _OPEN_LOCK:
        found = _OPEN.get(key)
    if found is None:  # opened outside the lock: one slow cluster must not hold up the others (`jobs` asks all)
        opened = _open(spec)
        with _OPEN_LOCK:
            found = _OPEN.setdefault(key, opened)
        if found is not opened:
            opened[1].close()
    yield found[0]


def close_all() -> None:
    with _OPEN_LOCK:
        for _, stack in _OPEN.values():
            stack.close()
        _OPEN.clear()


atexit.register(close_all)


REQUEST_TIMEOUT_S = 60.0  # per HTTP read; Ray's client sets none, so a dashboard that never answers hangs it


def client_class() -> type:
    """Ray's JobSubmissionClient with a timeout on every HTTP request it makes (its version check too)."""
    from ray.job_submission import JobSubmissionClient

    class TimedJobSubmissionClient(JobSubmissionClient):
        def _do_request(self, method, endpoint, **kw):
            kw.setdefault("timeout", REQUEST_TIMEOUT_S)
            return super()._do_request(method, endpoint, **kw)

    return TimedJobSubmissionClient


@dataclass(frozen=True)
class DashboardLink:
    url: str  # as this machine reaches it
    where: str  # for messages
    tunnel: Optional[Any] = None  # the runners.ssh.Tunnel, when the dashboard is on a remote head's loopback
    runner: Optional[Any] = None  # the head's runner the tunnel goes through


def open_dashboard(spec: ClusterSpec, stack: contextlib.ExitStack, local_port: int = 0) -> DashboardLink:
    """The head's dashboard/Jobs API from this machine; a tunnel opened for it is closed with `stack`.
    OSError when `local_port` is taken."""
    host, port, tunnel_needed = dashboard_target(spec)
    if not tunnel_needed:
        return DashboardLink(f"http://{host}:{port}", f"http://{host}:{port}")
    runner = runner_for(spec, spec.head)
    stack.callback(runner.close)
    tunnel = runner.open_tunnel(host, port, local_port)
    stack.callback(tunnel.close)
    return DashboardLink(tunnel.url, f"{spec.head.host} 127.0.0.1:{port} (SSH tunnel)", tunnel, runner)


def probe_dashboard(link: DashboardLink, headers: dict[str, str], timeout_s: float = 10.0) -> tuple[str, bool]:
    """(Ray version, whether our token was accepted) from the Jobs API's /api/version, which needs the token
    when auth is on. ClusterError when nothing answers within timeout_s."""
    import http.client
    import urllib.error
    import urllib.request

    req = urllib.request.Request(f"{link.url}/api/version", headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as r:
            doc = json.loads(r.read() or b"{}")
            version = doc.get("ray_version") if isinstance(doc, dict) else None
            return (version if isinstance(version, str) else "?"), True
    except urllib.error.HTTPError as e:
        if e.code in (401, 403):
            return "?", False
        raise ClusterError(f"the dashboard at {link.where} answered HTTP {e.code} to /api/version")
    except (OSError, ValueError, http.client.HTTPException) as e:  # refused, reset (nothing listens behind the tunnel), timeout, not JSON
        why = getattr(e, "reason", None) or e
        raise ClusterError(f"the Ray dashboard at {link.where} is not answering: {str(why)[:200] or type(e).__name__}",
                           "is the cluster up? check with `verl-cluster status -c CLUSTER.yaml`")


def _open(spec: ClusterSpec) -> tuple[JobsApi, contextlib.ExitStack]:
    headers = auth_headers(spec)
    stack = contextlib.ExitStack()
    try:
        link = open_dashboard(spec, stack)
        url, where = link.url, link.where
        try:
            client = client_class()(url, headers=dict(headers))
        except _api_errors() as e:
            raise _explain(e, where) from e
    except BaseException:
        stack.close()
        raise
    return JobsApi(client, where, url, headers, spec, stack, link.runner), stack


def submit(api: JobsApi, req: RayJobRequest) -> str:
    return api.call(api.client.submit_job, entrypoint=req.entrypoint, submission_id=req.submission_id,
                    runtime_env=req.runtime_env, metadata=req.metadata)


@dataclass(frozen=True)
class JobRow:
    submission_id: str
    status: str
    entrypoint: str
    start_time: Optional[float]
    end_time: Optional[float]
    message: str
    job_name: str
    run: str = ""  # the first submission of a watched run (`watch` resubmits under new ids)
    previous: str = ""  # the submission this one resumed
    ray_job_id: str = ""  # the driver's Ray job id (hex) once it connected: its workers carry it
    plan: str = ""  # what the plan assumed and predicted (submit/integrations.plan_metadata), JSON

    @property
    def duration_s(self) -> Optional[float]:
        if not self.start_time:
            return None
        end = self.end_time or time.time() * 1000
        return (end - self.start_time) / 1000


def _row(d: Any) -> JobRow:
    meta = d.metadata or {}
    return JobRow(d.submission_id or d.job_id or "?", str(getattr(d.status, "value", d.status)), d.entrypoint or "",
                  d.start_time, d.end_time, (d.message or "").strip(), meta.get("verl_cluster.job", ""),
                  meta.get("verl_cluster.run", ""), meta.get("verl_cluster.previous", ""),
                  d.job_id if d.submission_id else "", meta.get("verl_cluster.plan", ""))


def state_list(api: JobsApi, resource: str, filters: tuple[tuple[str, str], ...] = (), limit: int = 10000,
               timeout_s: float = 30.0) -> list[dict]:
    """Rows of Ray's State API (`actors`, `placement_groups`, ...) from the dashboard the Jobs API is on, through
    the same link and token; `filters`: (key, value) pairs that must be equal."""
    import urllib.parse
    import urllib.request

    q = [("limit", str(limit)), ("detail", "1")]
    for k, v in filters:
        q += [("filter_keys", k), ("filter_predicates", "="), ("filter_values", v)]
    url = f"{api.url}/api/v0/{resource}?{urllib.parse.urlencode(q)}"
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=api.headers), timeout=timeout_s) as r:
            doc = json.loads(r.read() or b"{}")
    except (OSError, ValueError) as e:
        raise ClusterError(f"Ray's State API at {api.where} ({resource}): {str(e)[:200] or type(e).__name__}")
    data = doc.get("data") if isinstance(doc, dict) else None
    data = data.get("result") if isinstance(data, dict) else None
    rows = data.get("result") if isinstance(data, dict) else data
    if not isinstance(rows, list):
        raise ClusterError(f"Ray's State API at {api.where} answered {resource} without rows: {str(doc)[:200]}")
    return [r for r in rows if isinstance(r, dict)]  # a server's reply: a row is an object, or it is not a row


def list_jobs(api: JobsApi) -> list[JobRow]:
    rows = [_row(d) for d in api.call(api.client.list_jobs)]
    return sorted(rows, key=lambda r: r.start_time or 0, reverse=True)


def job_info(api: JobsApi, job_id: str) -> JobRow:
    return _row(api.call(api.client.get_job_info, job_id))


def logs(api: JobsApi, job_id: str) -> str:
    """The whole log in one string, as the Jobs SDK gives it: for small logs in scripts only; the product reads
    logs by byte ranges (verl_logs/job_log.py)."""
    return api.call(api.client.get_job_logs, job_id)


def stop(api: JobsApi, job_id: str, wait_s: float = 30.0) -> JobRow:
    api.call(api.client.stop_job, job_id)
    deadline = time.monotonic() + wait_s
    row = job_info(api, job_id)
    while row.status not in TERMINAL and time.monotonic() < deadline:
        time.sleep(0.5)
        row = job_info(api, job_id)
    return row


def wait_running(api: JobsApi, job_id: str, timeout_s: float = 120.0, poll_s: float = 0.05) -> str:
    """Poll until the job leaves PENDING; returns its status."""
    deadline = time.monotonic() + timeout_s
    while True:
        status = str(api.call(api.client.get_job_status, job_id).value)
        if status != "PENDING" or time.monotonic() > deadline:
            return status
        time.sleep(poll_s)
