"""Batch R on one H100 (2026-12-07): the product's collector freeze (now the default, python_gc: auto) against the
collector as verl leaves it, on the recorded runs (tests/fixtures/verl_runs/grid2_ab, grid2_gc/R.json)."""

import json
import statistics
from pathlib import Path

from tests.harness.scripts import load_script

ROOT = Path(__file__).resolve().parents[2]
AB = ROOT / "tests/fixtures/verl_runs/grid2_ab"
gc_pauses = load_script("scripts/calibration/gc_pauses.py")


def run(side):
    return json.loads((AB / f"grid2-g1ppo-m32-{side}.json").read_text())


def timed(rec):
    return [v for k, v in rec["steps"].items() if int(k) >= 3]  # grid2.FIRST_STEPS: steps 3-12


def median(rec, key):
    return statistics.median(s[f"timing_s/{key}"] for s in timed(rec))


def worker_pauses_a_step(rec):
    """The pauses of 50 ms+ in verl's own workers (the driver's TaskRunner, the FSDP WorkerDicts), a timed step."""
    rows = json.loads((ROOT / "tests/fixtures/verl_runs/grid2_gc/R.json").read_text())["pauses"]
    steps = {s: ps for s, ps in gc_pauses.by_step(rows, rec["step_seen_t"]).items() if s >= 3}
    return sum(p["s"] for ps in steps.values() for p in ps
               if "WorkerDict" in p["title"] or "TaskRunner" in p["title"]) / len(steps)


def test_the_freeze_took_the_workers_pauses_and_nothing_else():
    """def-a then frz-a on one GPU, one after the other: the workers' pauses 0.38 s a step -> none; every phase's
    median within 4%; the frozen step shorter by about the pauses it lost."""
    d, f = run("def-a"), run("frz-a")
    assert not d["gc_freeze"] and d["submit_flags"] == [] and f["submit_flags"] == ["--gc-freeze"]
    assert 0.3 < worker_pauses_a_step(d) < 0.45 and worker_pauses_a_step(f) < 0.02
    assert worker_pauses_a_step(run("frz-b")) < 0.02
    for phase in ("update_actor", "old_log_prob", "update_critic", "values", "gen"):
        assert abs(median(f, phase) / median(d, phase) - 1) < 0.04, phase
    saved = median(d, "step") - median(f, "step")
    assert 0.2 < saved < 0.45 and saved / median(d, "step") < 0.05  # 0.31 s of 8.97: -3.5%


def test_frozen_host_memory_stays_flat():
    """gc.freeze keeps what it froze for good: over 12 steps neither frozen side's host RAM grew more than the
    default's did."""
    def growth(rec):
        mem = [rec["steps"][k]["actor/perf/cpu_memory_used_gb"] for k in sorted(rec["steps"], key=int)]
        return mem[-1] - mem[1]
    assert max(growth(run("frz-a")), growth(run("frz-b"))) <= growth(run("def-a")) < 0.4


def test_the_host_sped_up_under_the_third_run_not_the_freeze():
    """frz-b, the same line as frz-a, ran 1.4 s a step faster: its generate waited one of verl's 2 s polls where the
    first two waited two, and the host's Python probe read 30 ms at its end against 50 and 70 ms at theirs. The ABBA's
    def-b did not fit the session; without it the pair above is the A/B."""
    a, b = run("frz-a"), run("frz-b")
    assert round(median(a, "gen") / 2) == 2 and round(median(b, "gen") / 2) == 1
    assert median(a, "step") - median(b, "step") > 1.5
    probe = {s: run(s)["host_cpu"]["host_python_ms"] for s in ("def-a", "frz-a", "frz-b")}
    assert probe["frz-b"] < 35 < 45 < min(probe["def-a"], probe["frz-a"])
    assert not (AB / "grid2-g1ppo-m32-def-b.json").exists()
