"""The hang bundle and the run folder are made to be attached to bug reports: no environment value of the job in
them (Ray's State API returns each actor's runtime_env, secrets included), and only their owner can read them,
whatever the umask and with `auth: none` too."""

import http.server
import json
import os
import stat
import threading
from pathlib import Path

import pytest

from verl_cluster.config.cluster import load_cluster
from verl_cluster.jobs.ray_jobs import JobsApi
from verl_cluster.watch import bundle
from verl_cluster.watch.events import Event, Note, Reporter
from verl_cluster.watch.runs import RunLock, RunState

# Ray 2.60's /api/v0/actors?detail=1 for a job started with runtime_env env_vars HF_TOKEN, and an actor with its own
# WANDB_API_KEY and PLAIN (recorded from a real local Ray, auth off)
RECORDED = Path(__file__).resolve().parents[1] / "fixtures/state_api/actors_env_vars_ray2.60.json"
VALUES = ("hf_RecordedSecret0000", "wandb-recorded-secret", "visible")


@pytest.fixture(autouse=True)
def _home(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    old = os.umask(0o022)  # the usual umask: what is not made private explicitly comes out 0644/0755
    yield
    os.umask(old)


@pytest.fixture
def state_api():
    """The recorded reply, served over HTTP as the dashboard serves it."""
    body = RECORDED.read_bytes()

    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a):
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield JobsApi(None, "recorded", f"http://127.0.0.1:{srv.server_address[1]}")
    srv.shutdown()
    srv.server_close()


def modes(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): oct(stat.S_IMODE(p.stat().st_mode)) for p in [root, *root.rglob("*")]}


def cluster(tmp_path: Path):
    p = tmp_path / "c.yaml"
    p.write_text("cluster_name: open\nhead: {host: localhost}\nsecurity: {auth: none}\n")
    return load_cluster(p)


def test_bundle_keeps_env_names_not_values_and_is_private(tmp_path, state_api):
    spec = cluster(tmp_path)
    st = RunState("sid-1", "open", str(tmp_path / "c.yaml"), attempts=[{"submission_id": "sid-1"}])
    b = bundle.collect(spec, state_api, "sid-1", "01000000", st.dir / "bundle-sid-1")
    text = "".join(p.read_text() for p in b.folder.iterdir())
    for v in VALUES:
        assert v not in text
    actors = json.loads((b.folder / "actors.json").read_text())
    env = json.loads(actors[0]["serialized_runtime_env"])["env_vars"]
    assert sorted(env) == ["HF_TOKEN", "PLAIN", "WANDB_API_KEY"] and set(env.values()) == {"***"}
    assert actors[0]["class_name"] == "WorkerDict" and actors[0]["pid"]  # the rest of the row as Ray gave it
    found = modes(Path(os.environ["HOME"]) / ".verl-cluster")
    assert {m for p, m in found.items() if (Path(os.environ["HOME"]) / ".verl-cluster" / p).is_dir()} == {"0o700"}
    assert {m for p, m in found.items() if (Path(os.environ["HOME"]) / ".verl-cluster" / p).is_file()} == {"0o600"}


def test_scrub_strips_env_values_however_deep_and_in_json_strings():
    row = {"runtime_env": {"env_vars": {"A": "1"}, "working_dir": "gcs://x.zip"}, "job": {"env_vars": {"B": "2"}},
           "serialized_runtime_env": json.dumps({"env_vars": {"HF_TOKEN": "t"}, "pip": ["x"]}),
           "message": "connect postgres://u:hunter2@db/x", "WANDB_API_KEY": "k", "rows": [{"env_vars": {"C": "3"}}]}
    out = bundle.scrub(row)
    assert out["runtime_env"] == {"env_vars": {"A": "***"}, "working_dir": "gcs://x.zip"}
    assert out["job"]["env_vars"] == {"B": "***"} and out["rows"][0]["env_vars"] == {"C": "***"}
    assert json.loads(out["serialized_runtime_env"]) == {"env_vars": {"HF_TOKEN": "***"}, "pip": ["x"]}
    assert out["message"] == "connect postgres://***@db/x" and out["WANDB_API_KEY"] == "***"
    assert bundle.scrub(["x", 1, None, "{not json"]) == ["x", 1, None, "{not json"]


def test_run_folder_files_are_private_with_auth_none(tmp_path):
    st = RunState("sid-2", "open", str(tmp_path / "c.yaml"), attempts=[{"submission_id": "sid-2"}])
    st.dir.mkdir(parents=True)  # a folder an older version made 0755, with a 0644 run.json in it
    os.chmod(st.dir, 0o755)
    (st.dir / "run.json").write_text("{}")
    os.chmod(st.dir / "run.json", 0o644)
    st.save()
    lock = RunLock(st).acquire()
    try:
        Reporter(st.dir / "events.jsonl", say=lambda _: None).emit(Event("sid-2", "sid-2", Note.INFO, "watching"))
    finally:
        lock.release()
    found = modes(st.dir)
    assert found == {".": "0o700", "run.json": "0o600", "watch.lock": "0o600", "events.jsonl": "0o600"}, found
    root = Path(os.environ["HOME"]) / ".verl-cluster"
    assert all(modes(root)[str(p.relative_to(root))] == "0o700" for p in [root, *st.dir.parents] if root in
               [p, *p.parents])


def test_detached_watcher_log_is_private(tmp_path):
    from verl_cluster.cli.watch_cmd import _detach

    st = RunState("sid-3", "open", str(tmp_path / "missing.yaml"), attempts=[{"submission_id": "sid-3"}])
    _detach(st, as_json=True)  # the watcher fails at once (no cluster file): its log is still written
    assert oct(stat.S_IMODE((st.dir / "watcher.log").stat().st_mode)) == "0o600"
    assert oct(stat.S_IMODE(st.dir.stat().st_mode)) == "0o700"
