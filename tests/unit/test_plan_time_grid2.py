"""Issue 33's second grid as recorded on the device (tests/fixtures/verl_runs/grid2_results/): each measured run held
against the prediction round committed before it started (grid2.report; docs/BENCHMARKS.md, "The second grid's
first held-out runs"). The held-out runs are the ones the target counts: step ±20%, phases over half a second ±30%,
at least 6 runs in 3 families, 2 on 2 GPUs."""

import json
import sys
from pathlib import Path

import pytest


ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts" / "calibration"))

import grid2  # noqa: E402

from tests.harness.scripts import load_script  # noqa: E402
from verl_cluster.placement import step_time  # noqa: E402

RESULTS = sorted((ROOT / "tests/fixtures/verl_runs/grid2_results").glob("grid2-*.json"))


def recorded() -> dict:
    rounds = json.loads(grid2.PREDICTIONS.read_text())["rounds"]
    return grid2.report([json.loads(p.read_text()) for p in RESULTS], rounds)


def replays(names) -> dict:
    """host_factor.py's replays of the recorded runs NAMES (their grid2_runs.json entries)."""
    figures = json.loads((ROOT / "tests/fixtures/verl_runs/grid2_runs.json").read_text())["runs"]
    return load_script("scripts/calibration/host_factor.py").unbound_replays(figures={n: figures[n] for n in names},
                                                                              runs={})


def repeat_and_first(rep: dict, name: str, commit: str) -> tuple[dict, dict]:
    """A run again on another machine and its first, from the report REP: the same line, held out and judged blind
    against round COMMIT (recorded before it ran, nothing newer before its start)."""
    by = {r["run"]: r for r in rep["runs"]}
    run = grid2.BY_NAME[name]
    r, first = by[name], by[run.repeat_of]
    assert run.line() == grid2.BY_NAME[run.repeat_of].line()
    assert r["role"] == "hold-out" and r["blind"] and r["commit"][:7] == commit and not r["newer_rounds_before_run"]
    return r, first


LOOKED_AT = {"g2pad-m8", "g2fa-m8", "g2ppo-m8", "g2fa-m32"}  # held out when they ran, fitted on since (FITTED_ON)
HELD_OUT = {"g2ppo-m32", "g2fa-m2", "g2pad-m2", "g2ppo-m2", "g2off-m8", "g2off-m32"}  # held out from the first refit
HELD_OUT_Q = {"g2ppo-m32-gc", "g2off-m32-gc"}  # batch Q's watched runs, 15 steps, against round a7fd5e1
HELD_OUT_T = {"g1pad-m16", "g1fa-m16", "g1ppo-m16"}  # batch T on one H200, 2026-12-02 (two sessions), round 3278625
HELD_OUT_U = {"g1fa15b-m8", "g1fa3b-m8"}  # batch U on one H200, 2026-12-02 (third session), round 3278625
HELD_OUT_V = {"g1pad15b-m8", "g1fa-m4", "g1ppo15b-m8"}  # batch V on one H100, 2026-12-07, round 2173f09
HELD_OUT_W = {"g1fa15b-m4", "g1ppo-m4"}  # batch W on one H100, 2026-12-07 (sixth session), round 9614583
# W's last run and X's first (W's PPO run again), both on a second H100 (seventh session), against the same round
HELD_OUT_WX = {"g1pad-m4", "g1ppo-m4-b"}
HELD_OUT_X2 = {"g1fa15b-m4-b"}  # X's second: W's 1.5B again, on a third H100 (eighth session), the same round
HELD_OUT_Y = {"g1fa-m4-b"}  # Y: V's micro 4 run again, on another H100 (2026-12-08), round 5970744
# Every figure below is at the steps the model predicts, 3 on (grid2.FIRST_STEPS, since the refit of 2026-11-29);
# docs/BENCHMARKS.md keeps them as they were first reported, at steps 2 on.


def full_collection_in(pauses: list[dict], method: str) -> bool:
    """A full collection of 0.45 s or more in the Ray worker running METHOD (its process title names it)."""
    return any(p["s"] >= 0.45 and p["gen"] == 2 and method in p["title"] for p in pauses)


def test_every_recorded_run_was_predicted_before_it_ran():
    rep = recorded()
    assert {r["run"] for r in rep["runs"]} == ({"g1pad-m8", "g1fa-m8", "g1ppo-m8", "g1fa-m2"} | HELD_OUT | HELD_OUT_Q
                                               | LOOKED_AT | HELD_OUT_T | HELD_OUT_U | HELD_OUT_V | HELD_OUT_W
                                               | HELD_OUT_WX | HELD_OUT_X2 | HELD_OUT_Y)
    assert all(r["blind"] for r in rep["runs"])  # a round dated before its start: predicted first
    was_held = [r for r in rep["runs"] if r["run"] in LOOKED_AT]
    # predicted at the model of the first refit (round dea32d7), before any of them ran; fitted on after the look
    assert {r["commit"][:7] for r in was_held} == {"dea32d7"} and all(not r["newer_rounds_before_run"] for r in was_held)
    # the second refit took every run held out from the first (each looked at): all fit now, the target starts again
    assert {n for n, why in grid2.FITTED_ON.items() if why == grid2.REFIT_1} == LOOKED_AT
    assert {n for n, why in grid2.FITTED_ON.items() if why == grid2.REFIT_2} == HELD_OUT | HELD_OUT_Q
    assert {r["run"] for r in rep["runs"] if r["role"] != "fit"} == (HELD_OUT_T | HELD_OUT_U | HELD_OUT_V | HELD_OUT_W
                                                                     | HELD_OUT_WX | HELD_OUT_X2 | HELD_OUT_Y)


def test_the_runs_held_out_at_micro_8_met_the_target_when_they_ran():
    """2 H200 of one node, micro 8 / log-prob 16, against round dea32d7: padded +0.9%, packed +6.0%, PPO -2.1%;
    every phase over half a second within ±30% (worst: gen +23.6%, one poll of verl's replay buffer where the model
    adds the average wait; the critic's update -27.7%)."""
    by = {r["run"]: r for r in recorded()["runs"]}
    for name in ("g2pad-m8", "g2fa-m8", "g2ppo-m8"):
        r = by[name]
        assert r["meets_target"] and abs(r["step_error"]) <= 0.20, r
        assert all(p["ok"] for p in r["phases"] if p["held"]), r["phases"]


def test_the_run_at_micro_32_missed_and_the_refits_took_every_run_looked_at():
    """g2fa-m32 (one micro batch a mini batch): the actor's update took 0.83 s where round dea32d7 said 1.60 (+92%),
    the step +34.7% (steps 2 on). The refit that followed (batch P) took the four looked-at runs, the second (steps 3
    on, verl's poll in whole periods) every run held out from the first. Held out now: H (4 GPUs, three families no
    run had) and S (2 GPUs: PPO with the actor offloaded, a family never fitted; micro 16 packed and PPO), each
    predicted by a round after the second refit before it runs (T and U ran), and V (1 GPU: the critic and the
    padded pass at 28 layers, packed at micro 4), predicted by the round after the third; V ran, and W (1 GPU, micro 4
    in the critic's and padded families and at 28 layers) is predicted by the round after batch R; W ran, and X repeats
    its runs on other machines; Y repeats V's two misses, predicted again by a round recorded before it."""
    rep = recorded()
    r = {r["run"]: r for r in rep["runs"]}["g2fa-m32"]
    worst = max((p for p in r["phases"] if p["held"]), key=lambda p: abs(p["error"]))
    assert not r["meets_target"] and r["step_error"] > 0.20 and worst["phase"] == "update_actor"
    ran = {r["run"] for r in rep["runs"]}
    upcoming = [r for r in grid2.RUNS if grid2.run_role(r) == "hold-out" and not r.diagnosis and r.name not in ran]
    assert {r.batch for r in upcoming} == {"H", "S", "Y"} and len(upcoming) == 7  # Y's PPO run did not fit its session
    envelope = json.loads((ROOT / "verl_cluster/catalog/step_time_envelope.json").read_text())["runs"]
    fit_axes = [r["axes"] for r in envelope if r["role"] == "fit"]  # both grids' fit runs, as the model saw them
    fitted = {f.name for f in grid2.FAMILIES if any(f.matches(a) for a in fit_axes)}
    assert {r.family for r in upcoming} - fitted == {"2gpu-ppo-offload", "4gpu-packed", "4gpu-padded", "4gpu-ppo"}
    assert len({r.family for r in upcoming if r.batch == "S"}) == 3 and all(r.steps >= 8 for r in upcoming
                                                                           if r.batch == "S")
    assert all(r.gpus >= 2 for r in upcoming if not r.repeat_of)  # left: what the target's 2+ GPU families need


def test_the_first_run_held_out_from_the_refit():
    """g2ppo-m32 (PPO, micro 32 / 32, 2 H200), against round 4ac40f3: step +1.1%; the actor's update +0.9% and the
    critic's +3.0% (the two the refit changed); old_log_prob -31.1%: 1.12 s at step 5 against 0.51-0.52 at steps 3-4
    (what the model said, 0.49), so the run missed the phase bound. Fitted on since the second refit."""
    rep = recorded()
    r = {r["run"]: r for r in rep["runs"]}["g2ppo-m32"]
    assert r["role"] == "fit" and r["blind"] and r["commit"][:7] == "4ac40f3"
    assert abs(r["step_error"]) <= 0.05
    ph = {p["phase"]: p for p in r["phases"] if p["held"]}
    assert abs(ph["update_actor"]["error"]) <= 0.05 and abs(ph["update_critic"]["error"]) <= 0.05
    assert ph["old_log_prob"]["error"] < -0.30 and not r["meets_target"]
    steps = json.loads((ROOT / "tests/fixtures/verl_runs/grid2_results/grid2-g2ppo-m32.json").read_text())["steps"]
    assert [round(steps[k]["timing_s/old_log_prob"], 2) for k in "2345"] == [1.87, 0.52, 0.51, 1.12]
    # a phase that misses lists its timed steps: one slow step, not a slow phase
    assert "old_log_prob 0.49 / 0.71 (-31.1%; steps 0.52, 0.51, 1.12)" in grid2.markdown(rep)


def test_the_held_out_runs_after_the_first_refit():
    """Batches D, E and F on 4 H200 (two 2-GPU clusters side by side), 2026-11-28, against round cbc88fc, committed
    before they ran, and Q's two (a7fd5e1): every step within ±20% (-9.6 ... +14.5%), so the model held on micro 2,
    padded or packed, PPO and the offload family it was never fitted on. At steps 3 on (step 2's once-only
    recompile left out) 5 of the 8 met the target; the misses are a phase under 1.2 s each: g2ppo-m2's critic (values
    0.96 s at step 3 against 0.39-0.42), g2ppo-m32's and g2off-m32-gc's old_log_prob (a full collection's pause on one
    step of three, and a steady 0.6-0.7 s against 0.49-0.53). All eight are fit runs since the second refit: the
    target counts none of them."""
    rep = recorded()
    by = {r["run"]: r for r in rep["runs"]}
    held = HELD_OUT | HELD_OUT_Q
    assert all(by[n]["role"] == "fit" and by[n]["blind"] for n in held)
    assert {by[n]["commit"][:7] for n in HELD_OUT - {"g2ppo-m32"}} == {"cbc88fc"}
    assert all(abs(by[n]["step_error"]) <= 0.20 for n in held)
    assert {n for n in held if by[n]["meets_target"]} == {"g2fa-m2", "g2pad-m2", "g2off-m8", "g2off-m32",
                                                          "g2ppo-m32-gc"}
    ppo = {p["phase"]: p for p in by["g2ppo-m2"]["phases"] if p["held"]}
    assert ppo["values"]["error"] < -0.30 and ppo["update_critic"]["error"] < -0.30
    assert abs(ppo["update_actor"]["error"]) <= 0.05
    fams = {(f["family"], f["role"]): f for f in rep["families"]}
    assert fams[("2gpu-offload", "fit")]["runs"] == 3 and fams[("2gpu-packed", "fit")]["runs"] == 3


def test_batch_t_held_out_on_one_h200_the_step_held_and_the_log_prob_passes_ran_long():
    """Batch T (one H200, 2026-12-02), against round 3278625 committed before: the step held on both runs (padded
    -9.9%, packed -2.9%), the actor's update too (-3.2%, +4.7%), but the forward passes at log-prob micro 32 ran long:
    g1fa-m16's old_log_prob 0.92 s against 0.60 (-34.8%, every step 0.73-1.41 s), so that run misses the phase bound;
    g1pad-m16's -25.1% stays inside it. g1ppo-m16 ran in a later session (the first two lost it to an import and
    the budget): step +0.4%, the critic's phases within ±8%, old_log_prob -31.5% again (0.88 s against 0.60), so it
    misses the phase bound as g1fa-m16 does. Three held-out runs in three families the grid had fitted; seen since
    the refit of 2026-12-07 took its form from them (grid2.SEEN), still judged blind against the round before them."""
    rep = recorded()
    by = {r["run"]: r for r in rep["runs"]}
    assert all(by[n]["role"] == "seen" and by[n]["blind"] and by[n]["commit"][:7] == "3278625"
               and not by[n]["newer_rounds_before_run"] for n in HELD_OUT_T)
    pad, fa = by["g1pad-m16"], by["g1fa-m16"]
    assert pad["meets_target"] and abs(pad["step_error"]) <= 0.10
    assert not fa["meets_target"] and abs(fa["step_error"]) <= 0.05
    ph = {n: {p["phase"]: p for p in by[n]["phases"] if p["held"]} for n in HELD_OUT_T}
    assert all(abs(ph[n]["update_actor"]["error"]) <= 0.05 for n in ("g1pad-m16", "g1fa-m16"))
    assert all(abs(ph[n]["gen"]["error"]) <= 0.05 for n in ph)
    assert ph["g1fa-m16"]["old_log_prob"]["error"] < -0.30 and ph["g1fa-m16"]["ref"]["error"] < -0.25
    assert -0.30 < ph["g1pad-m16"]["old_log_prob"]["error"] < -0.20
    ppo = by["g1ppo-m16"]
    assert not ppo["meets_target"] and abs(ppo["step_error"]) <= 0.02
    assert -0.35 < ph["g1ppo-m16"]["old_log_prob"]["error"] < -0.30  # the same pass at log-prob 32, the same miss
    assert abs(ph["g1ppo-m16"]["update_critic"]["error"]) <= 0.05 and abs(ph["g1ppo-m16"]["values"]["error"]) <= 0.10
    assert 0.10 < ph["g1ppo-m16"]["update_actor"]["error"] < 0.20  # over-predicted here, under on g1pad: within 20%
    fams = {(f["family"], f["role"]): f for f in rep["families"]}
    assert fams[("1gpu-packed", "seen")]["runs"] == 1 and not fams[("1gpu-packed", "seen")]["meets_target"]
    assert fams[("1gpu-padded", "seen")]["meets_target"] and fams[("1gpu-padded", "fit")]["runs"] == 1
    held = {f[0] for f in fams if f[1] == "hold-out" and f[0].startswith("1gpu")}  # seen is not held out: V's and W's
    assert held == {"1gpu-padded", "1gpu-packed", "1gpu-ppo", "1gpu-deep"}
    assert {f: fams[(f, "hold-out")]["runs"] for f in held} == {"1gpu-padded": 2, "1gpu-packed": 2, "1gpu-ppo": 3,
                                                                  "1gpu-deep": 2}


def test_batch_u_held_out_deeper_shapes_the_step_and_update_held_the_log_prob_pass_ran_long_again():
    """Batch U (one H200, 2026-12-02, a third session), against round 3278625: the 1.5B (28 layers) and 3B (36
    layers) shapes at micro 8 / log-prob 16, packed flash-attn, GRPO — the depth no fit run of the second grid had
    (family 1gpu-deep: never fitted on). Step -3.9% and -7.2%, the actor's update +2.2% and +1.2%, gen within 2%;
    old_log_prob -32.0% and -33.1%, so neither run meets the phase bound. Two of each run's eight log-prob passes held
    a full collection of 0.63-0.69 s in the worker running them; without those steps the pass is -23% and -24%,
    inside the bound. And the pass barely grows with depth: 36 layers against 28 and twice the FLOPs cost it ~9 ms
    a micro batch, so it is host-bound on both, with ~1 ms a layer at most: a floor per micro batch, not per layer."""
    import gc_pauses

    rep = recorded()
    by = {r["run"]: r for r in rep["runs"]}
    assert all(by[n]["role"] == "seen" and by[n]["blind"] and by[n]["commit"][:7] == "3278625"
               and not by[n]["newer_rounds_before_run"] and by[n]["family"] == "1gpu-deep" for n in HELD_OUT_U)
    ph = {n: {p["phase"]: p for p in by[n]["phases"] if p["held"]} for n in HELD_OUT_U}
    for n in HELD_OUT_U:
        assert not by[n]["meets_target"] and -0.08 <= by[n]["step_error"] <= -0.03
        assert abs(ph[n]["update_actor"]["error"]) <= 0.03 and abs(ph[n]["gen"]["error"]) <= 0.02
        assert -0.34 < ph[n]["old_log_prob"]["error"] < -0.31 and not ph[n]["old_log_prob"]["ok"]
        assert ph[n]["ref"]["ok"]
    pauses = json.loads((ROOT / "tests/fixtures/verl_runs/grid2_gc/U.json").read_text())["pauses"]
    steady = {}
    for n in HELD_OUT_U:
        doc = json.loads((ROOT / f"tests/fixtures/verl_runs/grid2_results/grid2-{n}.json").read_text())
        windows = gc_pauses.by_step(pauses, doc["step_seen_t"])
        lp = {int(k): m["timing_s/old_log_prob"] for k, m in doc["steps"].items() if int(k) > max(grid2.FIRST_STEPS)}
        collected = {s for s in lp if full_collection_in(windows[s], "compute_log_prob")}
        med = sorted(lp.values())[len(lp) // 2]
        assert len(collected) == 2 and all(lp[s] - med > 0.5 for s in collected)  # each outlier holds a collection
        assert all(lp[s] - med < 0.25 for s in set(lp) - collected)  # and no other step is one
        rest = [v for s, v in lp.items() if s not in collected]
        steady[n] = sum(rest) / len(rest)
        assert -0.30 < ph[n]["old_log_prob"]["predicted"] / steady[n] - 1 < -0.20
    runs = {n: grid2.BY_NAME[n] for n in HELD_OUT_U}  # beyond the phase's fixed part, per log-prob micro batch
    fixed = 0.152  # FORWARD_FIXED_S of round 3278625, the model U was held against
    per_micro = {n: (steady[n] - fixed) / (r.sequences / r.log_prob) for n, r in runs.items()}
    assert 0 < per_micro["g1fa3b-m8"] - per_micro["g1fa15b-m8"] < 0.015 and 0.15 < per_micro["g1fa15b-m8"] < 0.17
    t = rep["target"]  # T and U seen since the refit of 2026-12-07: V's three, W's three, X's two and Y's are held out
    assert (t["held_out_runs"], t["held_out_runs_meeting"], t["held_out_families"]) == (9, 4, 4)
    # 1gpu-deep, W's g1fa15b-m4: no refit fitted on any of its runs (U's were seen); S and H are the 2+ GPU ones
    assert (t["held_out_families_on_2_gpus"], t["families_never_fitted"]) == (0, 1) and not t["met"]


def test_batch_v_held_out_on_one_h100_ran_faster_than_the_h200_hosts_the_model_was_fitted_on():
    """Batch V (one H100, 2026-12-07), against round 2173f09 (the fourth refit's), committed before it ran: every run
    over-predicted. The padded 1.5B held (+15.1%, the update +26.5%); packed at micro 4 (+51.7%) and the 1.5B PPO
    (+36.9%) missed, every phase of theirs over half a second over-predicted but the critic's. The same verl work ran
    faster on this host than on the one-GPU H200 hosts the grid was fitted on (the same CPU model by /proc/cpuinfo):
    an update's micro batch at 0.5B took 0.25 s where the H200 hosts took 0.39-0.42 s at micro 2 to 16 (flat in the
    micro batch: the host binds), and the 1.5B PPO run's generate was seen at verl's first poll (2 s) on 5 of its 6
    steps where every 0.5B run on one H200 waited two periods on nearly every step. The host is an axis the model
    does not see (docs/placement.md, "Batch V")."""
    rep = recorded()
    by = {r["run"]: r for r in rep["runs"]}
    assert all(by[n]["role"] == "hold-out" and by[n]["blind"] and by[n]["commit"][:7] == "2173f09"
               and not by[n]["newer_rounds_before_run"] and by[n]["card"].startswith("NVIDIA H100") for n in HELD_OUT_V)
    assert by["g1pad15b-m8"]["meets_target"] and 0.10 < by["g1pad15b-m8"]["step_error"] < 0.20
    assert 0.50 < by["g1fa-m4"]["step_error"] < 0.55 and 0.35 < by["g1ppo15b-m8"]["step_error"] < 0.40
    held = {n: {p["phase"]: p["error"] for p in by[n]["phases"] if p["held"]} for n in HELD_OUT_V}
    assert all(e > 0.30 for e in held["g1fa-m4"].values())
    assert all(e > 0.30 for k, e in held["g1ppo15b-m8"].items() if k not in ("values", "update_critic"))

    def steady(name: str, phase: str) -> list[float]:
        doc = json.loads((ROOT / f"tests/fixtures/verl_runs/grid2_results/grid2-{name}.json").read_text())
        return [m[f"timing_s/{phase}"] for k, m in doc["steps"].items() if int(k) > max(grid2.FIRST_STEPS)]

    def per_micro(name: str) -> float:
        run = grid2.BY_NAME[name]
        return sum(steady(name, "update_actor")) / len(steady(name, "update_actor")) / (run.sequences / run.micro)

    h200 = [per_micro(n) for n in ("g1fa-m2", "g1fa-m8", "g1fa-m16")]
    assert 0.38 < min(h200) and max(h200) < 0.43 and 0.24 < per_micro("g1fa-m4") < 0.26
    polls = {n: [round(g / step_time.GEN_POLL_S) for g in steady(n, "gen")] for n in
             ("g1ppo15b-m8", "g1fa-m2", "g1fa-m8", "g1fa-m16", "g1pad-m16", "g1ppo-m16")}
    assert polls["g1ppo15b-m8"].count(1) == 5 and len(polls["g1ppo15b-m8"]) == 6
    assert sum(p.count(1) for n, p in polls.items() if n != "g1ppo15b-m8") == 1  # of 28 steps on one H200
    cpus = {json.loads((ROOT / f"tests/fixtures/verl_runs/grid2_results/grid2-{n}.json").read_text())["host_cpu"][
        "model_number"] for n in HELD_OUT_V | {"g1ppo-m16", "g1fa3b-m8"}}
    assert cpus == {"207"}



def test_batch_w_held_out_at_micro_4_ran_on_a_host_twice_the_fits_speed():
    """Batch W (one H100, 2026-12-07, sixth session), against round 9614583 (the phases of 88f7551's, with host
    tables), committed before it ran; g1pad-m4 did not fit the session's device time. Micro 4 at 28 layers (1gpu-deep,
    never fitted on) +67.5% and PPO at micro 4 +70.8%: every phase over half a second over-predicted, the generate
    by ~2x (seen at verl's first 2 s poll on every step where the plan has about one and a half). With the model's
    host terms at 0.57 of the fit's (host_factor.py's one factor for the two) both steps come within 3%: the host,
    not the model's form. check_run.host_fit, from the plan's table alone, puts the PPO run at 0.56 (meets the target
    there) and the 1.5B at the table's end, 0.50, its generate +48% (a poll's step). The host probe read 27-30 ms the
    whole session with no steal: as fast as batch V's machine by the probe, whose runs the model replays at 0.71, so
    the probe does not tell the factor (docs/placement.md, "Batch W")."""
    host_factor = load_script("scripts/calibration/host_factor.py")
    rep = recorded()
    by = {r["run"]: r for r in rep["runs"]}
    assert all(by[n]["role"] == "hold-out" and by[n]["blind"] and by[n]["commit"][:7] == "9614583"
               and not by[n]["newer_rounds_before_run"] and by[n]["card"].startswith("NVIDIA H100") for n in HELD_OUT_W)
    assert 0.65 < by["g1fa15b-m4"]["step_error"] < 0.70 and 0.68 < by["g1ppo-m4"]["step_error"] < 0.73
    assert all(p["error"] > 0.25 for n in HELD_OUT_W for p in by[n]["phases"] if p["held"])
    for n in HELD_OUT_W:
        doc = json.loads((ROOT / f"tests/fixtures/verl_runs/grid2_results/grid2-{n}.json").read_text())
        gens = [m["timing_s/gen"] for k, m in doc["steps"].items() if int(k) > max(grid2.FIRST_STEPS)]
        assert all(round(g / step_time.GEN_POLL_S) == 1 for g in gens) and doc["submit_flags"] == ["--no-gc-freeze"]
        assert doc["host_cpu"]["host_steal_pct"] == 0.0 and 27 < doc["host_cpu"]["host_python_ms"] < 29
    h = {n: by[n]["host"] for n in HELD_OUT_W}
    assert 0.55 <= h["g1ppo-m4"]["factor"] <= 0.58 and h["g1ppo-m4"]["meets_target_at_factor"]
    assert h["g1fa15b-m4"]["factor"] == 0.5 and not h["g1fa15b-m4"]["meets_target_at_factor"]
    assert sum(bool(by[n]["host"]["meets_target_at_factor"]) for n in HELD_OUT_W) == 1
    done = replays(HELD_OUT_W)
    one = host_factor.best_factor([done[n] for n in HELD_OUT_W])
    assert one == 0.57 and all(abs(host_factor.step_error(done[n], one)) < 0.03 for n in HELD_OUT_W)
    probes = [json.loads(ln) for ln in (ROOT / "tests/fixtures/gpu/host_probe_h100_w.jsonl").read_text().splitlines()]
    assert len(probes) == 24 and all(27 < p["host_python_ms"] < 30 and p["steal_pct"] == 0.0 for p in probes)


def test_w_s_ppo_run_again_on_a_second_h100_met_the_plan_the_miss_was_the_machine():
    """Batch W's last run (g1pad-m4) and X's first (g1ppo-m4-b: W's g1ppo-m4 again, the same line) on a second H100
    (2026-12-07, seventh session), against round 9614583 as W's first two, committed before either ran. The PPO line
    that came in at +70.8% on W's first machine came in at -1.3% here, every phase over half a second within 7%; the
    padded run -2.1%, worst phase old_log_prob -17.8%: both meet the target as planned. The model's host terms need
    one factor 1.02 for the two (0.57 for W's first machine): same card, same line, 1.73x apart in step time, so the
    miss was the machine's speed, not the model's form. The probe does not tell it: this machine read 7.0-7.6 us a
    launch through g1pad-m4's chain and 9.9-10.4 through the PPO run's, at the same factor; W's first read 5.5-5.9."""
    host_factor = load_script("scripts/calibration/host_factor.py")
    rep = recorded()
    by = {r["run"]: r for r in rep["runs"]}
    assert grid2.BY_NAME["g1ppo-m4-b"].line() == grid2.BY_NAME["g1ppo-m4"].line()
    for n in HELD_OUT_WX:
        r = by[n]
        assert r["role"] == "hold-out" and r["blind"] and r["commit"][:7] == "9614583" and r["meets_target"], r
        assert not r["newer_rounds_before_run"] and r["card"].startswith("NVIDIA H100")
    assert -0.03 < by["g1pad-m4"]["step_error"] < 0 and -0.03 < by["g1ppo-m4-b"]["step_error"] < 0
    assert all(abs(p["error"]) < 0.07 for p in by["g1ppo-m4-b"]["phases"] if p["held"])
    assert min(p["error"] for p in by["g1pad-m4"]["phases"] if p["held"]) == pytest.approx(-0.178, abs=0.002)
    # the same line's measured steps on the two machines
    assert 1.70 < by["g1ppo-m4-b"]["step_measured"] / by["g1ppo-m4"]["step_measured"] < 1.76
    done = replays(HELD_OUT_WX)
    assert host_factor.best_factor([done[n] for n in HELD_OUT_WX]) == 1.02
    docs = {n: json.loads((ROOT / f"tests/fixtures/verl_runs/grid2_results/grid2-{n}.json").read_text())
            for n in HELD_OUT_WX}
    assert docs["g1ppo-m4-b"]["ran_as"].startswith("g1ppo-m4 ") and {d["host_cpu"]["model_number"] for d in
                                                                      docs.values()} == {"207"}
    probes = [json.loads(ln) for ln in (ROOT / "tests/fixtures/gpu/host_probe_h100_x.jsonl").read_text().splitlines()]
    chain = {p["note"].rsplit(", ", 1)[1]: [] for p in probes}
    for p in probes:
        chain[p["note"].rsplit(", ", 1)[1]].append(p["launch_us"])
    assert max(chain["g1pad-m4's chain"]) < 7.7 and min(chain["g1ppo-m4-b's chain"]) > 9.6
    t = rep["target"]
    assert (t["held_out_runs"], t["held_out_lines"], t["held_out_runs_meeting"], t["held_out_families_on_2_gpus"],
            t["met"]) == (9, 6, 4, 0, False)  # a repeat is one more run, not one more line
    assert t["held_out_runs_meeting_at_host_factor"] == 4 and t["held_out_runs_with_host_factor"] == 6

def test_w_s_deep_run_again_on_a_third_h100_the_step_held_its_generate_a_poll_apart():
    """X's second run, g1fa15b-m4-b: W's 1.5B at micro 4 (the family no refit fitted on) again, the same line, on a
    third H100 (CPU model 207, 2026-12-07, eighth session), against round 9614583 as W's runs, committed before. W's
    first machine ran it at 14.59 s a step (+67.5%); this one at 21.08 (+16.0%): the step within the target's 20%
    and old_log_prob, ref and update_actor within 15%, but the generate +34.8% - three of the six timed steps took
    one poll of verl's replay buffer (2.05-2.08 s) and three took two (4.06-4.09), where the plan said two (4.14):
    a rollout of about one period on this host, so one run of it sits between the two. The host factors: 0.82 on
    the model's host terms (host_factor.py), 0.88 by the plan's table (check_run.host_fit), where W's first machine
    was 0.57 and 0.50. One packed log-prob micro batch's layers (gpu_logprob_tail.py, after the chain) took 2.29 ms
    a layer at 4 sequences of the 0.5B and 1.58 of the 1.5B, the first tail machine's 2.06 and the model's
    FORWARD_SYNC_PASS_S 2.0: a floor above the model's on a host faster than the fit's, so it does not give the
    factor alone."""
    host_factor = load_script("scripts/calibration/host_factor.py")
    r, first = repeat_and_first(recorded(), "g1fa15b-m4-b", "9614583")
    assert abs(r["step_predicted"] - first["step_predicted"]) < 0.05  # one line, its fill a little apart
    assert 0.15 < r["step_error"] < 0.17 and not r["meets_target"]
    held = {p["phase"]: p for p in r["phases"] if p["held"]}
    assert [n for n, p in held.items() if abs(p["error"]) > 0.30] == ["gen"]
    assert all(0 < p["error"] < 0.15 for n, p in held.items() if n != "gen")
    doc = json.loads((ROOT / "tests/fixtures/verl_runs/grid2_results/grid2-g1fa15b-m4-b.json").read_text())
    gens = [m["timing_s/gen"] for k, m in doc["steps"].items() if int(k) > max(grid2.FIRST_STEPS)]
    assert sorted(round(g / step_time.GEN_POLL_S) for g in gens) == [1, 1, 1, 2, 2, 2]
    assert held["gen"]["predicted"] > 2 * step_time.GEN_POLL_S  # the plan: two polls
    assert doc["host_cpu"]["model_number"] == "207" and doc["submit_flags"] == ["--no-gc-freeze"]
    assert 1.40 < r["step_measured"] / first["step_measured"] < 1.50  # the same line on two H100s
    lo, hi = doc["product"]["eta"]["plan_range_s"]  # the plan's directional bar, as the run's ETA line carried it
    assert (lo, hi) == (14.0, 27.0) and all(lo <= x["step_measured"] <= hi for x in (r, first))
    assert r["host"]["factor"] == 0.88 and first["host"]["factor"] == 0.5
    done = replays(HELD_OUT_X2)
    assert host_factor.best_factor([done[n] for n in HELD_OUT_X2]) == 0.82
    tails = [json.loads(ln) for ln in (ROOT / "tests/fixtures/gpu/logprob_tail_h100_x.jsonl").read_text().splitlines()]
    first_tail = [json.loads(ln) for ln in (ROOT / "tests/fixtures/gpu/logprob_tail_h100.jsonl").read_text()
                  .splitlines()]
    per_layer = {t["shape"]: t["layers_s"] / t["layers"] for t in tails if t["seqs"] == 4}
    assert 2.2e-3 < per_layer["qwen2.5-0.5b"] < 2.4e-3 and 1.5e-3 < per_layer["qwen2.5-1.5b"] < 1.7e-3
    assert [round(t["layers_s"] / t["layers"] * 1e3, 2) for t in first_tail if t["seqs"] == 4] == [2.06]
    assert all(abs(t["whole_less_parts_s"]) < 0.012 for t in tails)  # the whole is its layers plus its tail
    probes = [json.loads(ln) for ln in (ROOT / "tests/fixtures/gpu/host_probe_h100_x2.jsonl").read_text()
              .splitlines()]
    assert len(probes) == 12 and max(p["launch_us"] for p in probes) > 10.5 > 7.0 > min(p["launch_us"] for p in probes)


def test_v_s_micro_4_run_again_on_another_h100_met_the_plan_the_miss_was_the_machine():
    """Batch Y's run, g1fa-m4-b: V's g1fa-m4 (packed, GRPO, micro 4 / 8) again, the same line, on another H100 (CPU
    model 207, 2026-12-08), against round 5970744 (the model V was judged by, no refit since), committed before it
    ran. V's machine ran it at 14.14 s a step (+51.7%); this one at 19.75 (+8.5%): every phase over half a second
    within 17% (ref +16.8%, update_actor +11.2%, the generate -1.5%, two polls on every timed step as planned). The
    host factors: 0.92 on the model's host terms (host_factor.py; V's machine 0.71), 0.93 by the plan's table (V's
    round kept none). The chain read the packed log-prob layer floor before the run and after it: 2.21 and 1.62 ms a
    layer on one machine within ten minutes, where X's faster machine (0.82) read 2.29 after its chain. The floor
    moves with the host as the probes do and orders the machines no better (docs/placement.md, "Batch Y")."""
    host_factor = load_script("scripts/calibration/host_factor.py")
    rep = recorded()
    r, first = repeat_and_first(rep, "g1fa-m4-b", "5970744")
    assert r["card"].startswith("NVIDIA H100") and r["meets_target"] and 0.08 < r["step_error"] < 0.09
    held = {p["phase"]: p for p in r["phases"] if p["held"]}
    assert set(held) == {"gen", "old_log_prob", "ref", "update_actor"} and all(abs(p["error"]) < 0.17 for p in
                                                                              held.values())
    doc = json.loads((ROOT / "tests/fixtures/verl_runs/grid2_results/grid2-g1fa-m4-b.json").read_text())
    gens = [m["timing_s/gen"] for k, m in doc["steps"].items() if int(k) > max(grid2.FIRST_STEPS)]
    assert [round(g / step_time.GEN_POLL_S) for g in gens] == [2] * 6
    assert doc["host_cpu"]["model_number"] == "207" and doc["submit_flags"] == ["--no-gc-freeze"]
    assert 1.38 < r["step_measured"] / first["step_measured"] < 1.42  # the same line on two H100s
    lo, hi = doc["product"]["eta"]["plan_range_s"]  # the plan's directional bar, as the run's ETA line carried it
    assert (lo, hi) == (13.0, 24.0) and all(lo <= x["step_measured"] <= hi for x in (r, first))
    assert r["host"]["factor"] == 0.93 and first["host"] is None  # V's round kept no host table
    done = replays(HELD_OUT_Y)
    assert host_factor.best_factor([done[n] for n in HELD_OUT_Y]) == 0.92
    floors = {t["when"]: t["layers_s"] / t["layers"] * 1e3 for t in
              map(json.loads, (ROOT / "tests/fixtures/gpu/logprob_tail_h100_y.jsonl").read_text().splitlines())}
    x_floor = [t["layers_s"] / t["layers"] * 1e3 for t in map(json.loads, (
        ROOT / "tests/fixtures/gpu/logprob_tail_h100_x.jsonl").read_text().splitlines())
        if t["seqs"] == 4 and t["shape"] == "qwen2.5-0.5b"]
    assert 2.1 < floors["setup"] < 2.3 and 1.5 < floors["end"] < 1.7 and x_floor and min(x_floor) > floors["setup"]
    t = rep["target"]  # V's line now has a run that meets the target; the line's first run still misses it
    assert (t["held_out_runs"], t["held_out_lines"], t["held_out_runs_meeting"], t["held_out_families"],
            t["held_out_families_on_2_gpus"], t["met"]) == (9, 6, 4, 4, 0, False)


def test_the_one_step_outliers_are_the_collectors_full_collections():
    """Batch Q (2 H200, 2026-11-28, 15 steps a run, round a7fd5e1): g2ppo-m32 and g2off-m32 again with every Python
    process's collector pauses logged and each step's end time kept. Every phase that ran 0.3 s or more over its
    median on one step held a full collection of 0.50-0.68 s in the worker running that phase (Ray's process title
    names the method) - all but step 2's old_log_prob of the PPO run (2.31 s, no pause: once-only work). With every
    process freezing a full collection's survivors (g2ppo-m32-frz, a diagnosis) no pause of 50 ms fell in a timed
    step, against 11 (5.9 s over both ranks) in the watched run. Both watched runs: step within ±20% (-9.2%, -9.6% at
    steps 3 on); g2off-m32-gc's old_log_prob -32% (the outliers and a steady 0.60-0.69 s against the model's 0.53)."""
    import gc_pauses

    pauses = json.loads((ROOT / "tests/fixtures/verl_runs/grid2_gc/Q.json").read_text())["pauses"]
    worker = {"old_log_prob": "compute_log_prob", "ref": "compute_ref_log_prob", "values": "critic_infer",
              "update_critic": "critic_train", "update_actor": "update_actor"}
    explained, unexplained, in_steps = 0, [], {}
    for name in ("g2ppo-m32-gc", "g2off-m32-gc", "g2ppo-m32-frz"):
        doc = json.loads((ROOT / f"tests/fixtures/verl_runs/grid2_results/grid2-{name}.json").read_text())
        windows = gc_pauses.by_step(pauses, doc["step_seen_t"])
        in_steps[name] = [p for rows in windows.values() for p in rows]
        steps = {int(k): v for k, v in doc["steps"].items() if int(k) >= 2}
        assert sorted(windows) == sorted(steps) == list(range(2, 16))
        for phase, method in worker.items():
            if f"timing_s/{phase}" not in steps[2]:
                continue
            vals = {s: m[f"timing_s/{phase}"] for s, m in steps.items()}
            med = sorted(vals.values())[len(vals) // 2]
            for s, v in vals.items():
                if v - med < 0.3:
                    continue
                if full_collection_in(windows[s], method):
                    explained += 1
                else:
                    unexplained.append((name, phase, s))
    assert explained == 10 and unexplained == [("g2ppo-m32-gc", "old_log_prob", 2)]
    assert in_steps["g2ppo-m32-frz"] == [] and len(in_steps["g2ppo-m32-gc"]) == 11
    assert round(sum(p["s"] for p in in_steps["g2ppo-m32-gc"]), 1) == 5.9
    assert any(p.get("frozen") for p in pauses)  # the frozen run's first full collections, then none of 50 ms
    rep = recorded()
    by = {r["run"]: r for r in rep["runs"]}
    for name in HELD_OUT_Q:
        r = by[name]
        assert r["role"] == "fit" and r["blind"] and r["commit"][:7] == "a7fd5e1"
        assert abs(r["step_error"]) <= 0.20
    assert {p["phase"] for p in by["g2off-m32-gc"]["phases"] if p["held"] and not p["ok"]} == {"old_log_prob"}
    assert "g2ppo-m32-frz" not in by  # a diagnosis: never reported or fitted
