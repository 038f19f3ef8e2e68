"""scripts/gpu/gpu_logprob_tail.py, the device check of a log-prob micro batch's parts (docs/placement.md, "The third
refit"), runs on the CPU with --cpu: a 2-layer shape, the same code path but for flash-attn and the sync count, so a
device session does not find its bugs."""

import json
import subprocess
import sys
from pathlib import Path

from tests.harness.scripts import load_script

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts/gpu/gpu_logprob_tail.py"


def test_the_micro_batch_is_timed_in_its_parts_on_the_cpu():
    r = subprocess.run([sys.executable, str(SCRIPT), "--cpu", "--seqs", "3", "2", "--repeat", "1"],
                       capture_output=True, text=True, timeout=240, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-3000:]
    docs = [json.loads(line) for line in r.stdout.splitlines()]
    assert [d["seqs"] for d in docs] == [3, 2]
    for d in docs:
        # the batch's lengths about grid2's (300-380 tokens a sequence), fixed
        assert 300 * d["seqs"] <= d["tokens"] <= 380 * d["seqs"]
        assert d["card"] == "cpu" and d["entropy"] == "eager" and d["layers"] == 2 and d["shape"] == "cpu-2-layer"
        assert d["syncs_layers_position_ids"] is None and d["syncs_layers_varlen"] is None  # counted on a GPU only
        assert all(d[k] > 0 for k in ("layers_s", "layers_varlen_s", "tail_s", "tail_eager_entropy_s", "whole_s"))
        assert abs(d["whole_less_parts_s"] - (d["whole_s"] - d["layers_s"] - d["tail_s"])) <= 2e-4  # rounded to 0.1 ms


def test_an_unknown_shape_is_exit_2_naming_the_shapes():
    r = subprocess.run([sys.executable, str(SCRIPT), "--cpu", "--shape", "qwen9-1t"], capture_output=True, text=True,
                       timeout=240, cwd=ROOT)
    assert r.returncode == 2 and "qwen2.5-3b" in json.loads(r.stdout)["error"]


def test_without_a_gpu_it_says_so_and_exits_2():
    r = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, timeout=240, cwd=ROOT)
    assert r.returncode == 2 and "no GPU" in json.loads(r.stdout)["error"]


RECORDED = ROOT / "tests/fixtures/gpu/logprob_tail_h100.jsonl"  # 2026-12-07, one H100, verl 0.9.1's site


def test_the_recorded_h100_micro_batch_runs_its_tail_after_its_layers():
    """What step_time.TAIL says of a packed log-prob pass, on the device: the whole micro batch took the layers'
    time plus the tail's (within 2.3 ms), not the larger of the two; the layers were host-bound (the same ~50 ms
    from 1,341 to 10,861 tokens), with 5 syncs a layer from position_ids alone and none with the varlen arguments;
    verl's compiled entropy made the tail 3-4x shorter than the eager one (use_torch_compile=false)."""
    from verl_cluster.placement import step_time

    docs = [json.loads(line) for line in RECORDED.read_text().splitlines()]
    assert [d["seqs"] for d in docs] == [32, 16, 4] and all(d["entropy"] == "compiled" for d in docs)
    for d in docs:
        parts = d["layers_s"] + d["tail_s"]
        assert abs(d["whole_s"] - parts) <= 0.05 * d["whole_s"]  # serial: the sum, not the larger part
        assert d["whole_s"] - max(d["layers_s"], d["tail_s"]) >= 0.5 * d["tail_s"]
        assert d["syncs_layers_position_ids"] == 5 * d["layers"] and d["syncs_layers_varlen"] == 0
        assert d["layers_host_s"] >= 0.95 * d["layers_s"]  # the host's launches are the layers' time
        assert d["tail_eager_entropy_s"] >= 3 * d["tail_s"]
    layers = [d["layers_s"] for d in docs]
    assert max(layers) <= 1.1 * min(layers) and docs[0]["tokens"] >= 8 * docs[-1]["tokens"]
    assert set(step_time.TAIL["FORWARD_FIXED_S"]) == {"LOGIT_FORWARD_BYTES", "ENTROPY_BYTES", "FORWARD_TOKEN_S"}


def _per_byte(d: dict) -> float:
    """Seconds a byte a token a vocab entry at the H100's HBM, for a recorded batch of the grid's vocab (151,936)."""
    from verl_cluster.placement import step_time

    return d["tokens"] * 151936 / (step_time.gpu_speed("NVIDIA H100 80GB HBM3")[0].hbm_gbs * 1e9)


def _eager_entropy_bounds(d: dict) -> tuple[float, float]:
    """The eager entropy's bytes as a batch bounds them: its eager tail less the compiled tail's whole, and the
    eager tail's whole."""
    return (d["tail_eager_entropy_s"] - d["tail_s"]) / _per_byte(d), d["tail_eager_entropy_s"] / _per_byte(d)


def test_the_step_time_model_holds_the_recorded_layer_floors_and_eager_entropy():
    """The fourth refit holds what this run measured rather than fitting it (docs/placement.md, "The fourth refit"):
    a packed pass's layer at the host floor with position_ids' syncs, a padded pass's at the launches alone (the varlen
    pass: no syncs), and the eager entropy's bytes between the eager tail less the compiled tail and the eager tail."""
    from verl_cluster.placement import step_time

    fit = load_script("scripts/calibration/fit_plan_calibration.py")
    assert {"FORWARD_PASS_S", "FORWARD_SYNC_PASS_S", "ENTROPY_EAGER_BYTES"} <= set(fit.HELD)
    for d in (json.loads(line) for line in RECORDED.read_text().splitlines()):
        assert abs(step_time.FORWARD_SYNC_PASS_S / (d["layers_s"] / d["layers"]) - 1) <= 0.05
        assert abs(step_time.FORWARD_PASS_S / (d["layers_varlen_s"] / d["layers"]) - 1) <= 0.05
        lo, hi = _eager_entropy_bounds(d)
        assert lo <= step_time.ENTROPY_EAGER_BYTES <= hi
        # fitted, the logits' and the compiled entropy's bytes stay within the compiled tail this run measured whole
        # (the rest of a pass's per-token time is verl's: FORWARD_TOKEN_S)
        assert step_time.LOGIT_FORWARD_BYTES + step_time.ENTROPY_BYTES <= d["tail_s"] / _per_byte(d)


SHAPES = ROOT / "tests/fixtures/gpu/logprob_tail_h100_shapes.jsonl"  # 2026-12-07 (later), another H100, three shapes


def test_the_layers_host_floor_is_a_micro_batchs_not_a_layers():
    """The same micro batch at 24, 28 and 36 layers (the 0.5B, 1.5B and 3B shapes) on one H100: with few tokens,
    where the host binds, the layers took 52, 37 and 49 ms — flat in depth, so the 2.0 ms a layer that
    FORWARD_SYNC_PASS_S holds is the 24-layer pass's floor spread over its layers, not a cost each layer adds
    (docs/placement.md, "The fourth refit"); with more tokens the 3B pass is the GPU's (90 ms at 16 sequences, the
    host 52% of it with the varlen arguments). The tail stays serial and the eager entropy within its bounds."""
    from verl_cluster.placement import step_time

    docs = [json.loads(line) for line in SHAPES.read_text().splitlines()]
    by = {(d["shape"], d["seqs"]): d for d in docs}
    assert {d["layers"] for d in docs} == {24, 28, 36} and all(d["card"].startswith("NVIDIA H100") for d in docs)
    few = {d["layers"]: d for d in docs if d["seqs"] == 4}
    assert all(d["layers_host_s"] >= 0.95 * d["layers_s"] for d in few.values())  # host-bound
    assert few[36]["layers_s"] <= 1.1 * few[24]["layers_s"]  # 1.5x the layers, no more time
    big = by[("qwen2.5-3b", 16)]
    assert big["layers_s"] >= 1.7 * few[36]["layers_s"] and big["layers_varlen_host_s"] <= 0.6 * big["layers_varlen_s"]
    for d in docs:
        assert d["syncs_layers_position_ids"] == 5 * d["layers"] and d["syncs_layers_varlen"] == 0
        if d["whole_s"] >= d["layers_s"]:  # one 0.5B row's whole timed below its layers: the host's noise
            assert abs(d["whole_less_parts_s"]) <= 0.05 * d["whole_s"]
        lo, hi = _eager_entropy_bounds(d)
        assert lo <= step_time.ENTROPY_EAGER_BYTES <= hi
