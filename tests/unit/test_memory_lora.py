"""LoRA in the memory model against its calibration on an H100 (tests/fixtures/calibration_h100_lora.json, from
scripts/gpu/gpu_calib_lora.sh): 0.5B-7B, ranks 32/64, fp32 and bf16 base weights, one GPU. The model's one LoRA
number (LORA_FRAGMENT_SAVED) was fitted on the <= 3B rows; the 7B rows are the hold-out."""

import json
from pathlib import Path

import pytest

from verl_cluster.placement import memory as mem
from verl_cluster.placement.memory import GIB, TrainInputs
from verl_cluster.placement.model_shape import catalog_shape

DATA = json.loads((Path(__file__).resolve().parents[1] / "fixtures/calibration_h100_lora.json").read_text())
ROWS = DATA["rows"]
M = {"fp32": 4, "bf16": 2}


def step(row, rank=None):
    shape = catalog_shape(row["model"])
    s = DATA["setup"]
    r = row["lora_rank"] if rank is None else rank
    x = TrainInputs(shape=shape, params=shape.params, n=row["world"], tokens=row["micro"] * row["seq"],
                    micro=row["micro"], seq=row["seq"], c=s["c"], m=M[row["model_dtype"]], grad_ckpt=s["grad_ckpt"],
                    attn=s["attn"], vocab_out=shape.vocab, adapter=shape.lora_params(r) if r else 0)
    return mem.update_step(x)


def err(pred_bytes, measured_gib):
    return 100.0 * (pred_bytes / GIB - measured_gib) / measured_gib


def test_fixture_is_the_recorded_run():
    assert DATA["date"] == "2026-11-25" and "H100" in DATA["device"]
    assert len(ROWS) == 13 and {r["model_dtype"] for r in ROWS} == {"fp32", "bf16"}
    # before the LoRA terms the model over-predicted every row, the 7B bf16 one by 70%
    old = [err(r["recorded_predicted_reserved_gib"] * GIB, r["measured_reserved_gib"]) for r in ROWS]
    assert min(old) > 0 and max(old) > 60


@pytest.mark.parametrize("row", ROWS, ids=lambda r: f"{r['model']}-r{r['lora_rank']}-{r['model_dtype']}-"
                                                   f"{r['micro']}x{r['seq']}")
def test_reserved_and_allocated_within_band(row):
    s = step(row)
    assert -6.0 <= err(s.reserved, row["measured_reserved_gib"]) <= 3.0  # achieved: -4.9 .. +2.1
    assert abs(err(s.allocated, row["measured_allocated_gib"])) <= 2.5


def test_hold_out_7b():
    held = [abs(err(step(r).reserved, r["measured_reserved_gib"])) for r in ROWS if r["model"] == "qwen2.5-7b"]
    assert len(held) == 5 and max(held) < 5.0


def test_adapter_count_matches_peft():
    # what peft reported trainable on the GPU (all-linear: every Linear of the decoder layers, not lm_head)
    for key, count in DATA["peft_trainable_params"].items():
        model, rank = key.split(" r")
        assert catalog_shape(model).lora_params(int(rank)) == count, key
    shape = catalog_shape("qwen2.5-0.5b")
    assert shape.lora_params(32, ("q_proj", "v_proj")) < shape.lora_params(32)


def test_lora_needs_far_less_than_full_fine_tuning():
    row = next(r for r in ROWS if r["model"] == "qwen2.5-7b" and r["model_dtype"] == "fp32" and r["micro"] == 1
               and r["seq"] == 1024)
    full, lora = step(row, rank=0), step(row)
    assert lora.reserved < 0.5 * full.reserved  # no fp32 grads, no Adam states for the 7.6B frozen weights
    names = {p.name for p in lora.parts}
    assert "adam" in names and next(p for p in lora.parts if p.name == "adam").bytes < 0.01 * full.reserved
