"""A stand-in for the `/logs/<file>` route of Ray's dashboard agent (aiohttp's static route: HTTP Range, 206 with
Content-Range, 416 `bytes */SIZE` past the end, 401 without the token), serving logs the test grows, and recording
every request. The integration tests (tests/integration/test_log_scale.py) read the real agent the same way."""

from __future__ import annotations

import http.server
import re
import threading
import types


class AgentLogServer:
    def __init__(self, token: str = "tok"):
        self.token, self.logs, self.requests = token, {}, []  # requests: (path, Range header, status, bytes sent)
        self.lock = threading.Lock()
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def do_GET(self):
                rng = self.headers.get("Range", "")
                status, body, hdrs = server.answer(self.path, rng, self.headers.get("Authorization", ""))
                with server.lock:
                    server.requests.append((self.path, rng, status, len(body)))
                self.send_response(status)
                for k, v in hdrs.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.httpd.server_address[1]
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def answer(self, path: str, rng: str, auth: str):
        if auth != f"Bearer {self.token}":
            return 401, b"401: Unauthorized", {}
        with self.lock:
            data = self.logs.get(path.rpartition("/")[2])
            data = bytes(data) if data is not None else None
        if data is None:
            return 404, b"404: Not Found", {}
        size = len(data)
        m = re.fullmatch(r"bytes=(\d*)-(\d*)", rng)
        if not m:
            return 200, data, {}
        if m[1] == "":  # the last N bytes
            start, end = max(0, size - int(m[2])), size - 1
        else:
            start, end = int(m[1]), min(size - 1, int(m[2])) if m[2] else size - 1
        if start >= size or end < start:
            return 416, b"", {"Content-Range": f"bytes */{size}"}
        return 206, data[start:end + 1], {"Content-Range": f"bytes {start}-{end}/{size}"}

    def write(self, sid: str, text: str | bytes) -> None:
        with self.lock:
            self.logs.setdefault(f"job-driver-{sid}.log", bytearray()).extend(
                text.encode() if isinstance(text, str) else text)

    def size(self, sid: str) -> int:
        return len(self.logs.get(f"job-driver-{sid}.log", b""))

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


class FakeClient:
    """The Jobs API's answers a reader needs: the job's status and where its driver's agent is."""

    def __init__(self, server: AgentLogServer, status: str = "RUNNING", plan: str = ""):
        self.server, self.status, self.plan = server, status, plan

    def get_job_info(self, job_id):
        return types.SimpleNamespace(submission_id=job_id, job_id="02000000", status=self.status, entrypoint="",
                                     start_time=None, end_time=None, message="", metadata={"verl_cluster.plan": self.plan},
                                     driver_agent_http_address=f"http://127.0.0.1:{self.server.port}")

    def get_job_logs(self, job_id):
        raise AssertionError("the whole log was asked for")

    def tail_job_logs(self, job_id):
        raise AssertionError("the log was streamed from its start")


def fake_api(server: AgentLogServer, **kw):
    from verl_cluster.jobs.ray_jobs import JobsApi

    return JobsApi(FakeClient(server, **kw), "here", headers={"Authorization": f"Bearer {server.token}"})
