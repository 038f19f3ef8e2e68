"""The calibration grid in scripts/gpu_e2e.sh, checked before device time is spent on it: every run plans as
feasible on the recorded H100 (with flash-attn, as both batches install it) with room to spare in GPU memory and
host RAM, the batches hold what the issue asks for (GRPO and PPO, three sizes, offload on and off, lengths and n
varied, a 3B, a PPO and an offload run held out), and each run's expected seconds leave room for its predicted steps."""

import re
import shlex
from pathlib import Path

import pytest

from verl_cluster.config.job import load_job
from verl_cluster.facts.model import NodeFacts, from_json
from verl_cluster.placement import plan_job
from verl_cluster.placement.settings import read_settings

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = (ROOT / "scripts/gpu_e2e.sh").read_text()
H100 = from_json(NodeFacts, (ROOT / "tests/fixtures/facts/h100x1.json").read_text())
START_UP_S = 220  # submit to the first step's start on the H100 (the grid's batch A: 225-276 s to step 1's end)
FILL = 0.4  # the recorded random-init runs' sequences were ~40% of prompt + response


def script_vars() -> dict[str, str]:
    out = {}
    for m in re.finditer(r'^(GRPO|PPO)=(\S+)(?: (PPO)=(\S+))?$|^OFFLOAD="([^"]+)"$', SCRIPT, flags=re.M):
        if m.group(5):
            out["OFFLOAD"] = m.group(5)
        else:
            out[m.group(1)] = m.group(2)
            if m.group(3):
                out[m.group(3)] = m.group(4)
    return out


def grid() -> dict[str, dict]:
    env = script_vars()
    runs = {}
    for line in SCRIPT.splitlines():
        if not line.startswith("grid_run "):
            continue
        name, shape, job, expect, args = shlex.split(line)[1:6]
        for k, v in env.items():
            job, args = job.replace(f"${k}", v), args.replace(f"${k}", v)
        runs[name] = {"shape": shape, "job": job, "expect_s": int(expect), "args": args.split()}
    return runs


def batch(name: str) -> list[str]:
    return re.search(rf"^{name}=\(([^)]*)\)", SCRIPT, flags=re.M).group(1).split()


GRID = grid()
STEPS = 5  # each grid run's steps (FIT in the script)
COMMON = [f"trainer.total_training_steps={STEPS}", "trainer.test_freq=-1", "trainer.val_before_train=false"]


def test_the_batches_cover_the_grid_and_what_the_issue_asks():
    a, b, c, d = batch("GRID_A"), batch("GRID_B"), batch("GRID_C"), batch("GRID_D")
    assert sorted(a + b + c + d) == sorted(GRID) and len(GRID) >= 8 and len(set(a + b + c + d)) == len(a + b + c + d)
    # batch B was run as hold-outs; three of them shaped the model and joined the fit, batch C holds out again
    assert all(n.startswith("fit-") for n in a) and b[-1] == "hold-padded05"
    assert all(n.startswith("fit-") for n in b[:-1]) and all(n.startswith("hold-") for n in c)
    held = [GRID[n] for n in c]
    assert any(r["shape"] == "qwen2.5-3b" for r in held)
    assert any("param_offload=true" in " ".join(r["args"]) for r in held)
    assert any(r["job"] == "launch/gsm8k.yaml" for r in held)
    runs = GRID.values()
    assert {r["job"] for r in runs} == {"launch/gsm8k_grpo.yaml", "launch/gsm8k.yaml"}
    assert {r["shape"] for r in runs} == {"qwen2.5-0.5b", "qwen2.5-1.5b", "qwen2.5-3b"}
    words = [" ".join(r["args"]) for r in runs]
    assert any("optimizer_offload=true" in w for w in words) and any("offload" not in w for w in words)
    settings = [read_settings(load_job(ROOT / r["job"], [f"model.catalog={r['shape']}", *r["args"]])) for r in runs]
    assert len({s.n for s in settings}) >= 3 and len({s.response_len for s in settings}) >= 3


@pytest.mark.parametrize("name", sorted(GRID))
def test_each_run_fits_one_h100_with_room(name):
    r = GRID[name]
    job = load_job(ROOT / r["job"], [f"model.catalog={r['shape']}", *COMMON, *r["args"]])
    assert plan_job(job, [H100]).feasible  # the device plans it at the worst-case lengths before submitting
    p = plan_job(job, [H100], fill=FILL)
    assert p.feasible, p.binding
    assert p.peak_gib <= 0.92 * 79.65, p.peak_gib  # ~6 GiB of margin for the model's error
    assert p.host_gib_per_node <= 0.8 * 125.9  # the H100 machine's RAM
    t = p.time
    # the expected seconds hold the start-up, the steps (the first one warming up) and the exit
    assert r["expect_s"] >= START_UP_S + STEPS * t["step_s"] + t["save_checkpoint_s"], (r["expect_s"], t)
    assert r["expect_s"] <= 480  # four runs and the set-up in one 30-minute machine, give or take


def test_the_grid_runs_use_shapes_make_tiny_model_writes():
    from verl_cluster.testdata.tiny_model import SHAPES

    assert {r["shape"] for r in GRID.values()} <= set(SHAPES)
