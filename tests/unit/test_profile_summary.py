"""scripts/calibration/profile_summary.py: a real torch profiler trace (CPU) read back per micro batch, the GPU side's
arithmetic on a trace in the profiler's schema (kernels tied to their launches by correlation id), and the CLI's
errors."""

import gzip
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts" / "calibration"))

import profile_summary as ps  # noqa: E402


def test_a_real_trace_read_per_micro_batch(tmp_path, capsys):
    torch = pytest.importorskip("torch")
    from torch.profiler import ProfilerActivity, profile, record_function

    x = torch.randn(64, 64, requires_grad=True)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for i in range(3):
            with record_function(f"micro_batch{i}"):
                y = (x @ x).relu().sum()
                for _ in range(20):  # a host loop of small ops, as verl's per-row log-probs without flash-attn
                    torch.add(x, 1.0)
                y.backward()
        torch.add(x, 2.0)  # outside every micro batch: not counted
    path = tmp_path / "actor_update.json"
    prof.export_chrome_trace(str(path))
    got = ps.summarize(ps.load(path))
    assert got["micro_batches"] == 3 and got["wall_ms"] > 0 and got["gpu_ms"] == 0.0
    ops = {o["op"]: o for o in got["host_ops"]}
    assert ops["aten::add"]["calls"] == 20  # per micro batch; the one outside is left out
    assert ops["aten::mm"]["calls"] >= 1 and all(o["self_ms"] >= 0 for o in got["host_ops"])
    # self time: the ops' own time never exceeds the micro batches' wall time
    assert sum(o["self_ms"] for o in ps.summarize(ps.load(path), top=1000)["host_ops"]) <= got["wall_ms"] * 1.01
    gz = tmp_path / "t.json.gz"
    gz.write_bytes(gzip.compress(path.read_bytes()))
    assert ps.main([str(tmp_path), "--json", str(tmp_path / "s.json")]) == 0
    assert "3 micro batches" in capsys.readouterr().out
    assert len(json.loads((tmp_path / "s.json").read_text())) == 2  # the .json and the .json.gz


def ev(name, cat, ts, dur, tid=1, **args):
    return {"ph": "X", "name": name, "cat": cat, "ts": ts, "dur": dur, "pid": 7, "tid": tid, "args": args}


def test_gpu_time_and_syncs_by_correlation():
    """Two micro batches of 1000 us: each launches a 400 us kernel and waits 300 us in a stream sync; a kernel
    launched outside the micro batches is not theirs. The op's self time is its own less its child's."""
    events = []
    for i, t0 in enumerate((0, 2000)):
        events += [ev(f"micro_batch{i}", "user_annotation", t0, 1000),
                   ev("aten::mm", "cpu_op", t0 + 10, 500), ev("aten::empty", "cpu_op", t0 + 20, 100),
                   ev("cudaLaunchKernel", "cuda_runtime", t0 + 30, 5, correlation=i + 1),
                   ev("gemm", "kernel", t0 + 40, 400, tid=99, correlation=i + 1),
                   ev("cudaStreamSynchronize", "cuda_runtime", t0 + 600, 300),
                   ev("MmBackward0", "cpu_op", t0 + 920, 50, tid=2)]  # autograd's own thread
    events += [ev("cudaLaunchKernel", "cuda_runtime", 5000, 5, correlation=9), ev("x", "kernel", 5010, 900, tid=99,
                                                                                 correlation=9)]
    got = ps.summarize(events)
    assert (got["micro_batches"], got["wall_ms"], got["gpu_ms"], got["sync_ms"]) == (2, 1.0, 0.4, 0.3)
    ops = {o["op"]: o for o in got["host_ops"]}
    assert ops["aten::mm"]["self_ms"] == 0.4 and ops["aten::empty"]["self_ms"] == 0.1  # 500 - 100 us, 100 us
    assert ops["MmBackward0"]["self_ms"] == 0.05


def test_each_micro_batch_in_order_with_its_mini_batch(capsys):
    """Two mini batches of two micro batches; the second of each (accumulating into gradients already there) takes
    longer: the rows say so in order, each with its mini batch, its GPU work and its syncs; the markdown lists them."""
    events = [ev("mini_batch0", "user_annotation", 0, 5000), ev("mini_batch1", "user_annotation", 6000, 5000)]
    for mb, t0, dur, k in ((0, 100, 1000, 1), (1, 1200, 3000, 2), (0, 6100, 1000, 3), (1, 7200, 3000, 4)):
        events += [ev(f"micro_batch{mb}", "user_annotation", t0, dur),
                   ev("cudaLaunchKernel", "cuda_runtime", t0 + 10, 5, correlation=k),
                   ev("k", "kernel", t0 + 20, 200 * k, tid=99, correlation=k),
                   ev("cudaStreamSynchronize", "cuda_runtime", t0 + 30, dur / 2)]
    got = ps.summarize(events)
    assert [(r["mini_batch"], r["micro_batch"], r["wall_ms"], r["gpu_ms"], r["sync_ms"]) for r in got["each"]] == [
        (0, 0, 1.0, 0.2, 0.5), (0, 1, 3.0, 0.4, 1.5), (1, 0, 1.0, 0.6, 0.5), (1, 1, 3.0, 0.8, 1.5)]
    assert (got["micro_batches"], got["wall_ms"], got["gpu_ms"]) == (4, 2.0, 0.5)
    md = ps.markdown({"t": got})
    assert "| 0 | 1 | 3.0 | 0.4 | 1.5 |" in md and "| 1 | 0 | 1.0 | 0.6 | 0.5 |" in md
    # the stage outside its micro batches: an optimizer step after each mini batch, its op by self time
    step = "Optimizer.step#AdamW.step"
    events += [ev(step, "cpu_op", 4500, 400), ev(step, "cpu_op", 10500, 400), ev("aten::add_", "cpu_op", 10600, 100)]
    got = ps.summarize(events)
    assert got["stage_ms"] == 11.0 and got["outside_ms"] == 3.0  # 0 .. 11000 us less 8000 us of micro batches
    assert got["outside_ops"] == [{"op": "Optimizer.step#AdamW.step", "self_ms": 0.7}, {"op": "aten::add_",
                                                                                      "self_ms": 0.1}]
    assert "3.0 ms of it outside the micro batches" in ps.markdown({"t": got})
    plain = ps.summarize([e for e in events if not e["name"].startswith("mini")])
    assert {r["mini_batch"] for r in plain["each"]} == {None} and "| - | 0 |" in ps.markdown({"t": plain})


def test_errors_say_what(tmp_path, capsys):
    assert ps.main([str(tmp_path / "nope")]) == 2
    assert "no such file or folder" in capsys.readouterr().err
    (tmp_path / "plain.json").write_text(json.dumps({"traceEvents": [ev("aten::mm", "cpu_op", 0, 5)]}))
    (tmp_path / "bad.json").write_text("{not json")
    assert ps.main([str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "bad.json: not a chrome trace" in err and "no trace with micro_batch<i> spans" in err
