#!/usr/bin/env python3
"""Turn the predicted vs measured pairs of `verl-cluster jobs --json` into factors for `verl-cluster plan --factors`.

Each figure (a phase's seconds, the step, the checkpoint save, host RAM per node) gets the geometric mean of
measured / predicted over the jobs that have it, with the count and the spread (min..max); host_factor the
geometric mean of the host factors (`vs_plan_host`) that explained their jobs: the host's speed against the plan's,
which carries over to other jobs on the same machines where a phase's factor does not. A figure from fewer
than 2 runs is shown but marked as not enough, and `plan --factors` does not apply it.

  verl-cluster jobs --json > jobs.json
  python scripts/plan_factors.py jobs.json other.json --out factors.json
  verl-cluster jobs --json | python scripts/plan_factors.py - --json
  verl-cluster plan JOB.yaml --factors factors.json

Reads what `jobs --json` prints, with -c or without: {"clusters": [{"cluster": ..., "jobs": [...]}, ...]} (a bare
list of jobs, what `jobs -c X --json` printed before, is read too). A job listed in two documents counts once.
Exit 0, 2 for unreadable input.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from verl_cluster.placement.factors import MIN_RUNS, compute  # noqa: E402


class InputError(Exception):
    pass


def jobs_of(doc, name: str) -> list[dict]:
    """The job objects of one `jobs --json` document."""
    if isinstance(doc, dict) and isinstance(doc.get("clusters"), list):
        jobs = []
        for i, c in enumerate(doc["clusters"]):
            if not isinstance(c, dict):
                raise InputError(f"{name}: clusters[{i}] is not an object")
            got = c.get("jobs") or []
            if not isinstance(got, list):
                raise InputError(f"{name}: clusters[{i}].jobs is not a list")
            jobs += [{**j, "_cluster": c.get("cluster", "")} for j in got if isinstance(j, dict)]
        return jobs
    if isinstance(doc, list):  # an older `jobs -c X --json`
        return [j for j in doc if isinstance(j, dict)]
    if isinstance(doc, dict) and isinstance(doc.get("error"), dict):
        raise InputError(f"{name}: `jobs --json` failed: {doc['error'].get('message')}")
    raise InputError(f"{name}: not `verl-cluster jobs --json` output (an object with `clusters`)")


def read_doc(name: str):
    try:
        text = sys.stdin.read() if name == "-" else Path(name).read_text()
    except OSError as e:
        raise InputError(f"{name}: cannot read: {e.strerror or e}")
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise InputError(f"{name}: invalid JSON: {e.msg} (line {e.lineno})")


def runs_of(names: list[str]) -> tuple[list[list[dict]], list[dict]]:
    """Each job's vs_plan rows and its host fit (vs_plan_host, {} without), a job once however many documents list
    it."""
    seen, runs, hosts = set(), [], []
    for name in names:
        for j in jobs_of(read_doc(name), "stdin" if name == "-" else name):
            rows = j.get("vs_plan")
            if not isinstance(rows, list) or not rows:
                continue
            key = (j.get("_cluster", ""), j.get("submission_id"), j.get("start_time"))
            if key not in seen:
                seen.add(key)
                runs.append([r for r in rows if isinstance(r, dict)])
                host = j.get("vs_plan_host")
                hosts.append(host if isinstance(host, dict) else {})
    return runs, hosts


def table(factors: dict, runs: int) -> str:
    lines = [f"{'figure':<20} {'factor':>7} {'runs':>5}  spread", "-" * 56]
    for name, f in factors.items():
        mark = "" if f["enough"] else f"  not enough (fewer than {MIN_RUNS} runs)"
        lines.append(f"{name:<20} {f['factor']:>7.3f} {f['runs']:>5}  {f['min']:.3f}..{f['max']:.3f}{mark}")
    lines.append(f"from {runs} job(s) with predicted vs measured pairs; factor = measured / predicted "
                 "(geometric mean); host_factor: the factor on the plan's host terms of the jobs it explained, which "
                 "`plan --factors` applies in place of the phases' own")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("docs", nargs="+", metavar="FILE", help="`verl-cluster jobs --json` output; - for stdin")
    ap.add_argument("--json", action="store_true", help="print the factors file's JSON")
    ap.add_argument("--out", metavar="FILE", help="write the factors file (for `verl-cluster plan --factors`)")
    a = ap.parse_args(argv)
    try:
        runs, hosts = runs_of(a.docs)
    except InputError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    factors = compute(runs, hosts=hosts)
    doc = {"factors": factors, "runs": len(runs), "min_runs": MIN_RUNS, "from": a.docs}
    if a.out:
        try:
            Path(a.out).write_text(json.dumps(doc, indent=1) + "\n")
        except OSError as e:
            print(f"error: --out {a.out}: cannot write: {e.strerror or e}", file=sys.stderr)
            return 2
    if a.json:
        print(json.dumps(doc, indent=1))
    else:
        print(table(factors, len(runs)) if factors else "no job with predicted vs measured pairs in the input")
        if a.out:
            print(f"wrote {a.out}: use it with `verl-cluster plan JOB --factors {a.out}`")
    return 0


if __name__ == "__main__":
    sys.exit(main())
