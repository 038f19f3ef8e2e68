"""Step time and host RAM: the model's parts against hand-computed values, and the plan against the recorded verl
runs on one H100 (tests/fixtures/verl_runs/calibration_runs.json; docs/BENCHMARKS.md "Host memory and step time").

The constants are fitted by scripts/calibration/fit_plan_calibration.py on the runs tagged "fit" only; the bounds on those
are the fit's residuals. The runs tagged "hold-out" were not fitted on: their bounds are what the model achieves
there, with a margin, and say where it misses the goal (step ±20%, phase ±30%, host ±15%)."""

import json
from pathlib import Path

import pytest

from verl_cluster.config.job import load_job
from verl_cluster.placement import parse_gpus, plan_job
from verl_cluster.placement import step_time as st
from verl_cluster.placement.model_shape import catalog_shape
from verl_cluster.placement.check_run import off, pairs
from verl_cluster.placement.settings import read_settings
from tests.harness.scripts import load_script, shipped_fit

ROOT = Path(__file__).resolve().parents[2]
RUNS = json.loads((ROOT / "tests/fixtures/verl_runs/calibration_runs.json").read_text())["runs"]
# the replay (job as it ran, recorded H100 facts, the run's own lengths) is the one scripts/calibration/calib_from_runs.py prints
CALIB = load_script("scripts/calibration/calib_from_runs.py")
FIT = load_script("scripts/calibration/fit_plan_calibration.py")
FIGURES = json.loads(FIT.FIGURES_FILE.read_text())["runs"]
TIME_FIT = sorted(n for n, r in RUNS.items() if r["time"] == "fit")
TIME_HOLD = sorted(n for n, r in RUNS.items() if r["time"] == "hold-out")
HOST_FIT = sorted(n for n, r in RUNS.items() if r["host"] == "fit")
HOST_HOLD = sorted(n for n, r in RUNS.items() if r["host"] == "hold-out")
# the fit's residuals: worst step -13.6% (ppo_0.5b) / +17.8% (g2fa-m32); worst phase over 0.5 s gen +59%
# (fit-offload15: three steps of one poll, one of two, where the model puts its generate just past one period: verl's
# poll counts whole periods, step_time.polls) and update_weights -59% (grpo_tiny, 0.73 s measured on an older
# machine vs 0.25-0.33 s since); host within 7.2% (fit-grpo15)
FIT_STEP_BOUND, FIT_PHASE_BOUND, FIT_HOST_BOUND = 0.25, 0.65, 0.10
# phases under half a second: held within 0.3 s, not by their ratio (worst: ref of fit-grpo15, 0.60 vs 0.43 s)
SHORT_S, SHORT_BOUND_S = 0.5, 0.3


@pytest.fixture(autouse=True)
def _home(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))


def replay(name, tmp_path):
    return CALIB.replay(RUNS[name], ROOT / "tests/fixtures/verl_logs", tmp_path)


def rows_of(name, tmp_path):
    plan, got = replay(name, tmp_path)
    return pairs(plan.predictions(), got)


def phase_rows(rows):
    return [r for r in rows if r["what"].startswith("time ") and r["what"] != "time step (s)"]


def step_row(rows):
    return next(r for r in rows if r["what"] == "time step (s)")


@pytest.mark.parametrize("name", HOST_FIT)
def test_host_ram_of_the_fit_runs(name, tmp_path):
    plan, got = replay(name, tmp_path)
    assert abs(plan.host_steady_gib / got["host_gib"] - 1) <= FIT_HOST_BOUND, (name, plan.host_steady_gib, got)


def test_host_ram_hold_outs(tmp_path):
    """Not fitted on: PPO 0.5B -2.9%, GRPO 0.5B padded +1.0%, and batches C and D, run after the model took its
    form: PPO 1.5B with actor and critic offloaded -6.2% (72.4 GiB measured), GRPO 3B n=8 -3.9%, GRPO 0.5B with 256
    sequences -2.8%, GRPO 1.5B with 512 sequences +5.5%. Held within 8% (the goal is 15%)."""
    assert HOST_HOLD == ["hold-grpo05wide", "hold-grpo15big", "hold-grpo3n8", "hold-padded05", "hold-ppo15off",
                         "ppo_0.5b"]
    for name in HOST_HOLD:
        plan, got = replay(name, tmp_path / name)
        assert abs(plan.host_steady_gib / got["host_gib"] - 1) <= 0.08, (name, plan.host_steady_gib, got["host_gib"])


@pytest.mark.parametrize("name", TIME_FIT)
def test_step_time_residuals_of_the_fit_runs(name, tmp_path):
    rows = rows_of(name, tmp_path)
    assert abs(step_row(rows)["error"]) <= FIT_STEP_BOUND, rows
    phases = phase_rows(rows)
    assert len(phases) >= 5
    long = [r for r in phases if r["measured"] >= SHORT_S]
    assert not off(long, FIT_PHASE_BOUND), off(long, FIT_PHASE_BOUND)
    assert all(abs(r["predicted"] - r["measured"]) <= SHORT_BOUND_S for r in phases if r["measured"] < SHORT_S)


HOLD_PHASES = {
    "hold-padded05": {"gen", "old_log_prob", "ref", "adv", "update_actor", "update_weights"},
    "hold-grpo3n8": {"gen", "old_log_prob", "ref", "adv", "update_actor", "update_weights"},
    "hold-grpo05wide": {"gen", "old_log_prob", "ref", "adv", "update_actor", "update_weights"},
    "hold-ppo15off": {"gen", "old_log_prob", "values", "update_critic", "adv", "update_actor", "update_weights"},
    "hold-grpo15big": {"gen", "old_log_prob", "ref", "adv", "update_actor", "update_weights"},
}


# a held-out phase over half a second that misses the ±30% goal, and the bound it is held to: since verl's poll counts
# whole periods (the refit of 2026-11-29) a generate the model places just past a period costs a period more (gen
# +34.6%: three steps of two polls, one of three, the model's three)
HOLD_MISSES = {("hold-grpo3n8", "gen"): 0.35}


@pytest.mark.parametrize("name", sorted(HOLD_PHASES))
def test_step_time_hold_outs(name, tmp_path):
    """Not fitted on (the goal: step ±20%, phase ±30%); since issue 33's terms (per-pass floors, padding to the micro
    batch's longest, verl's per-token loop without flash-attn, an update's micro batches bound by the longer of the
    host's and the GPU's work) they were seen while those terms took their form, not blind. At the second refit
    (2026-11-29, verl's poll in whole periods): GRPO 0.5B with SDPA and no remove-padding: step +3.1% (old_log_prob
    -17.9%). PPO 1.5B with actor and critic offloaded +9.5% (update_actor +26.1%), GRPO 3B n=8 with 1024-token
    responses +19.0% (gen +26.9%), GRPO 0.5B with 256 sequences of 256 tokens +3.8%, GRPO 1.5B with 512 sequences
    +8.6% (gen +21.9%). Phases under half a second by their seconds: within 0.15 s."""
    assert TIME_HOLD == sorted(HOLD_PHASES)
    rows = rows_of(name, tmp_path)
    assert abs(step_row(rows)["error"]) <= 0.20, rows
    by = {r["what"][5:-4]: r for r in phase_rows(rows)}
    assert set(by) == HOLD_PHASES[name]
    for phase, r in by.items():
        if r["measured"] >= SHORT_S:
            assert abs(r["error"]) <= HOLD_MISSES.get((name, phase), 0.30), r
        else:
            assert abs(r["predicted"] - r["measured"]) <= 0.15 + 1e-9, r


def test_the_constants_are_the_fit(capsys):
    """The modules' fitted constants are what scripts/calibration/fit_plan_calibration.py gives on the fit runs."""
    assert FIT.main(["--check"]) == 0, capsys.readouterr().out


def test_the_fit_uses_only_the_fit_runs(tmp_path):
    """Leaving out the runs held out in both roles, and the multi-GPU runs only seen, changes no constant."""
    doc = json.loads((ROOT / "tests/fixtures/verl_runs/calibration_runs.json").read_text())
    figs = json.loads(FIT.FIGURES_FILE.read_text())
    grid2 = json.loads(FIT.GRID2_FILE.read_text())
    before, _, _ = shipped_fit()
    doc["runs"] = {n: r for n, r in doc["runs"].items() if "fit" in (r["time"], r["host"])}
    figs["runs"] = {n: r for n, r in figs["runs"].items() if r["time"] == "fit"}
    grid2["runs"] = {n: r for n, r in grid2["runs"].items() if r["time"] == "fit"}
    for name, d in (("runs", doc), ("figs", figs), ("grid2", grid2)):
        (tmp_path / f"{name}.json").write_text(json.dumps(d))
    after, rows, _ = FIT.fit(tmp_path / "runs.json", [tmp_path / "figs.json", tmp_path / "grid2.json"])
    assert before == after
    assert {r["run"] for r in rows} == set(doc["runs"]) | set(figs["runs"]) | set(grid2["runs"])
    assert set(figs["runs"]) == {"2node-grpo05"} and grid2["runs"]


def test_the_compute_phases_of_the_largest_run_within_ten_percent(tmp_path):
    """The GRPO 0.5B run (no flash-attn: its log-probs are verl's per-token loop) has the longest phases: its forward
    and update phases within 10%, old_log_prob within 11% (-10.3% since the packed passes' logits became their tail,
    2026-12-07: the fit moved the shared host terms a little; -10.0% before)."""
    plan, got = replay("grpo_0.5b", tmp_path)
    rows = {r["what"]: r["error"] for r in pairs(plan.predictions(), got)}
    for phase in ("gen", "old_log_prob", "ref", "update_actor"):
        assert abs(rows[f"time {phase} (s)"]) <= (0.11 if phase == "old_log_prob" else 0.10), rows


# ---- the parts, by hand ----

def test_forward_and_update_flops_by_hand():
    # 1e9 params, 1e6 tokens: forward 2e15 FLOPs at 989 TFLOPs x the compute share, + the fixed cost
    share = st.COMPUTE_SHARE
    assert st.seconds(st.forward_terms(1e9, 1e6, 989)) == pytest.approx(st.FORWARD_FIXED_S + 2e15 / (989e12 * share))
    # the update: 6N per token, 8N with recompute
    base = st.UPDATE_FIXED_S
    no_ckpt = st.seconds(st.update_terms(1e9, 1e6, 989, recompute=False)) - base
    ckpt = st.seconds(st.update_terms(1e9, 1e6, 989, recompute=True)) - base
    assert no_ckpt == pytest.approx(6e15 / (989e12 * st.COMPUTE_SHARE))
    assert ckpt / no_ckpt == pytest.approx(8 / 6)
    # each micro batch's pass through each layer has its floor: 4 micro batches x 24 layers
    assert st.seconds(st.forward_terms(0, 0, 989, passes=4 * 24)) == pytest.approx(
        st.FORWARD_FIXED_S + 96 * st.FORWARD_PASS_S)
    assert st.seconds(st.update_terms(0, 0, 989, True, epochs=2, passes=96)) == pytest.approx(
        st.UPDATE_FIXED_S + 2 * 96 * st.UPDATE_PASS_S)


def test_logits_are_read_at_hbm_speed_by_hand():
    # 1e4 tokens x 151936 vocab over 3350 GB/s = 0.4535 ms per byte per entry; the forward reads LOGIT_FORWARD_BYTES
    reads = 1e4 * 151936 / 3350e9
    with_logits = st.seconds(st.forward_terms(0, 1e4, 989, reads)) - st.FORWARD_FIXED_S
    assert with_logits == pytest.approx(reads * st.LOGIT_FORWARD_BYTES)
    assert reads * 1e3 == pytest.approx(0.4535, abs=1e-4)
    assert st.seconds(st.update_terms(0, 1e4, 989, True, epochs=2, logit_reads=reads)) == pytest.approx(
        st.UPDATE_FIXED_S + 2 * reads * st.LOGIT_UPDATE_BYTES)


def test_without_flash_attn_the_log_probs_loop_per_token_whatever_the_vocab_or_gpu(tmp_path):
    """verl 0.9.1's logprobs_from_logits_v2 (no flash-attn cross-entropy) runs a log_softmax and a gather per real
    token from Python: a cost per token of the host, the same for the tiny model's vocab and Qwen's 151936, on an
    H100 and an H200 (the model scaled it by vocab over HBM before: the tiny model's loop cost nothing)."""
    tiny, _ = replay("grpo_tiny", tmp_path / "tiny")
    big, _ = replay("grpo_0.5b", tmp_path / "big")
    for p in (tiny, big):
        t = p.terms["time"]
        real = t["ref"]["LOOP_FORWARD_TOKEN_S"]
        assert real > 1000 and t["old_log_prob"]["LOOP_FORWARD_TOKEN_S"] == real
        assert t["update_actor"]["LOOP_UPDATE_TOKEN_S"] == real  # the same real tokens, one epoch
    # the tiny run: 32 sequences of 1536 tokens at its fill (verl's perf/total_num_tokens over the worst case)
    tiny_args = RUNS["grpo_tiny"]["args"] + ["model.catalog=qwen2.5-0.5b"]  # the shape does not change the lengths
    s = read_settings(load_job(ROOT / RUNS["grpo_tiny"]["job"], tiny_args))
    assert tiny.terms["time"]["ref"]["LOOP_FORWARD_TOKEN_S"] == pytest.approx(s.sequences * s.seq_len * tiny.fill)
    # with flash-attn importable there is no loop
    packed, _ = replay("fit-grpo15", tmp_path / "packed")
    assert not packed.terms["time"]["ref"].get("LOOP_FORWARD_TOKEN_S")
    # an H200 (faster HBM) takes the loop as long as an H100; what is read over HBM goes faster
    from dataclasses import replace

    from verl_cluster.facts.model import NodeFacts, from_json

    h100 = from_json(NodeFacts, (ROOT / "tests/fixtures/facts/h100x1.json").read_text())
    h100 = replace(h100, versions={k: v for k, v in h100.versions.items() if k != "flash_attn"})
    h200 = from_json(NodeFacts, (ROOT / "tests/fixtures/facts/h200x1_recorded.json").read_text())
    job = load_job(ROOT / "launch/gsm8k_grpo.yaml", ["data.train_batch_size=16", "actor_rollout_ref.rollout.n=4",
                                                      "actor_rollout_ref.actor.ppo_mini_batch_size=8"])
    on = {g: plan_job(job, [f], fill=0.3).terms["time"]["ref"] for g, f in (("h100", h100), ("h200", h200))}
    assert on["h100"]["LOOP_FORWARD_TOKEN_S"] == on["h200"]["LOOP_FORWARD_TOKEN_S"] > 0
    assert on["h200"]["LOGIT_FORWARD_BYTES"] == pytest.approx(on["h100"]["LOGIT_FORWARD_BYTES"] * 3350 / 4800)


def test_padded_micro_batches_hold_their_longest_sequence_by_hand():
    """Without use_remove_padding verl 0.9.1 pads each micro batch to its longest sequence (transformer_impl.py,
    to_padded_tensor at max_seq_len), not to max_prompt_length + max_response_length: the longest of m lengths spread
    evenly around their mean, none past a response at its limit."""
    assert st.padded_len(1, 340, 579) == pytest.approx(340)  # one sequence: no padding
    # 8 sequences with mean 340 (0.38 x 896), the longest a 512 x 0.38 prompt and a 384 response (578.6):
    # lengths on [101.4, 578.6], the longest of 8 at 101.4 + 477.2 x 8/9 = 525.6
    assert st.padded_len(8, 340.48, 578.56) == pytest.approx(102.4 + 476.16 * 8 / 9, abs=1.0)
    assert st.padded_len(8, 896, 896) == 896  # at the worst case every sequence is full
    assert st.padded_len(64, 100, 1536) == pytest.approx(200 * 64 / 65)  # a short mean: lengths on [0, 2 x mean]


def test_ref_params_uploaded_per_micro_batch_by_hand():
    # 1.5e9 fp32 params, 2 micro batches over 20 GB/s: 2 * 4 * 1.5e9 / 20e9 = 0.6 s, less the 0.1 s of compute they
    # overlap; 4 GPUs copy a quarter each (0.15 s); a forward longer than the copy hides it
    assert st.REF_PARAM_BYTES == 4
    assert st.ref_upload_s(1.5e9, 2, 1, 0.1, 20) == pytest.approx(0.5)
    assert st.ref_upload_s(1.5e9, 2, 4, 0.1, 20) == pytest.approx(0.05)
    assert st.ref_upload_s(1.5e9, 2, 1, 1.0, 20) == 0.0
    # on the H100's PCIe 5.0 host (55.1 GB/s measured, 55 in the catalog): 1.2e10 / 55e9 - 0.1 = 0.1182 s
    assert st.ref_upload_s(1.5e9, 2, 1, 0.1, st.gpu_speed("NVIDIA H100 80GB HBM3")[0].pcie_gbs) == pytest.approx(
        0.1182, abs=1e-4)


def test_entropy_in_the_actors_log_prob_only(tmp_path):
    # fit-grpo15 (packed, one GPU): 30250.5 tokens x 151936 vocab / 3350 GB/s = 1.3720 ms per byte per entry, in the
    # actor's log-prob and not the ref; the ref's upload: 4 B x 1543714304 params / 55 GB/s = 0.1123 s, hidden by
    # the forward's 2 * 1543714304 * 30250.5 FLOPs at 0.4 x 989 TFLOPs = 0.2361 s -> 0
    plan, _ = replay("fit-grpo15", tmp_path)
    old, ref = plan.terms["time"]["old_log_prob"], plan.terms["time"]["ref"]
    assert old["ENTROPY_BYTES"] * 1e3 == pytest.approx(30250.5 * 151936 / 3350e9 * 1e3, rel=1e-3)
    assert old["ENTROPY_BYTES"] * 1e3 == pytest.approx(1.3720, abs=2e-3)
    assert "ENTROPY_BYTES" not in ref and "ENTROPY_EAGER_BYTES" not in ref
    assert {k: v for k, v in old.items() if k not in ("ENTROPY_BYTES", "")} == {k: v for k, v in ref.items() if k}
    assert 4 * 1543714304 / 55e9 < 2 * 1543714304 * 30250.5 / (0.4 * 989e12) and ref[""] == 0.0
    # without remove-padding the log-probs take the real tokens, the entropy every position computed, with the plain
    # (not compiled) function
    plan, _ = replay("hold-padded05", tmp_path / "padded")
    old = plan.terms["time"]["old_log_prob"]
    assert "ENTROPY_BYTES" not in old and old["ENTROPY_EAGER_BYTES"] > 1.5 * old["LOGIT_FORWARD_BYTES"] > 0


def test_decode_step_is_bytes_over_bandwidth():
    # 14 GB of weights + 2 GB of KV on 3350 GB/s at 70%: 16e9 / 2.345e12 = 6.82 ms
    got = st.decode_read_s(14e9, 2e9, 3350)
    assert got == pytest.approx(16e9 / (3350e9 * 0.7))
    assert got * 1e3 == pytest.approx(6.823, abs=0.001)


def test_terms_add_up_to_the_phases(tmp_path):
    plan, _ = replay("fit-ppo15", tmp_path)
    for phase, terms in plan.terms["time"].items():
        assert st.seconds(terms) == pytest.approx(plan.time["phases_s"][phase], abs=0.006), phase
    assert st.const("1/COMPUTE_SHARE") == 1 / st.COMPUTE_SHARE and st.const("") == 1.0
    assert st.const("UPDATE_PASS_S") == st.UPDATE_PASS_S


def test_fsdp_traffic_by_hand():
    """torch's FSDP1 FULL_SHARD (verl 0.9.1's default strategy "fsdp", reshard_after_forward true): per micro batch
    each decoder layer is gathered for the forward and again for the backward (gradient checkpointing recomputes
    inside the layer, after that gather), the root unit once (_post_forward_reshard keeps the root), and every
    gradient is reduce-scattered in fp32 (reduce_dtype; use_no_sync_for_gradient_accumulation is false)."""
    # 7e9 params of which 1e9 root: 2 B x (2 x 6e9 + 1e9) = 26 GB gathered + 4 B x 7e9 = 28 GB reduce-scattered;
    # 8 GPUs move 7/8 of it; 4 micro batches over 330 GB/s: 4 x 54e9 x 0.875 / 330e9 = 0.5727 s
    assert st.fsdp_comm_s(7e9, 1e9, 2, 8, 4, 330) == pytest.approx(4 * 54e9 * 0.875 / 330e9)
    assert st.fsdp_comm_s(7e9, 1e9, 2, 1, 4, 330) == 0.0
    # a forward gathers each layer once per micro batch and the root once: (4 x 2 x 6e9 + 2 x 1e9) x 0.875 / 330e9
    assert st.fsdp_forward_comm_s(7e9, 1e9, 2, 8, 4, 330) == pytest.approx(50e9 * 0.875 / 330e9)
    # update_weights across ranks: FSDP1's sharded state dict unshards in fp32, full_tensor() gathers again
    assert st.sync_comm_s(494032768, 2, 2.4, fsdp2=False) == pytest.approx(2 * 4 * 494032768 * 0.5 / 2.4e9)
    assert st.sync_comm_s(494032768, 2, 2.4, fsdp2=True) == pytest.approx(4 * 494032768 * 0.5 / 2.4e9)
    assert st.sync_comm_s(494032768, 1, 2.4, fsdp2=False) == 0.0


def test_the_two_node_run_by_hand(tmp_path):
    """The two-node GRPO 0.5B run (2x H200, NCCL over a socket at 2.4 GB/s, micro 8 / log-prob 16, 128 sequences:
    64 a rank, 8 update and 4 log-prob micro batches): its FSDP traffic, exposed beyond the layers' FLOPs, the
    weights gathered twice in fp32 for update_weights and the ranks' fixed cost, eager decode per layer."""
    plan, got = FIT.replay_figures(FIGURES["2node-grpo05"], tmp_path)
    shape = catalog_shape("qwen2.5-0.5b")
    n, root, bus = 2, shape.root_params, 2.4
    t = plan.terms["time"]
    update = st.fsdp_comm_s(shape.params, root, 2, n, 8, bus)
    assert update == pytest.approx(8 * (2 * (2 * (shape.params - root) + root) + 4 * shape.params) / 2 / 2.4e9)
    assert t["update_actor"]["COMM_S"] == pytest.approx(update - st.flops_s(t["update_actor"]))  # GPU-bound
    # GPU-bound: the layers' launches (8 x 24 passes) hide behind the gathers; the LM head's host work does not
    assert t["update_actor"]["UPDATE_PASS_S"] == 0.0 and t["update_actor"]["UPDATE_LM_MICRO_S"] == 8
    fwd = st.fsdp_forward_comm_s(shape.params, root, 2, n, 4, bus)
    assert t["old_log_prob"]["COMM_S"] == pytest.approx(fwd - st.flops_s(t["old_log_prob"]))  # GPU-bound too
    assert t["old_log_prob"]["FORWARD_PASS_S"] == 0.0 and t["old_log_prob"]["FORWARD_LM_MICRO_S"] == 4
    assert t["update_weights"]["SYNC_RANKS_S"] == 1.0
    assert t["update_weights"][""] == pytest.approx(st.sync_comm_s(shape.params, n, bus, False)
                                                    + 2 * shape.params / (4800e9 * st.HBM_SHARE))
    # enforce_eager: every one of the 384 decode steps launches 24 layers' kernels from Python
    assert t["gen"]["EAGER_STEP_S"] == 384 and t["gen"]["EAGER_LAYER_STEP_S"] == 384 * 24
    # held against verl's means over steps 2-4
    rows = {r["what"]: r for r in pairs(plan.predictions(), got)}
    assert rows["time step (s)"]["measured"] == pytest.approx(10.18 + 2.58 + 2.21 + 0.11 + 10.92 + 1.52, abs=0.02)


def test_every_gpu_in_the_catalog_is_found_by_its_nvml_name():
    """The first fragment a name contains wins: a fragment inside an earlier one (H100 in "H100 PCIe") must come
    after it, or that GPU would be read as another (a PCIe H100 planned with NVLink's bandwidth)."""
    for frag, speed in st.GPU_SPEEDS:
        assert st.gpu_speed(f"NVIDIA {frag} 80GB") == (speed, True), frag
    pcie, sxm = st.gpu_speed("NVIDIA H100 PCIe")[0], st.gpu_speed("NVIDIA H100 80GB HBM3")[0]
    assert pcie.link_gbs < sxm.link_gbs  # as NVML spells the two cards
    assert st.gpu_family("NVIDIA H100 80GB HBM3") == "H100" and st.gpu_family("NVIDIA H100 PCIe") == "H100 PCIe"
    sp, known = st.gpu_speed("Some Future GPU")
    assert not known and sp == st.UNKNOWN_GPU and st.gpu_family("Some Future GPU") == "Some Future GPU"


def test_more_gpus_across_nodes_use_the_network():
    one = plan_job(load_job(ROOT / "launch/gsm8k_grpo.yaml", ["model.catalog=qwen2.5-7b"]), parse_gpus("1x8xH100-80GB"))
    two = plan_job(load_job(ROOT / "launch/gsm8k_grpo.yaml", ["model.catalog=qwen2.5-7b"]), parse_gpus("2x8xH100-80GB"))
    assert one.time and two.time
    # twice the GPUs: the update's compute halves but its FSDP traffic goes over 12.5 GB/s instead of NVLink
    assert two.time["phases_s"]["update_actor"] > 0.5 * one.time["phases_s"]["update_actor"]


def test_offload_costs_time_and_host_ram():
    job = load_job(ROOT / "launch/gsm8k_grpo.yaml", ["model.catalog=qwen2.5-7b"])
    free = plan_job(job, parse_gpus("1x8xH100-80GB"))
    off_job = load_job(ROOT / "launch/gsm8k_grpo.yaml", ["model.catalog=qwen2.5-7b",
                                                          "actor_rollout_ref.actor.fsdp_config.param_offload=true",
                                                          "actor_rollout_ref.actor.fsdp_config.optimizer_offload=true"])
    offl = plan_job(off_job, parse_gpus("1x8xH100-80GB"))
    assert offl.offload == "param+optimizer" and free.offload == "none"
    assert offl.time["phases_s"]["update_actor"] > free.time["phases_s"]["update_actor"]
    assert offl.host_gib_per_node > free.host_gib_per_node


def test_host_ram_that_does_not_fit_is_the_binding_constraint():
    job = load_job(ROOT / "launch/gsm8k_grpo.yaml", ["model.catalog=qwen2.5-7b"])
    p = plan_job(job, parse_gpus("1x8xH100-80GB", host_mem_gib=64))
    assert not p.feasible and p.binding.startswith("host memory:"), p.binding
    assert "GPU worker processes" in p.binding and "64.0 GiB RAM" in p.binding
    roomy = plan_job(job, parse_gpus("1x8xH100-80GB", host_mem_gib=1024))
    assert roomy.feasible and 64 < roomy.host_gib_per_node < 1024


def test_plan_json_carries_time_and_host_parts(capsys):
    from verl_cluster.cli import main

    assert main(["plan", str(ROOT / "launch/gsm8k_grpo.yaml"), "--gpus", "1x8xH100-80GB", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    t = doc["time"]
    assert t["step_s"] == pytest.approx(sum(t["phases_s"].values()), abs=0.05)
    assert {"gen", "old_log_prob", "ref", "update_actor", "update_weights"} <= set(t["phases_s"])
    assert doc["host_parts_gib"] and doc["host_gib_per_node"] >= doc["host_steady_gib_per_node"]


def test_a_setting_that_does_not_fit_shows_no_step_time(capsys):
    """1.5B on one 24 GiB GPU: the setting as written leaves vLLM no KV cache, and its "time" (thousands of seconds)
    is no prediction; the feasible options carry theirs."""
    from verl_cluster.cli import main

    args = ["plan", str(ROOT / "launch/gsm8k_grpo.yaml"), "--gpus", "1x1xRTX4090-24GB", "model.catalog=qwen2.5-1.5b"]
    assert main(args) == 1
    out = capsys.readouterr().out
    assert "step time: not predicted for a setting that does not fit (each feasible plan above shows its own)" in out
    assert "step time (predicted" not in out and "s/step" in out  # the options' own times


@pytest.mark.parametrize("name", ["fit-grpo15", "hold-padded05"])
def test_a_run_is_held_against_the_plan_at_its_own_lengths(name, tmp_path):
    """submit plans at the worst case (every response max_response_length long) and the run's responses were
    shorter: the plan it kept is read at the fill the run had (verl's perf/total_num_tokens), so the self-check
    says what the replay at the run's lengths says, not the worst case's step time."""
    from dataclasses import replace

    from verl_cluster.facts.model import NodeFacts, from_json
    from verl_cluster.placement.check_run import at_run_lengths

    entry = RUNS[name]
    replayed, got = replay(name, tmp_path)
    facts = from_json(NodeFacts, (ROOT / "tests/fixtures/facts/h100x1.json").read_text())
    if not entry["flash_attn"]:
        facts = replace(facts, versions={k: v for k, v in facts.versions.items() if k != "flash_attn"})
    worst = plan_job(load_job(ROOT / entry["job"], list(entry["args"])), [facts])  # fill 1, as submit plans it
    kept = json.loads(json.dumps(worst.predictions()))  # as the job's metadata keeps it
    assert kept["fill"] == 1.0 and kept["by_fill"][-1][0] == 1.0
    phases, fill = at_run_lengths(kept, got)
    assert 0.2 < fill < 0.6  # random-init models stop early: far from the worst case
    at_lengths, as_planned = step_row(pairs(kept, got)), kept["step_s"] / got["step_s"] - 1
    assert as_planned > 0.5  # held against the worst case, every run looked far off
    assert at_lengths["error"] == pytest.approx(step_row(rows_of(name, tmp_path))["error"], abs=0.08)
    assert abs(at_lengths["error"]) < FIT_STEP_BOUND
    assert set(phases) == set(kept["phases_s"])


def test_gae_offloaded_sync_and_the_critics_tokens_by_hand(tmp_path):
    # GAE loops over the response positions (fit-ppo05: max_response_length 1024); GRPO's advantages do not
    ppo, _ = replay("fit-ppo05", tmp_path / "ppo")
    assert ppo.terms["time"]["adv"] == {"ADV_S": 1.0, "ADV_SEQ_S": 128, "GAE_STEP_S": 1024}
    grpo, _ = replay("fit-grpo15", tmp_path / "grpo")
    assert grpo.terms["time"]["adv"]["GAE_STEP_S"] == 0.0
    # the critic's values pass: a per-token cost on the run's packed tokens, verl's perf/total_num_tokens of
    # steps 2-5 (66172, 61315, 71090, 67920: mean 66624.25), the tokens its FLOPs are counted on too
    values = ppo.terms["time"]["values"]
    assert values["FORWARD_TOKEN_S"] == pytest.approx(66624.25)
    critic = catalog_shape("qwen2.5-0.5b").value_model_params
    assert values["1/COMPUTE_SHARE"] == pytest.approx(2 * critic * 66624.25 / 989e12)
    # with param offload update_weights loads the fp32 params and offloads them again over 55 GB/s:
    # 2 x 4 B x 1543714304 / 55e9 = 0.22454 s, + the bf16 weights read once at 70% of 3350 GB/s, 1.317 ms
    off, _ = replay("fit-offload15", tmp_path / "off")
    assert off.terms["time"]["update_weights"][""] == pytest.approx(0.22454 + 0.001317, abs=2e-4)
    assert grpo.terms["time"]["update_weights"][""] == pytest.approx(0.001317, abs=1e-5)


def test_checkpoint_save_on_the_host_by_verls_save_path(tmp_path):
    """fit-ppo05 saved actor + critic every 3 steps on one H100: the node's RAM rose 0.55 GiB during the 14.7 s
    saves (sampled, 24.9 -> 25.4 GiB). FSDP1 on one GPU runs NO_SHARD (a full state-dict clone on the GPU) and
    torch.save streams it through one CPU copy a tensor: the largest, the 151936 x 896 embedding, in fp32."""
    from verl_cluster.placement.host_memory import CHECKPOINT_PART, save_copy_bytes

    plan, got = replay("fit-ppo05", tmp_path)
    assert plan.host_parts[CHECKPOINT_PART] == pytest.approx(4 * 151936 * 896 / 2**30, abs=1e-3)  # 0.507 GiB
    sampled = RUNS["fit-ppo05"]["sampled"]
    assert abs(sampled["peak_used_gib"] - got["host_gib"] - plan.host_parts[CHECKPOINT_PART]) < 0.1
    # FSDP1 on 8 GPUs: each rank's model shard (4 B x params / 8) and the root unit's, on the CPU at once;
    # FSDP2 streams its shards: the largest one
    shape = catalog_shape("qwen2.5-7b")
    assert save_copy_bytes(shape, "actor", 8, False) == 4 * (shape.params + shape.root_params) / 8
    assert save_copy_bytes(shape, "actor", 8, True) == 4 * shape.vocab * shape.hidden / 8
    assert save_copy_bytes(shape, "critic", 1, False) == 4 * shape.vocab * shape.hidden


def test_an_update_takes_the_longer_of_host_and_gpu_by_hand():
    """step_time.bound: on one rank (NO_SHARD) every host term runs beside the GPU's, so the longer side is kept; on
    more ranks only the layers' launches do, and the LM head's host work stays whatever binds."""
    t = {"UPDATE_FIXED_S": 1.0, "UPDATE_PASS_S": 384, "UPDATE_LM_MICRO_S": 16, "LOOP_UPDATE_TOKEN_S": 0.0,
         "1/COMPUTE_SHARE": 0.17, "LOGIT_UPDATE_BYTES": 0.0, "COMM_S": 0.0, "": 0.0}
    one = st.bound(t, 1)  # host: 16 micro batches of 0.284 s + 384 passes >> the GPU's 0.43 s
    assert one["1/COMPUTE_SHARE"] == 0.0 and one["UPDATE_LM_MICRO_S"] == 16 and one["UPDATE_PASS_S"] == 384
    assert st.seconds(one) == pytest.approx(st.UPDATE_FIXED_S + 16 * st.UPDATE_LM_MICRO_S + 384 * st.UPDATE_PASS_S)
    big = st.bound({**t, "1/COMPUTE_SHARE": 4.0}, 1)  # 10 s of FLOPs: the host's 4.97 s hide behind them
    assert big["UPDATE_LM_MICRO_S"] == 0.0 and big["1/COMPUTE_SHARE"] == 4.0
    two = st.bound({**t, "1/COMPUTE_SHARE": 4.0}, 2)  # sharded: the LM head's host work is serial all the same
    assert two["UPDATE_LM_MICRO_S"] == 16 and two["UPDATE_PASS_S"] == 0.0 and two["1/COMPUTE_SHARE"] == 4.0
    assert st.seconds(two) > st.seconds(big)


SEEN_T_U = ("g1fa-m16", "g1ppo-m16", "g1pad-m16", "g1fa15b-m8", "g1fa3b-m8")  # grid2.SEEN


def test_the_logits_are_a_packed_passs_tail_and_take_t_and_u_unfitted():
    """A packed forward pass syncs in every layer (transformers rebuilds the packing from position_ids) and at the
    end of each micro batch (verl's `.item()`), so its logits' passes (flash-attn's cross-entropy, the compiled
    entropy) run after the host's launches, not under them: the plan adds them to whichever side binds
    (step_time.TAIL; docs/placement.md, "The logits after the last sync"). Refitted on the same fit runs, T's and U's
    five (one H200, 2026-12-02; old_log_prob -25...-35% by round 3278625, not fitted on: seen) come within the target's
    bounds: step within ±10%, every phase over half a second within ±30% (old_log_prob -3...-22% since the fourth
    refit); the padded pass (SDPA, no per-layer sync) keeps them on the GPU's side (hold-padded05's ref -5%)."""
    _, rows, _ = shipped_fit()
    by = {r["run"]: {x["what"]: x for x in r["rows"]} for r in rows}
    roles = {r["run"]: r["time"] for r in rows}
    for n in SEEN_T_U:
        assert roles[n] == "seen"
        assert abs(by[n]["step"]["error"]) <= 0.10, by[n]
        phases = {w: x for w, x in by[n].items() if w != "step" and x["measured"] >= SHORT_S}
        assert all(abs(x["error"]) <= 0.30 for x in phases.values()), by[n]
        assert -0.25 < by[n]["old_log_prob"]["error"] < 0.05
    assert abs(by["hold-padded05"]["ref"]["error"]) <= 0.10
    host, gpu = st.sides({"FORWARD_FIXED_S": 1.0, "FORWARD_SYNC_PASS_S": 0.0})  # packed: the tail is on neither side
    assert set(st.TAIL["FORWARD_FIXED_S"]).isdisjoint(host + gpu)
    _, padded_gpu = st.sides({"FORWARD_FIXED_S": 1.0})
    assert set(st.TAIL["FORWARD_FIXED_S"]) <= set(padded_gpu)
