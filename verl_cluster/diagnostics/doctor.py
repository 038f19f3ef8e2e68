"""`doctor`: this machine only, no config. Facts (in-process) + the node verdicts, and what is missing."""

from __future__ import annotations

from dataclasses import dataclass, field

from verl_cluster.diagnostics import ray_versions
from verl_cluster.diagnostics.gather import local_facts
from verl_cluster.diagnostics.verdicts import ERROR, WARNING, Problem, node_verdicts
from verl_cluster.facts.model import NodeFacts, to_dict


@dataclass(frozen=True)
class DoctorReport:
    facts: NodeFacts
    problems: list[Problem] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not any(p.severity == ERROR for p in self.problems)

    def to_json(self) -> dict:
        return {"ok": self.ok, "problems": [p.to_json() for p in self.problems], "facts": to_dict(self.facts)}


def missing_tools(f: NodeFacts) -> list[Problem]:
    """Tools `check` uses on nodes; absent ones only weaken what it can say."""
    out = []
    if not f.ucx_version:
        out.append(Problem(f.host, "ucx_info not found: UCX transports cannot be listed or tested",
                           "apt install ucx-utils (only matters for backend ucx)", WARNING))
    if "ray" not in f.versions:
        out.append(Problem(f.host, "ray is not installed in this Python: it cannot be a cluster node",
                           f"pip install '{ray_versions.PIN}'", WARNING))
    return out + ray_versions.range_verdicts({f.host: f.versions.get("ray")}, token_auth=True)


def diagnose(facts: NodeFacts) -> DoctorReport:
    """Verdicts for given facts (recorded ones replay here)."""
    problems = node_verdicts(facts) + missing_tools(facts)
    problems.sort(key=lambda p: p.severity != ERROR)
    return DoctorReport(facts, problems)


def run_doctor(deep: bool = True) -> DoctorReport:
    return diagnose(local_facts(deep=deep))
