"""scripts/gpu/gpu_logprob_tail.py, the device check of a log-prob micro batch's parts (docs/placement.md, "The third
refit"), runs on the CPU with --cpu: a 2-layer shape, the same code path but for flash-attn and the sync count, so a
device session does not find its bugs."""

import json
import subprocess
import sys
from pathlib import Path

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
        assert d["card"] == "cpu" and d["entropy"] == "eager" and d["layers"] == 2
        assert d["syncs_layers_position_ids"] is None and d["syncs_layers_varlen"] is None  # counted on a GPU only
        assert all(d[k] > 0 for k in ("layers_s", "layers_varlen_s", "tail_s", "tail_eager_entropy_s", "whole_s"))
        assert abs(d["whole_less_parts_s"] - (d["whole_s"] - d["layers_s"] - d["tail_s"])) <= 2e-4  # rounded to 0.1 ms


def test_without_a_gpu_it_says_so_and_exits_2():
    r = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, timeout=240, cwd=ROOT)
    assert r.returncode == 2 and "no GPU" in json.loads(r.stdout)["error"]
