"""`up` after it started a worker again under a running head waits (bounded) for the GCS to mark the node's old
registration dead (lifecycle/up.py _Up.settle): until then a job submitted next may land on the dead one. The GCS
tables are the node script's `gcs` rows (the shape tests/integration/test_lifecycle.py reads for real)."""

from verl_cluster.errors import RunnerError
from verl_cluster.lifecycle.up import NodeAction, NodeOutcome, _Up


class Head:
    def __init__(self, tables):
        self.tables, self.calls, self.host = list(tables), 0, "h"

    def gcs(self, token_path=None):
        self.calls += 1
        t = self.tables.pop(0) if len(self.tables) > 1 else self.tables[0]
        if isinstance(t, Exception):
            raise t
        return {"nodes": t}


def job(head, head_action=NodeAction.KEPT, w1=NodeAction.RESTARTED):
    j = object.__new__(_Up)
    j.nodes, j.token, j.probes, said = [head], None, {}, []
    j.say = lambda host, msg: said.append((host, msg))
    j.out = {"h": NodeOutcome("h", "head", "10.0.0.1", head_action), "w1": NodeOutcome("w1", "worker", "10.0.0.2", w1),
             "w2": NodeOutcome("w2", "worker", "10.0.0.3", NodeAction.KEPT)}
    j.said = said
    return j


def row(ip, alive=True):
    return {"ip": ip, "alive": alive, "node_id": ip + ("a" if alive else "d")}


def test_waits_until_the_old_registration_is_dead_saying_so_once():
    twice = [row("10.0.0.1"), row("10.0.0.2"), row("10.0.0.2"), row("10.0.0.3")]
    once = [row("10.0.0.1"), row("10.0.0.2"), row("10.0.0.2", alive=False), row("10.0.0.3")]
    head = Head([twice, twice, once])
    j = job(head)
    j.settle(limit_s=30, poll_s=0)
    assert head.calls == 3 and j.said == [("w1", "waiting for the GCS to mark its old registration dead")]
    assert j.out["w1"].reason == ""


def test_past_the_bound_the_node_says_a_job_may_land_on_the_old_one():
    head = Head([[row("10.0.0.2"), row("10.0.0.2")]])
    j = job(head)
    j.settle(limit_s=0.05, poll_s=0.01)
    assert "still lists its old registration alive after 0s" in j.out["w1"].reason
    assert "a job submitted now may land there" in j.out["w1"].reason


def test_nothing_to_wait_for_with_a_new_head_no_restarted_worker_or_no_gcs_answer():
    twice = [row("10.0.0.2"), row("10.0.0.2")]
    for j in (job(Head([twice]), head_action=NodeAction.RESTARTED), job(Head([twice]), w1=NodeAction.KEPT)):
        j.settle(limit_s=0.05, poll_s=0.01)
        assert j.nodes[0].calls == 0 and j.out["w1"].reason == ""
    j = job(Head([RunnerError("h", "gcs", "no answer")]))
    j.settle(limit_s=0.05, poll_s=0.01)
    assert j.out["w1"].reason == ""
