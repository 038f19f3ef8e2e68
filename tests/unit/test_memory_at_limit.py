"""The allocator at the GPU's limit (tests/fixtures/calibration_h100_alloc_limit.json, docs/BENCHMARKS.md): the same
FSDP updates on an H100 80GB with and without expandable segments. With them (as verl 0.9 trains), a step runs when
its live tensors fit (memory.pressure_need); without them the reserved working set is the only safe test."""

import json
from pathlib import Path

import pytest

from verl_cluster.placement import memory as mem
from verl_cluster.placement.memory import GIB, TrainInputs
from verl_cluster.placement.model_shape import catalog_shape

DATA = json.loads((Path(__file__).resolve().parents[1] / "fixtures/calibration_h100_alloc_limit.json").read_text())
ROWS = DATA["rows"]
CAP = 81559 * 2**20  # the H100's memory as torch and the planner's catalog see it (79.6 GiB)


def predict(row):
    shape = catalog_shape(row["model"])
    x = TrainInputs(shape=shape, params=shape.params, n=row["world"], tokens=row["micro"] * row["seq"],
                    micro=row["micro"], seq=row["seq"], c=2, m=4, grad_ckpt=True, attn="sdpa", vocab_out=shape.vocab)
    return mem.update_step(x)


def ids(r):
    return f"{r['model']}-{r['micro']}x{r['seq']}-{'expandable' if r['expandable_segments'] else 'default'}"


def test_fixture_is_the_recorded_run():
    assert DATA["date"] == "2026-11-25" and "H100" in DATA["device"]
    assert len(ROWS) == 22 and sum(r["status"] == "OOM" for r in ROWS) == 6
    # the same cases both ways; two ran only with expandable segments
    ran = {(r["model"], r["micro"], r["seq"]): set() for r in ROWS}
    for r in ROWS:
        if r["status"] == "ok":
            ran[(r["model"], r["micro"], r["seq"])].add(r["expandable_segments"])
    assert sorted(k for k, v in ran.items() if v == {True}) == [("qwen2.5-1.5b", 7, 4096), ("qwen2.5-3b", 2, 8192)]


@pytest.mark.parametrize("row", [r for r in ROWS if r["expandable_segments"]], ids=ids)
def test_with_expandable_segments_the_live_peak_decides(row):
    step = predict(row)
    fits = mem.pressure_need(step.allocated, 0.0) <= CAP
    assert fits == (row["status"] == "ok"), (step.allocated / GIB, mem.pressure_need(step.allocated, 0.0) / GIB)


@pytest.mark.parametrize("row", [r for r in ROWS if r["status"] == "ok"], ids=ids)
def test_live_peak_is_what_torch_allocated(row):
    e = 100.0 * (predict(row).allocated / GIB - row["measured_allocated_gib"]) / row["measured_allocated_gib"]
    assert -1.0 <= e <= 0.5


def test_without_expandable_segments_the_reserved_test_is_the_safe_one():
    default = [r for r in ROWS if not r["expandable_segments"]]
    for r in default:
        if r["status"] == "OOM":  # the reserved working set says no for every case that failed ...
            assert mem.gpu_peak(predict(r).reserved, 0.0) > CAP, ids(r)
    # ... while the live test would have passed the two that ran only with expandable segments
    wrong = [ids(r) for r in default if r["status"] == "OOM" and mem.pressure_need(predict(r).allocated, 0.0) <= CAP]
    assert sorted(wrong) == ["qwen2.5-1.5b-7x4096-default", "qwen2.5-3b-2x8192-default"]
