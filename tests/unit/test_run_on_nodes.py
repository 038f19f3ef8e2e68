"""The node script on every node goes through the one fan_out: a result per node in order, keyed by its ip; an
unreachable node is its RunnerError and never hides the others; a bug is raised, not reported as a node's error."""

import pytest

from verl_cluster.errors import RunnerError
from verl_cluster.nodes import agent as nodes


class FakeNode:
    def __init__(self, ip, answer):
        self.ip, self.answer, self.closed, self.asked = ip, answer, False, None

    def script(self, verb, *args, timeout):
        self.asked = (verb, args, timeout)
        if isinstance(self.answer, BaseException):
            raise self.answer
        return self.answer

    def close(self):
        self.closed = True


def test_every_node_answers_or_says_why(monkeypatch):
    fleet = [FakeNode("10.0.0.1", {"faults": []}), FakeNode("10.0.0.2", RunnerError("10.0.0.2", "connection refused")),
             FakeNode("10.0.0.3", {"faults": ["GPU 0: x"]})]
    monkeypatch.setattr(nodes, "cluster_nodes", lambda spec: fleet)
    out = nodes.run_on_nodes(None, "gpuhealth", lambda n: ("0", n.ip), timeout=5)
    assert [r.host for r in out] == ["10.0.0.1", "10.0.0.2", "10.0.0.3"]
    assert out[0].value == {"faults": []} and out[2].value == {"faults": ["GPU 0: x"]}
    assert not out[1].ok and out[1].reason == "connection refused"
    assert all(n.closed for n in fleet) and fleet[2].asked == ("gpuhealth", ("0", "10.0.0.3"), 5)


def test_a_bug_is_raised_not_reported_as_a_node(monkeypatch):
    fleet = [FakeNode("10.0.0.1", {"ok": 1}), FakeNode("10.0.0.2", KeyError("left"))]
    monkeypatch.setattr(nodes, "cluster_nodes", lambda spec: fleet)
    with pytest.raises(KeyError):
        nodes.run_on_nodes(None, "jobprocs", lambda n: (), timeout=5)
    assert all(n.closed for n in fleet)
