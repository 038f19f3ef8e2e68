"""scripts/calibration/calibrate_memory.py --dry-run: cases and predictions on CPU, without importing torch."""

import json
import sys
from pathlib import Path

from tests.harness.scripts import load_script

ROOT = Path(__file__).resolve().parents[2]


def load():
    return load_script("scripts/calibration/calibrate_memory.py")


def test_dry_run_prints_predictions_and_writes_json(tmp_path, capsys):
    cal = load()
    out = tmp_path / "c.json"
    assert cal.main(["--dry-run", "--worlds", "1,2", "--cases", "1x512,4x1024", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "qwen2.5-0.5b" in text and "pred resv" in text
    doc = json.loads(out.read_text())
    rows = doc["rows"]
    assert len(rows) == 4 and {r["world"] for r in rows} == {1, 2}
    one = {(r["micro"], r["seq"]): r for r in rows if r["world"] == 1}
    two = {(r["micro"], r["seq"]): r for r in rows if r["world"] == 2}
    # sharding over 2 GPUs halves the 16 B/param states: the prediction must drop
    assert two[(1, 512)]["predicted_allocated_gib"] < one[(1, 512)]["predicted_allocated_gib"]
    assert one[(4, 1024)]["predicted_allocated_gib"] > one[(1, 512)]["predicted_allocated_gib"]
    assert all(r["measured_reserved_gib"] is None for r in rows)
    # the dry run must not need torch: run it where importing torch fails
    blocker = tmp_path / "blocker"
    blocker.mkdir()
    (blocker / "torch.py").write_text("raise ImportError('torch is blocked in this test')\n")
    import os
    import subprocess

    env = {**os.environ, "PYTHONPATH": f"{blocker}{os.pathsep}{ROOT}"}
    res = subprocess.run([sys.executable, str(ROOT / "scripts/calibration/calibrate_memory.py"), "--dry-run",
                          "--out", str(tmp_path / "blocked.json")],
                         capture_output=True, text=True, env=env, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]


def test_hf_config_kwargs_match_shape():
    cal = load()
    from verl_cluster.placement.model_shape import catalog_shape

    kw = cal.hf_config_kwargs(catalog_shape("qwen3-0.6b"))
    assert kw["head_dim"] == 128 and kw["num_key_value_heads"] == 8 and kw["tie_word_embeddings"] is True
    assert cal.model_type(catalog_shape("qwen3-0.6b")) == "qwen3"
    assert cal.model_type(catalog_shape("llama-3.1-8b")) == "llama"
