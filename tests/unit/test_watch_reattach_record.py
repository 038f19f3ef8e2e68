"""A watcher that stopped its attempt itself (a lost node, a hang) and died before it resubmitted: the next one
must not read the job's STOPPED as someone else's stop. Seen on real verl across two namespace hosts
(docs/BENCHMARKS.md, "verl across a node boundary"): the watcher was restarted while it waited for a lost node, and the
new one said "stopped watching: the job was stopped by someone else" and ended the run."""

from tests.unit.test_watch_loop import _watcher
from verl_cluster.watch.watcher import Outcome
from verl_cluster.watch.progress import read_progress
from tests.unit.test_watch_loop import RESUMED


def _lost_on_record(st):
    st.attempts[-1].update(status="LOST", ended_at=1.0, first_step=1, last_step=2, checkpoint=2, steps=2,
                           ray_job_id="02000000", node="10.0.0.2", evidence="the GCS marks this node dead",
                           signature="node-lost:the GCS marks this node dead", steps_lost=0, **{"class": "node-lost"})
    st.save()


def test_a_new_watcher_goes_on_from_the_recorded_end(tmp_path, monkeypatch):
    # after the resubmission the next attempt succeeds; the stopped attempt itself is never watched again
    w, st = _watcher(tmp_path, monkeypatch, [Outcome("SUCCEEDED", progress=read_progress(RESUMED))])
    _lost_on_record(st)
    assert w.run() == 0
    a, b = st.attempts
    assert a["status"] == "LOST" and a["class"] == "node-lost"  # the record stays as the first watcher wrote it
    assert b["status"] == "SUCCEEDED" and st.restarts == 1 and st.state == "succeeded"
    events = (st.dir / "events.jsonl").read_text()
    assert "going on from the record" in events and "stopped by someone else" not in events


def test_a_stop_by_someone_else_is_still_one(tmp_path, monkeypatch):
    w, st = _watcher(tmp_path, monkeypatch, [Outcome("STOPPED")])  # nothing recorded: the job's own status counts
    assert w.run() == 1 and st.state == "stopped" and st.restarts == 0
