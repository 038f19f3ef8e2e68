"""Issue 33's second calibration grid (scripts/calibration/grid2.py): every run plans as declared on H100 and H200,
held-out families are held out by axis, the batches fit their sessions by the plan's own estimate, the lines compose
in verl 0.9.1's config, and the report's arithmetic on a small made-up set of results."""

import contextlib
import importlib.util
import io
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts" / "calibration"))

import grid2  # noqa: E402
import grid2_device  # noqa: E402
from tests.harness.scripts import load_script
from verl_cluster.cli import main


@pytest.fixture(scope="module")
def plans(tmp_path_factory):
    """The CLI's plan of every run on a 2-GPU node of each card, at the fill the batches are budgeted at: grid2.plan's
    arguments to the CLI's main in this process (a process each took 20 s of the suite); one run through grid2.plan
    itself, the same document."""
    folder = tmp_path_factory.mktemp("facts")
    out = {}
    for r in grid2.RUNS:
        for c in grid2.CARDS:
            buf = io.StringIO()
            with contextlib.redirect_stdout(buf):
                assert main(grid2.plan_argv(r, c, folder, grid2.EXPECTED_FILL)) == 0, (r.name, c)
            out[(r.name, c)] = json.loads(buf.getvalue())
    first = grid2.RUNS[0]
    assert grid2.plan(first, "H200", folder, grid2.EXPECTED_FILL) == out[(first.name, "H200")]
    return out


def test_every_run_plans_feasible_on_h100_and_h200_as_declared(plans):
    for (name, card), p in plans.items():
        run = grid2.BY_NAME[name]
        assert p["feasible"], f"{name} on {card}: {p['problems']}"
        hw = p["hardware"]
        assert (hw["nnodes"], hw["gpus_per_node"]) == (1, run.gpus), name
        assert grid2.CARDS[card][0] in hw["description"]
        axes = p["time"]["error_bar"]["axes"]  # the product's own reading of the line
        assert axes["gpu"] == card
        assert {k: axes[k] for k in run.axes()} == run.axes(), name


def test_held_out_families_are_held_out_by_axis():
    for run in grid2.RUNS:  # the families partition the runs
        assert [f.name for f in grid2.FAMILIES if f.matches(run.axes())] == [run.family], run.name
    held = [f for f in grid2.FAMILIES if f.role == "hold-out"]
    fitted = set(grid2.FITTED_ON)  # held-out runs a refit took after a look: named, each with its refit
    fit_axes = [r.axes() for r in grid2.RUNS if grid2.run_role(r) == "fit" and r.name not in fitted]
    envelope = json.loads((ROOT / "verl_cluster/catalog/step_time_envelope.json").read_text())["runs"]
    fit_axes += [r["axes"] for r in envelope if r["role"] == "fit" and r["run"] not in fitted]  # the shipped fit
    for fam in held:  # no other fit run lands in a held-out family
        assert not [a for a in fit_axes if fam.matches(a)], fam.name
    assert [f for f in held if not any(grid2.BY_NAME[n].family == f.name for n in fitted)]  # one never fitted on
    held_runs = [r for r in grid2.RUNS if grid2.run_role(r) == "hold-out"]
    assert len(held_runs) >= 6 and len({r.family for r in held_runs}) >= 3
    assert len({r.family for r in held_runs if r.gpus >= 2}) >= 2


def test_batches_cover_every_run_once_and_fit_a_session(plans):
    names = [r.name for b in grid2.BATCHES for r in grid2.batch_runs(b)]
    assert sorted(names) == sorted(grid2.BY_NAME) and len(names) == len(set(names))
    measured = [b for b in grid2.BATCHES if not all(r.diagnosis for r in grid2.batch_runs(b))]
    assert [b for b in grid2.BATCHES if b not in measured] == ["P", "R"]  # diagnoses: neither fit nor held out
    roles = [{grid2.run_role(r) for r in grid2.batch_runs(b) if not r.diagnosis} for b in measured]
    assert all(len(r) == 1 for r in roles)  # a batch is all fit, all held out or all seen ...
    order = [r.pop() for r in roles]
    assert order == sorted(order, key=lambda x: x != "fit")  # ... and the fit ones come first
    need = {r.name: max(grid2.expected_s(plans[(r.name, c)]["time"]["step_s"], r.steps) for c in grid2.CARDS)
            for r in grid2.RUNS}
    for b in grid2.BATCHES:  # each batch one session on a node of 2 GPUs (what the device lends most), H on 4
        end, _ = grid2.lane_plan([b], max([2] + [r.gpus for r in grid2.batch_runs(b)]), need)
        assert grid2.STARTUP_S < end <= grid2.SESSION_RUNS_S, (b, end)
    for b in ("C", "D"):  # the first two held-out sessions: one run of each family held out from the start
        runs = grid2.batch_runs(b)
        assert {r.family for r in runs} == {"2gpu-padded-small-micro", "2gpu-packed", "2gpu-ppo"}, b
    assert {r.family for r in grid2.batch_runs("F")} == {"2gpu-offload"}  # never fitted on, after the refit
    assert {(r.family, r.gpus) for r in grid2.batch_runs("H")} == {  # no grid had 4 ranks: 3 families never fitted
        ("4gpu-packed", 4), ("4gpu-padded", 4), ("4gpu-ppo", 4)}


def test_every_line_composes_in_verls_config():
    spec = importlib.util.find_spec("verl")  # its config folder only: importing verl takes seconds
    if spec is None or importlib.util.find_spec("hydra") is None:
        pytest.skip("verl 0.9.1 and hydra are not installed here")
    import hydra
    from hydra import compose, initialize_config_dir

    # verl's yaml is untyped: what can fail to compose is a key, so one run per set of keys (a compose takes 0.3 s)
    by_keys = {tuple(sorted(o.split("=", 1)[0] for o in r.line()[3:])): r for r in grid2.RUNS}
    with initialize_config_dir(config_dir=os.path.join(spec.submodule_search_locations[0], "trainer", "config"),
                               version_base=None):
        for run in by_keys.values():
            cfg = compose(config_name="ppo_trainer", overrides=run.line()[3:])
            assert cfg.actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu == run.micro
            assert cfg.trainer.n_gpus_per_node == run.gpus
            assert (cfg.critic.ppo_micro_batch_size_per_gpu == run.micro) == (run.algo == "gae")
        with pytest.raises(hydra.errors.ConfigCompositionException):
            compose(config_name="ppo_trainer", overrides=["critic.no_such_key=1"])


def test_a_run_again_on_another_machine_is_budgeted_and_cleared_as_its_first():
    """A repeat (Run.repeat_of) has no round of its own: the chain budgets it at its first's expected seconds, and
    clears the checkpoint folder its line writes to (its first's) before it starts."""
    rounds = json.loads(grid2.PREDICTIONS.read_text())["rounds"]
    for r in (r for r in grid2.RUNS if r.repeat_of):
        first = grid2.BY_NAME[r.repeat_of]
        assert any(first.name in rnd["runs"] for rnd in rounds)  # not the generous guess for a run never predicted
        assert grid2_device.need_s(r) == grid2_device.need_s(first)
        assert r.ckpt_dir == first.ckpt_dir and f"trainer.default_local_dir={first.ckpt_dir}" in r.line()


def test_a_run_again_keeps_its_verdict_when_a_later_round_predicts_it_by_name():
    """A round recorded after the run started, naming the repeat itself, is no prediction of it: the run stays
    judged against its first's, recorded before it ran."""
    rounds = json.loads(grid2.PREDICTIONS.read_text())["rounds"]
    result = json.loads((ROOT / "tests/fixtures/verl_runs/grid2_results/grid2-g1ppo-m4-b.json").read_text())
    before = grid2.judge(result, rounds)
    first = next(r for r in reversed(rounds) if "g1ppo-m4" in r["runs"])
    later = {**first, "date": "2099-01-01T00:00:00Z", "commit": "f" * 40,
             "runs": {"g1ppo-m4-b": first["runs"]["g1ppo-m4"]}}
    after = grid2.judge(result, rounds + [later])
    assert before["blind"] and after["blind"] and after["commit"] == before["commit"] != later["commit"]
    assert after["step_error"] == before["step_error"]


def test_the_recorded_predictions_cover_the_grid_on_both_cards():
    rounds = json.loads(grid2.PREDICTIONS.read_text())["rounds"]
    assert rounds and all(len(r["commit"]) == 40 for r in rounds)
    seen = {(n, c) for r in rounds for n, cards in r["runs"].items() for c in cards}
    # a run again on another machine (repeat_of) is judged against its first's prediction: the same line
    assert seen >= {(r.repeat_of or r.name, c) for r in grid2.RUNS if not r.profile for c in grid2.CARDS}
    assert all(grid2.BY_NAME[r.repeat_of].line() == r.line() for r in grid2.RUNS if r.repeat_of)
    for p in rounds[0]["runs"]["g2pad-m8"].values():
        assert [f for f, _ in p["by_fill"]] == list(grid2.FILLS) and p["error_bar"]["pct"] > 0


def test_verl_console_lines_parse_with_rays_prefix_and_numpy_scalars():
    lines = ["(TaskRunner pid=42) \x1b[36mstep:2 - timing_s/gen:4.5 - actor/perf/max_memory_reserved_gb:20.5 - "
             "val-core/acc:np.float64(0.25) - perf/total_num_tokens:40000 - training/global_step:2",
             "INFO unrelated line", "step:3 - timing_s/gen:5.5 - timing_s/step:9"]
    got = grid2.parse_steps(lines)
    assert got == {2: {"timing_s/gen": 4.5, "actor/perf/max_memory_reserved_gb": 20.5,
                       "perf/total_num_tokens": 40000.0}, 3: {"timing_s/gen": 5.5, "timing_s/step": 9.0}}


def _steps(gen: float, upd: float, small: float, tokens: float) -> dict:
    one = {"timing_s/gen": gen, "timing_s/update_actor": upd, "timing_s/adv": small, "timing_s/step": 99.0,
           "perf/total_num_tokens": tokens, "actor/perf/max_memory_reserved_gb": 20.0}
    return {"1": {k: v * 10 for k, v in one.items()}, "2": one, "3": dict(one)}  # step 1 is never counted


def test_report_holds_each_run_against_the_round_before_it_at_its_own_fill(monkeypatch):
    monkeypatch.setattr(grid2, "FITTED_ON", {})  # the report's own rules, with every held-out run still held out
    tokens = 0.35 * 128 * 896  # fill 0.35: halfway between the recorded 0.2 and 0.5
    by_fill = [[0.2, {"gen": 2.0, "update_actor": 4.0, "adv": 0.1}], [0.5, {"gen": 4.0, "update_actor": 6.0,
                                                                          "adv": 0.3}]]
    rounds = [{"commit": "a" * 40, "date": "2026-12-01T00:00:00Z",
               "runs": {n: {"H100": {"by_fill": by_fill, "error_bar": {"pct": 35}}} for n in ("g1pad-m8",
                                                                                              "g2pad-m8")}}]
    results = [  # a fit run on the mark; a held-out one whose update is 40% off; one held out with no prior round
        {"run": "g1pad-m8", "card": "NVIDIA H100 80GB HBM3", "started_utc": "2026-12-01T01:00:00Z",
         "steps": _steps(3.0, 5.0, 0.2, tokens)},
        {"run": "g2pad-m8", "card": "NVIDIA H100 80GB HBM3", "started_utc": "2026-12-01T02:00:00Z",
         "steps": _steps(3.0, 5.0 / 1.4, 0.1, tokens)},
        {"run": "g2fa-m8", "card": "NVIDIA H100 80GB HBM3", "started_utc": "2026-11-30T00:00:00Z",
         "steps": _steps(3.0, 5.0, 0.2, tokens)},
    ]
    rep = grid2.report(results, rounds)
    fit, held, early = rep["runs"]
    assert fit["fill"] == 0.35 and fit["step_predicted"] == 8.2 and fit["step_measured"] == 8.2
    assert fit["step_error"] == 0.0 and fit["meets_target"] and fit["commit"] == "a" * 40
    ph = {p["phase"]: p for p in held["phases"]}
    assert ph["update_actor"]["error"] == pytest.approx(0.4, abs=1e-3) and ph["update_actor"]["ok"] is False
    assert ph["adv"]["held"] is False and ph["adv"]["ok"] is None  # 0.1 s: under half a second, not judged
    assert held["step_error"] == pytest.approx(8.2 / (3.0 + 5.0 / 1.4 + 0.1) - 1, abs=1e-3)
    assert held["meets_target"] is False
    assert early["blind"] is False and "no prediction recorded before it ran" in early["why"]
    fams = {f["family"]: f for f in rep["families"]}
    assert fams["1gpu-padded"]["meets_target"] and not fams["2gpu-padded-small-micro"]["meets_target"]
    assert "2gpu-packed" not in fams  # its only run was not blind
    assert rep["target"] == {"held_out_runs": 1, "held_out_lines": 1, "held_out_families": 1,
                             "held_out_families_on_2_gpus": 1, "held_out_runs_meeting": 0, "families_never_fitted": 1,
                             "met": False, "held_out_runs_with_host_factor": 0,
                             "held_out_runs_meeting_at_host_factor": 0}
    md = grid2.markdown(rep)
    assert "| **g2pad-m8** |" in md and "NOT met" in md and "+40.0%" in md and "(bar ±35%)" in md
    assert "its round kept no host table" in md and "At each run's own host factor" not in md


def test_the_report_says_whether_a_held_out_run_meets_the_target_at_its_own_hosts_speed(monkeypatch):
    """A round that kept its phases at host factors (predict_run's by_host_factor): a held-out run on a host 0.7x the
    fit's misses the target as planned (+43%) and meets it at its factor; the target itself stays NOT met."""
    monkeypatch.setattr(grid2, "FITTED_ON", {})
    full = 128 * 896
    by_fill = [[0.2, {"gen": 2.0, "update_actor": 4.0}], [0.5, {"gen": 4.0, "update_actor": 6.0}]]
    # the update is the host's work, the generate the GPU's: a faster host shortens the one, not the other
    hosts = [[h, {"gen": 3.0, "update_actor": 5.0 * h}] for h in (0.5, 0.7, 1.0, 1.4, 2.0)]
    rounds = [{"commit": "c" * 40, "date": "2026-12-01T00:00:00Z", "runs": {"g2pad-m8": {"H100": {
        "by_fill": by_fill, "error_bar": {"pct": 35}, "tokens_full": full, "by_host_factor": hosts}}}}]
    run = {"run": "g2pad-m8", "card": "NVIDIA H100 80GB HBM3", "started_utc": "2026-12-01T02:00:00Z",
           "steps": _steps(3.0, 3.5, 0.0, 0.35 * full)}
    rep = grid2.report([run], rounds)
    (held,) = rep["runs"]
    assert held["step_error"] == pytest.approx(8.0 / 6.5 - 1, abs=1e-3) and held["meets_target"] is False
    h = held["host"]
    assert h["factor"] == pytest.approx(0.7, abs=0.011) and h["meets_target_at_factor"] and h["explains"]
    t = rep["target"]
    assert not t["met"] and t["held_out_runs_meeting"] == 0
    assert t["held_out_runs_with_host_factor"] == 1 and t["held_out_runs_meeting_at_host_factor"] == 1
    md = grid2.markdown(rep)
    assert "0.70x: step" in md and "(meets)" in md and "1 of the 1 held-out runs with a host factor meet it" in md
    # a factor at the table's end may lie beyond it: never counted as meeting
    run["steps"] = _steps(3.0, 1.0, 0.0, 0.35 * full)
    h = grid2.report([run], rounds)["runs"][0]["host"]
    assert h is None or not h["meets_target_at_factor"]


def test_a_held_out_run_fitted_on_after_a_look_becomes_a_fit_run(monkeypatch):
    """A held-out run looked at before a refit and then fitted on (FITTED_ON) is a fit run in the fixture and the
    report; its family's other runs stay held out, but that family no longer counts as never fitted on."""
    monkeypatch.setattr(grid2, "FITTED_ON", {"g2fa-m8": "looked at before the refit of 2026-12-01"})
    tokens = 0.35 * 128 * 896
    by_fill = [[0.2, {"gen": 2.0, "update_actor": 4.0}], [0.5, {"gen": 4.0, "update_actor": 6.0}]]
    rounds = [{"commit": "b" * 40, "date": "2026-12-01T00:00:00Z",
               "runs": {n: {"H200": {"by_fill": by_fill, "error_bar": {"pct": 20}}} for n in ("g2fa-m8", "g2fa-m2")}}]
    results = [{"run": n, "card": "NVIDIA H200", "started_utc": "2026-12-01T01:00:00Z", "machine_gpus": 2,
                "gpu_set": [0, 1], "flash_attn": True, "steps": _steps(3.0, 5.0, 0.0, tokens)}
               for n in ("g2fa-m8", "g2fa-m2")]
    rep = grid2.report(results, rounds)
    assert {r["run"]: r["role"] for r in rep["runs"]} == {"g2fa-m8": "fit", "g2fa-m2": "hold-out"}
    assert rep["target"]["held_out_runs"] == 1 and rep["target"]["families_never_fitted"] == 0
    assert "0 never fitted on" in grid2.markdown(rep)
    assert grid2.to_entry(results[0], results)[1]["time"] == "fit"
    assert grid2.to_entry(results[1], results)[1]["time"] == "hold-out"


def test_a_batch_skips_what_it_cannot_run_with_one_line_saying_why():
    packed, padded = grid2.BY_NAME["g2fa-m8"], grid2.BY_NAME["g2pad-m8"]
    why = grid2_device.decide(packed, flash_ok=False, left_s=5000, need_s=300)
    assert why.startswith("SKIP g2fa-m8") and "flash-attn is not staged" in why and "\n" not in why
    assert grid2_device.decide(padded, flash_ok=False, left_s=5000, need_s=300) == ""
    assert "needs ~300s, 200s left" in grid2_device.decide(padded, flash_ok=True, left_s=200, need_s=300)


def test_a_run_whose_head_dim_the_flash_attn_wheel_lacks_is_refused_before_it_costs_device_time(tmp_path,
                                                                                                   monkeypatch):
    """Batch U (2026-12-02): the wheel had head dims 32 and 64, the 1.5B and 3B shapes need 128 (hidden / heads);
    each run failed in its first log-prob pass after ~270 s of start-up. Now `start` refuses it with the fix, and the
    chain skips it with one line."""
    from verl_cluster.testdata.tiny_model import SHAPES

    assert grid2.HEAD_DIM == {n: s["hidden_size"] // s["num_attention_heads"] for n, s in SHAPES.items()
                              if n in grid2.PARAMS_B}
    wheel = tmp_path / ".stage" / "flashattn-wheel"
    wheel.mkdir(parents=True)
    (wheel / "kit.env").write_text('FA_VERSION=2.8.3\nFA_HDIMS="32 64"\nFA_DISABLE="ALIBI"\n')
    dims = grid2_device.flash_head_dims(wheel)
    assert dims == {32, 64} and grid2_device.flash_head_dims(tmp_path) is None  # no kit: nothing to check
    deep, fa, pad = grid2.BY_NAME["g1fa3b-m8"], grid2.BY_NAME["g1fa-m16"], grid2.BY_NAME["g1pad-m16"]
    why = grid2_device.decide(deep, True, 5000, 300, 1, dims)
    assert why.startswith("SKIP g1fa3b-m8 (qwen2.5-3b) needs flash-attn head dim 128") and "\n" not in why
    assert 'FA_HDIMS="32 64 128"' in why
    assert grid2_device.decide(fa, True, 5000, 300, 1, dims) == "" == grid2_device.decide(deep, True, 5000, 300, 1)
    assert grid2_device.head_dim_gap(pad, {32}) == ""  # a padded GRPO run never loads flash-attn
    monkeypatch.setattr(grid2_device, "REPO", tmp_path)
    monkeypatch.setattr(grid2_device, "OUT", tmp_path / "out")
    with pytest.raises(SystemExit, match=r"g1fa15b-m8 \(qwen2.5-1.5b\) needs flash-attn head dim 128[\s\S]*--skip"):
        grid2_device.start(["U"])
    assert not (tmp_path / "out").exists()  # refused before anything was copied or started
    (wheel / "kit.env").write_text('FA_HDIMS="32 64 128"\n')
    assert grid2_device.head_dim_gap(deep, grid2_device.flash_head_dims(wheel)) == ""


def test_a_session_runs_side_by_side_padded_first_and_never_mixes_fit_with_held_out(plans):
    (flash0, first), (flash1, second) = grid2.phases(["A", "B"])
    assert (flash0, flash1) == (False, True) and not any(r.flash for r in first) and all(r.flash for r in second)
    assert sorted(r.name for r in first + second) == sorted(r.name for b in "AB" for r in grid2.batch_runs(b))
    with pytest.raises(SystemExit, match="mix fit and held-out"):
        grid2.phases(["B", "T"])
    need = {r.name: max(grid2.expected_s(plans[(r.name, c)]["time"]["step_s"], r.steps) for c in grid2.CARDS)
            for r in grid2.RUNS}
    for batches in (["A", "B"], ["D", "E"]):  # one session each on a node of 4 GPUs
        end, spans = grid2.lane_plan(batches, 4, need)
        assert end <= grid2.SESSION_RUNS_S, batches
        for t in range(0, int(end), 5):  # never more GPUs going than the node has
            assert sum(grid2.BY_NAME[n].gpus for n, (a, b) in spans.items() if a <= t < b) <= 4
    end2, _ = grid2.lane_plan(["A"], 2, need)  # on 2 GPUs batch A's two 1-GPU runs go together
    solo = sum(need[r.name] for r in grid2.batch_runs("A"))
    assert end2 == pytest.approx(solo - min(need["g1pad-m2"], need["g1pad-m8"]))
    assert grid2_device.decide(grid2.BY_NAME["g2fa-m8"], True, 5000, 300, gpus=1).endswith("this machine has 1")
    # on 2 GPUs A+B is over a session; leaving the second 2-GPU padded run out keeps every fit family in one
    skip = ("g2pad-m16", "g1fa-m2")
    kept = [r for _, rs in grid2.phases(["A", "B"], skip) for r in rs]
    assert {r.family for r in kept} == {f.name for f in grid2.FAMILIES if f.role == "fit"} - {"1gpu-deep"}  # U's
    assert not {r.name for r in kept} & set(skip)
    assert grid2.lane_plan(["A", "B"], 2, need, skip)[0] < grid2.lane_plan(["A", "B"], 2, need)[0]
    with pytest.raises(SystemExit, match="no such run"):
        grid2.phases(["A"], ("g9-nope",))


def test_the_report_names_the_runs_that_ran_beside_each_other():
    base = {"card": "NVIDIA H100 80GB HBM3", "steps": {}}
    results = [{**base, "run": "g1pad-m2", "started_utc": "2026-12-01T01:00:00Z", "wall_s": 300},
               {**base, "run": "g1pad-m8", "started_utc": "2026-12-01T01:04:00Z", "wall_s": 300},
               {**base, "run": "g2pad-m32", "started_utc": "2026-12-01T01:08:00Z", "wall_s": 300}]
    got = {r["run"]: r["beside"] for r in grid2.report(results, [])["runs"]}
    assert got == {"g1pad-m2": ["g1pad-m8"], "g1pad-m8": ["g1pad-m2", "g2pad-m32"], "g2pad-m32": ["g1pad-m8"]}


def test_run_phase_keeps_the_gpus_count_and_the_order(tmp_path, monkeypatch):
    """The device loop with the submits replaced by sleeps: runs started in order, each on a free GPU set of its size
    and that set's own cluster, never more GPUs going than the node has, each result written, a failing run a line
    while the others go on."""
    import threading

    going, seen, lock = [], [], threading.Lock()

    def fake_one(run, card, cluster, have_flash, total, gpus):
        with lock:
            assert not {g for _, gs in going for g in gs} & set(gpus), (run.name, gpus)
            going.append((run, gpus))
            seen.append((run.name, cluster.name, gpus))
        time.sleep(0.3 if run.gpus == 2 else 0.5)
        with lock:
            going.remove((run, gpus))
        if run.name == "g1pad-m8":
            raise RuntimeError("submit died")
        return {"run": run.name, "steps": {}, "status": "SUCCEEDED", "rc": 0, "wall_s": 0.3}

    monkeypatch.setattr(grid2_device, "OUT", tmp_path)
    monkeypatch.setattr(grid2_device, "one", fake_one)
    monkeypatch.setattr(grid2_device, "wait_free", lambda cluster, need: None)
    monkeypatch.setattr(grid2_device, "need_s", lambda run: 10.0)
    monkeypatch.setattr(grid2_device, "STAGGER_S", 0.0)
    (_, runs), = [p for p in grid2.phases(["A", "B"]) if not p[0]]
    grid2_device.run_phase(runs, "H100", True, False, 4)
    assert [n for n, _, _ in seen] == [r.name for r in runs]
    assert seen[:3] == [("g1pad-m2", "grid2-g0.yaml", (0,)), ("g1pad-m8", "grid2-g1.yaml", (1,)),
                        ("g2pad-m32", "grid2-g23.yaml", (2, 3))]  # 0 and 1 taken: the pair 2-3, its own cluster
    assert seen[3][2] in ((0, 1), (2, 3)) and seen[3][1] == f"grid2-g{''.join(map(str, seen[3][2]))}.yaml"
    assert sorted(p.name for p in tmp_path.glob("grid2-*.json")) == ["grid2-g1pad-m2.json", "grid2-g2pad-m16.json",
                                                                      "grid2-g2pad-m32.json"]
    assert "g1pad-m8 failed: RuntimeError: submit died" in (tmp_path / "steps.log").read_text()


def test_each_gpu_set_gets_a_cluster_of_its_own(tmp_path, monkeypatch):
    """verl's TransferQueue is one per Ray cluster: the sets' clusters differ in name, ports and GPUs."""
    monkeypatch.setattr(grid2_device, "OUT", tmp_path)
    from verl_cluster.config.cluster import load_cluster

    specs = [load_cluster(str(grid2_device.write_cluster(gs, 4))) for gs in grid2.gpu_sets(4)]
    assert grid2.gpu_sets(4) == [(0,), (1,), (2,), (3,), (0, 1), (2, 3), (0, 1, 2, 3)]
    assert grid2.gpu_sets(2) == [(0,), (1,), (0, 1)]
    assert len({s.cluster_name for s in specs}) == 7
    assert [s.head.env["CUDA_VISIBLE_DEVICES"] for s in specs] == ["0", "1", "2", "3", "0,1", "2,3", "0,1,2,3"]
    ports = [p for s in specs for p in (s.head.gcs_port, s.head.dashboard_port, s.head.ray_client_port,
                                        *vars(s.ray.ports).values()) if p < 20000]
    assert len(ports) == len(set(ports))
    ranges = sorted((s.ray.ports.min_worker, s.ray.ports.max_worker) for s in specs)
    assert all(a[1] < b[0] for a, b in zip(ranges, ranges[1:]))


def test_the_first_side_by_side_session_is_not_counted(tmp_path):
    """4x H200, 2026-11-28: batches A and B side by side on ONE Ray cluster shared verl's TransferQueue; 4 of 7 runs
    hung when another ended. The report lists every one of them as no measurement, saying why."""
    folder = ROOT / "tests/fixtures/verl_runs/grid2_shared_queue"
    results = [json.loads(f.read_text()) for f in sorted(folder.glob("grid2-*.json"))]
    assert len(results) == 7 and {r["rc"] for r in results} == {0, 124}
    rep = grid2.report(results, json.loads(grid2.PREDICTIONS.read_text())["rounds"])
    assert all(not r["blind"] and "one verl TransferQueue" in r["why"] for r in rep["runs"])
    assert rep["families"] == [] and rep["target"]["held_out_runs"] == 0
    log = (folder / "steps.log").read_text()
    assert "g1pad-m2: None rc=124" in log and "g2pad-m32: SUCCEEDED" in log


def _as_measured(name: str, gpu_set: list[int]) -> dict:
    """A recorded run's document with the fields of a run on a cluster of its own (its timings are the shared
    session's: this is the converter's input shape, not a measurement)."""
    doc = json.loads((ROOT / f"tests/fixtures/verl_runs/grid2_shared_queue/grid2-{name}.json").read_text())
    return {**doc, "gpu_set": gpu_set}


def test_a_measured_run_becomes_a_fixture_entry_replayed_as_the_cli_planned_it(tmp_path):
    """grid2.py fixture writes what fit_plan_calibration replays; the replay of the line at the run's fill is the
    plan `verl-cluster plan --fill -- LINE` gave (the prediction recorded before the run): same phases."""
    fit = load_script("scripts/calibration/fit_plan_calibration.py")
    results = [_as_measured("g2pad-m16", [2, 3]), _as_measured("g2pad-m32", [0, 1]),
               json.loads((ROOT / "tests/fixtures/verl_runs/grid2_shared_queue/grid2-g1pad-m2.json").read_text())]
    out = tmp_path / "grid2_runs.json"
    assert grid2.write_fixture(results, out) == ["g2pad-m16", "g2pad-m32"]  # g1pad-m2 shared a cluster, no steps
    entry = json.loads(out.read_text())["runs"]["g2pad-m16"]
    assert entry["time"] == "fit" and entry["card"] == "H200" and entry["facts"].endswith("grid2_h200x2.json")
    assert entry["line"] == grid2.BY_NAME["g2pad-m16"].line() and entry["flash_attn"] is False
    assert entry["beside"] == ["g1pad-m2"]  # its time overlapped g1pad-m2's, not g2pad-m32's
    plan, got = fit.replay_figures(entry, tmp_path)
    cli = grid2.plan(grid2.BY_NAME["g2pad-m16"], "H200", tmp_path, entry["fill"])
    assert plan.time["phases_s"] == cli["time"]["phases_s"] and plan.time["step_s"] == cli["time"]["step_s"]
    assert got["step_s"] == pytest.approx(grid2.measured(results[0]["steps"], 128)["step_s"], rel=1e-6)


def test_the_gc_batch_watches_two_held_out_lines_and_freezes_one_as_a_diagnosis():
    """Q: the configurations with one-step outliers, 15 steps each; the frozen run is the watched PPO line again."""
    watched, frozen = grid2.BY_NAME["g2ppo-m32-gc"], grid2.BY_NAME["g2ppo-m32-frz"]
    assert [w.replace("-frz", "-gc") for w in frozen.line()] == watched.line()
    assert "trainer.total_training_steps=15" in watched.line()
    assert frozen.diagnosis and not watched.diagnosis and not grid2.BY_NAME["g2off-m32-gc"].diagnosis
    # held-out measurements of their families when they ran; fitted on since the second refit (they were looked at)
    assert {grid2.run_role(grid2.BY_NAME[n]) for n in ("g2ppo-m32-gc", "g2off-m32-gc")} == {"fit"}
    assert grid2.to_entry({"run": "g2ppo-m32-frz", "steps": {"2": {"timing_s/step": 1.0}}}, []) is None
    assert grid2.expected_s(6.0, 15) - grid2.expected_s(6.0) == 60.0


def test_the_gc_freeze_a_b_runs_each_side_beside_the_other_then_swapped():
    """R: the product's --gc-freeze against the default on the two GPUs of a node of 2, side by side, then swapped."""
    runs, rc = grid2.batch_runs("R")[:4], grid2.batch_runs("R")[4]
    assert all(r.diagnosis and r.gpus == 1 and r.steps == 12 for r in runs)
    assert rc.diagnosis and rc.gpus == 2 and rc.submit_flags == ("env.TORCH_LOGS=recompiles",)
    bases = {tuple(w for w in r.line() if "ckpt" not in w) for r in runs}
    assert len(bases) == 1  # one line; only the product's flag differs
    assert [r.submit_flags for r in runs] == [(), ("--gc-freeze",), ("--gc-freeze",), ()]
    # the product freezes by default since R: a default side, and every grid run, says --no-gc-freeze to submit
    assert [r.flags for r in runs] == [("--no-gc-freeze",), ("--gc-freeze",), ("--gc-freeze",), ("--no-gc-freeze",)]
    assert rc.flags == ("env.TORCH_LOGS=recompiles", "--no-gc-freeze")
    assert all("--no-gc-freeze" in r.flags for r in grid2.batch_runs("S") + grid2.batch_runs("H"))
    end, at = grid2.lane_plan(["R"], 2, {r.name: 400.0 for r in runs + [rc]})
    assert at.pop(rc.name) == (800.0, 1200.0) and end == 1200.0  # after both lanes, on both GPUs
    starts = sorted((s, r.name) for r, (s, _) in ((grid2.BY_NAME[n], v) for n, v in at.items()))
    pairs = [{n.split("-")[2] for s, n in starts if s == t} for t in sorted({s for s, _ in starts})]
    assert pairs == [{"def", "frz"}, {"def", "frz"}]


def test_a_profiled_run_is_a_diagnosis_not_a_measurement():
    """g1ppo-m8-prof: the PPO line with verl's torch profiler on step 3's actor and critic updates; its timings carry
    the profiler's cost, so neither the report nor the fixture takes it, and it may share a session with any batch."""
    run = grid2.BY_NAME["g1ppo-m8-prof"]
    base = grid2.BY_NAME["g1ppo-m8"]
    extra = run.line()[len(base.line()):]
    assert run.line()[:len(base.line()) - 1] == [w.replace("g1ppo-m8", "g1ppo-m8-prof") for w in base.line()[:-1]]
    assert "global_profiler.tool=torch" in extra and "global_profiler.steps=[3]" in extra
    assert "actor_rollout_ref.actor.profiler.enable=true" in extra and "critic.profiler.enable=true" in extra
    assert f"global_profiler.save_path={grid2.PROFILE_DIR / run.name}" in extra
    # the whole stage, unscheduled: verl 0.9.1's scheduled profiler (schedule.active=2) saved no update trace
    assert not [w for w in extra if ".schedule." in w]
    # the traces stay on the device; only their summary comes back with OUT
    assert not str(grid2.PROFILE_DIR).startswith(str(grid2.OUT))
    assert [r.name for _, rs in grid2.phases(["C", "P"]) for r in rs][-2:] == ["g2ppo-m8-prof", "g1ppo-m8-prof"]
    assert grid2.BY_NAME["g2ppo-m8-prof"].profile_dir != run.profile_dir  # each summary reads its own traces
    doc = {"run": run.name, "card": "NVIDIA H200", "started_utc": "2026-12-01T01:00:00Z", "wall_s": 300,
           "machine_gpus": 1, "gpu_set": [0], "flash_attn": True,
           "steps": {str(k): {"timing_s/step": 12.0, "timing_s/gen": 4.0, "perf/total_num_tokens": 43000.0}
                     for k in range(1, 6)}}
    assert grid2.to_entry(doc, [doc]) is None and grid2.report([doc], [])["runs"] == []


def test_the_chain_makes_the_shapes_a_batch_needs_once(tmp_path, monkeypatch):
    """U's runs need the 1.5B and 3B shapes beside the setup's 0.5B: make_tiny_model.py for each one not written yet,
    none for a batch of the 0.5B alone."""
    from types import SimpleNamespace

    models = tmp_path / "models"
    (models / "qwen2.5-1.5b").mkdir(parents=True)
    (models / "qwen2.5-1.5b" / "config.json").write_text("{}")  # written by an earlier chain on this machine
    monkeypatch.setattr(grid2_device, "gm", lambda: SimpleNamespace(MODELS=models, BIN=tmp_path / "bin"))
    calls, lines = [], []
    monkeypatch.setattr(grid2_device, "sh", lambda name, argv, limit: calls.append((name, argv, limit)) or
                        SimpleNamespace(returncode=0))
    monkeypatch.setattr(grid2_device, "log", lines.append)
    grid2_device.make_shapes(["U"])
    assert [(n, a[1:4], a[-1]) for n, a, _ in calls] == [
        ("model-qwen2.5-3b", ["scripts/make_tiny_model.py", "--shape", "qwen2.5-3b"], str(models / "qwen2.5-3b"))]
    assert lines and lines[0].startswith("model qwen2.5-3b:")
    calls.clear()
    grid2_device.make_shapes(["S"])  # the grid's own shape only: nothing to make
    assert calls == []


def test_the_chain_measures_a_run_without_the_product_installed(tmp_path):
    """The device chain runs grid2 under the machine's python3, where verl_cluster is not installed (2026-12-02: a
    chain stopped after its first run on that import). -S: no site-packages, so only grid2's own loading counts."""
    doc = tmp_path / "run.json"
    doc.write_text((ROOT / "tests/fixtures/verl_runs/grid2_shared_queue/grid2-g2pad-m16.json").read_text())
    code = ("import json, sys; sys.path.insert(0, sys.argv[1]); import grid2; "
            "print(json.dumps(grid2.measured(json.load(open(sys.argv[2]))['steps'], 128)['step_s']))")
    r = subprocess.run([sys.executable, "-S", "-c", code, str(ROOT / "scripts/calibration"), str(doc)],
                       capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    want = grid2.measured(json.loads(doc.read_text())["steps"], 128)["step_s"]
    assert json.loads(r.stdout) == pytest.approx(want, rel=1e-9) and want > 0


def test_each_run_records_the_host_cpu_its_fixed_costs_ran_on():
    """The model's fixed and per-pass costs are the host's: a run's document names its machine's CPU."""
    got = grid2_device.host_cpu()
    lines = Path("/proc/cpuinfo").read_text().splitlines()
    first = {k: next(ln.split(":", 1)[1].strip() for ln in lines if ln.split(":")[0].strip() == k)
             for k in ("model name", "model", "cpu MHz", "bogomips")}
    speed = got.pop("host_python_ms")  # the Python probe (probe_node.host_python_ms): hosts of one CPU model differ
    steal = got.pop("host_steal_pct")  # the hypervisor's share meanwhile (None off Linux)
    assert steal is None or 0.0 <= steal <= 100.0
    assert got == {"model": first["model name"], "model_number": first["model"], "mhz": first["cpu MHz"],
                   "bogomips": first["bogomips"], "cores": os.cpu_count()}
    assert got["cores"] >= 1 and float(got["bogomips"]) > 0
    assert isinstance(speed, float) and speed > 0


def test_the_report_names_each_runs_host_speed_where_the_run_recorded_it():
    """Runs since the host probe carry host_cpu.host_python_ms: the report's card column says it beside the card,
    which alone does not tell hosts apart (docs/placement.md, "Batch V"); earlier runs show the card alone."""
    rounds = json.loads(grid2.PREDICTIONS.read_text())["rounds"]
    fix = ROOT / "tests/fixtures/verl_runs/grid2_results"
    old = json.loads((fix / "grid2-g1fa-m4.json").read_text())
    new = {**old, "host_cpu": {**old["host_cpu"], "host_python_ms": 27.94}}
    rep = grid2.report([new, json.loads((fix / "grid2-g1ppo15b-m8.json").read_text())], rounds)
    by = {r["run"]: r for r in rep["runs"]}
    assert by["g1fa-m4"]["host_python_ms"] == 27.94 and by["g1ppo15b-m8"]["host_python_ms"] is None
    md = grid2.markdown(rep)
    assert "| NVIDIA H100 80GB HBM3 (host 27.94 ms) |" in md and "| NVIDIA H100 80GB HBM3 | 0.359 |" in md


def test_host_cpu_runs_in_the_chains_python_without_the_package(tmp_path):
    """The chain runs grid2.py with scripts/calibration on its path and no verl_cluster installed: host_cpu finds
    the stdlib probe in the repository, and a run's record never waits on it."""
    code = ("import json, sys; sys.path.insert(0, %r); import grid2_device; print(json.dumps(grid2_device.host_cpu()))"
            % str(ROOT / "scripts/calibration"))
    r = subprocess.run([sys.executable, "-S", "-c", code], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["host_python_ms"] > 0 and got["cores"] >= 1 and "probe_error" not in got


def test_a_failing_host_probe_is_a_line_not_a_stopped_chain(tmp_path, monkeypatch):
    """A Python that is missing, or one whose output is torn: host_probe says so and returns; nothing raises."""
    import types

    monkeypatch.setattr(grid2_device, "OUT", tmp_path)
    missing = types.SimpleNamespace(PY=str(tmp_path / "no-python"), env=lambda: dict(os.environ))
    monkeypatch.setattr(grid2_device, "gm", lambda: missing)
    assert grid2_device.host_probe("setup").startswith("host probe (setup) failed: FileNotFoundError")
    torn = tmp_path / "torn.sh"
    torn.write_text("#!/bin/sh\necho '{\"probe\": 0, '\n")
    torn.chmod(0o755)
    monkeypatch.setattr(grid2_device, "gm", lambda: types.SimpleNamespace(PY=str(torn), env=lambda: dict(os.environ)))
    assert grid2_device.host_probe("end").startswith("host probe (end) failed: JSONDecodeError")


def test_the_layer_floor_is_read_at_the_chains_end_and_never_stops_it(tmp_path, monkeypatch):
    """layer_floor runs gpu_logprob_tail.py at the 0.5B shape and 4 sequences with flash-attn on the path wherever a
    padded run left it, keeps its rows in layer_floor.jsonl and says the floor a layer; a script that says why it
    could not run, or a Python that is missing, is a line."""
    import types

    monkeypatch.setattr(grid2_device, "OUT", tmp_path)
    fake = tmp_path / "py.sh"  # stands in for the site's Python: echoes its arguments and PYTHONPATH as the row
    fake.write_text('#!/bin/sh\necho "{\\"shape\\": \\"$3\\", \\"seqs\\": $5, \\"tokens\\": 1341, '
                    '\\"layers\\": 24, \\"layers_s\\": 0.055, \\"path\\": \\"$PYTHONPATH\\"}"\n')
    fake.chmod(0o755)
    site = types.SimpleNamespace(PY=str(fake), SITE=tmp_path / "site", env=lambda: dict(os.environ))
    monkeypatch.setattr(grid2_device, "gm", lambda: site)
    line = grid2_device.layer_floor("end")
    assert line == ("layer floor (end): 2.29 ms a layer (qwen2.5-0.5b, 4 sequences, 1341 tokens; the model's "
                    "FORWARD_SYNC_PASS_S is 2.0)")
    row = json.loads((tmp_path / "layer_floor.jsonl").read_text())
    assert row["when"] == "end" and row["path"].split(os.pathsep)[:2] == [str(grid2_device.FLASH_OFF), str(site.SITE)]
    said = tmp_path / "err.sh"
    said.write_text('#!/bin/sh\necho \'{"error": "no GPU (--cpu checks the script on the CPU)"}\'; exit 2\n')
    said.chmod(0o755)
    site.PY = str(said)
    assert grid2_device.layer_floor("end") == ("layer floor (end) gave nothing (rc 2): no GPU (--cpu checks the "
                                               "script on the CPU)")
    site.PY = str(tmp_path / "no-python")
    assert grid2_device.layer_floor("end").startswith("layer floor (end) failed: FileNotFoundError")


def test_the_layer_floor_before_the_runs_is_read_unless_it_would_cost_a_run(monkeypatch):
    """The chain reads the floor before its first run as well as at its end, but not when its ~40 s would leave a
    run out. Batch Y's session (BUDGET_S 880, ~140 s of setup): its first run fits either way and its second in
    neither, so the floor was read; with ~560 s left the first run fits only without it."""
    assert grid2_device.runs_that_fit([560, 510], 740) == 1 and grid2_device.runs_that_fit([560, 510], 700) == 1
    assert grid2_device.runs_that_fit([300, 560, 200], 540) == 2  # a later, shorter run still fits (decide's rule)
    read = []
    monkeypatch.setattr(grid2_device, "layer_floor", lambda when: read.append(when) or f"floor ({when})")
    monkeypatch.setattr(grid2_device, "need_s", lambda run: 560.0)
    for left, said in ((740, "floor (setup)"), (590, "layer floor before the runs skipped: its ~40s would cost a run "
                                                     "(590s of BUDGET_S left)")):
        monkeypatch.setattr(grid2_device, "T0", time.time() - (grid2_device.BUDGET_S - left))
        assert grid2_device.floor_before_runs(["Y"], ("g1ppo15b-m8-b",)) == said
    assert read == ["setup"]
