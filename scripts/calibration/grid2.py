#!/usr/bin/env python3
"""Issue 33's second calibration grid: verl GRPO and PPO (GAE critic) runs on one node of 2 GPUs (H100 or H200,
whichever the device lends) that vary the update / log-prob micro batches, 1 vs 2 GPUs, sdpa padded (no flash-attn)
vs packed flash-attn, and GRPO vs PPO with a critic. Runs are grouped in families; held-out families are never
fitted on (docs in scripts/calibration/README.md).

    grid2.py predict [--batch B ...]   here: plan every run for H100 and H200 with the CLI, append a round
                                       (commit, date, per-phase predictions by fill, error bar) to PREDICTIONS
    grid2.py start BATCH [BATCH]       device: copy the repo to /srv/vc/repo, run `chain BATCH..` detached (setsid)
    grid2.py chain BATCH [BATCH]       device: setup (site, models, data, flash-attn, `up`), then `run BATCH..`
    grid2.py run BATCH [BATCH]         device: submit the batches' lines, side by side as the GPUs allow
                                       -> /srv/vc/out/grid2-RUN.json
    grid2.py report DIR [--json F] [--md F]   here: prediction vs measured per family, per run (DIR: grid2-*.json)
    grid2.py fixture DIR               here: the runs that are measurements -> FIXTURE (fit_plan_calibration's form)
"""

from __future__ import annotations

import argparse
import calendar
import json
import re
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

REPO = Path(__file__).resolve().parents[2]
PREDICTIONS = REPO / "tests/fixtures/verl_runs/grid2_predictions.json"
FACTS_TEMPLATE = REPO / "tests/fixtures/facts/h200x2_recorded.json"
FIXTURE = REPO / "tests/fixtures/verl_runs/grid2_runs.json"  # the measured runs, as fit_plan_calibration reads them
VC = Path("/srv/vc")
OUT = VC / "out"
CARDS = {"H100": ("NVIDIA H100 80GB HBM3", 81559), "H200": ("NVIDIA H200", 143771)}
STEPS = 5  # verl steps a run; step 1 (start-up, compilation) is left out of timing
STARTUP_S = 300  # submit -> end less the steps (preflight, Ray actors, vLLM, FSDP load, exit): 250-335 s at 0.5B on
# the 2026-11-28 H200 runs (205-220 s on the first H100 grid)
EXPECTED_FILL = 0.45  # the lengths a run is budgeted at: this data and model filled 0.38 on 2026-11-28
SESSION_RUNS_S = 1350  # a session's seconds for runs: ~28 usable min less staging (95 s) and setup + up (56 s)
FILLS = (0.2, 0.3, 0.35, 0.4, 0.45, 0.5, 0.6, 0.75, 1.0)  # the fills each run is predicted at (read at its own)
STEP_BOUND, PHASE_BOUND, PHASE_MIN_S = 0.20, 0.30, 0.5  # the target on held-out runs
PADDED, PACKED = "padded, no flash-attn", "packed (flash-attn)"  # envelope.py's attention values
SHAPE = "qwen2.5-0.5b"  # the grid's model: random init of the real shape (make_tiny_model.py --shape)
PARAMS_B = {"qwen2.5-0.5b": 0.49, "qwen2.5-1.5b": 1.54, "qwen2.5-3b": 3.09}  # envelope.py's params_b of each shape
# each shape's attention head dim (hidden / heads, testdata/tiny_model.SHAPES): the kit's flash-attn wheel is built
# for a few head dims only (FA_HDIMS), and a run on a shape it lacks fails in its first log-prob pass (batch U, 12-02)
HEAD_DIM = {"qwen2.5-0.5b": 64, "qwen2.5-1.5b": 128, "qwen2.5-3b": 128}


# ---------------------------------------------------------------- the grid as data
@dataclass(frozen=True)
class Run:
    name: str
    family: str
    batch: str
    gpus: int  # on one node
    algo: str  # "grpo" | "gae" (PPO with a critic)
    attention: str  # PADDED | PACKED
    micro: int  # actor (and critic) update micro batch per GPU
    log_prob: int  # log-prob (old, ref, critic values) micro batch per GPU
    profile: bool = False  # torch profiler on step 3's updates (PROFILE_WORDS): a diagnosis, never a measurement
    offload: bool = False  # the actor's params and optimizer state on the host (FSDP CPU offload)
    steps: int = STEPS  # verl steps (the gc runs go longer: one-step outliers counted over more steps)
    gc_freeze: bool = False  # each Python process freezes what survives a full collection (gc_pauses.py): a diagnosis
    submit_flags: tuple[str, ...] = ()  # the product's own options (`submit --gc-freeze`)
    ab: bool = False  # one side of an A/B of the product's options: a diagnosis
    held_out: bool = False  # held out although its family is fitted on (a setting the family's fit runs lack)
    shape: str = SHAPE  # the model's shape (PARAMS_B): 24 layers, or 28 (1.5B) and 36 (3B)
    repeat_of: str = ""  # the same run again on another machine: judged against that run's recorded prediction

    @property
    def flags(self) -> tuple[str, ...]:
        """submit's options for the run: the collector as Python leaves it unless the run asks for the freeze (the
        product freezes by default since batch R; the model's fit and its predicted rounds are of runs without it)."""
        return self.submit_flags if "--gc-freeze" in self.submit_flags else (*self.submit_flags, "--no-gc-freeze")

    @property
    def diagnosis(self) -> bool:
        """Profiled, run with the collector frozen by the chain, or an A/B side: never reported or fitted."""
        return self.profile or self.gc_freeze or self.ab

    @property
    def flash(self) -> bool:
        """flash-attn must be importable (packed; verl 0.9.1 loads a critic with flash_attention_2 regardless);
        padded runs run with it moved out of the site, as the issue's user lines ran."""
        return self.attention == PACKED or self.algo == "gae"

    @property
    def head_dim(self) -> int:
        return HEAD_DIM[self.shape]

    @property
    def sequences(self) -> int:
        return 32 * 4 if self.algo == "grpo" else 128

    def axes(self) -> dict[str, Any]:
        """The run's values on the step-time envelope's axes (placement/envelope.py job_axes)."""
        return {"ranks": self.gpus, "nodes": 1, "attention": self.attention,
                "algorithm": "grpo" if self.algo == "grpo" else "gae+critic",
                "offload": "param+optimizer" if self.offload else "none", "micro_update": self.micro,
                "micro_log_prob": self.log_prob, "params_b": PARAMS_B[self.shape]}

    def line(self) -> list[str]:
        model, data = VC / "models" / self.shape, VC / "data" / "gsm8k"
        w = ["python3", "-m", "verl.trainer.main_ppo", f"algorithm.adv_estimator={self.algo}",
             f"data.train_files=[{data}/train.parquet]", f"data.val_files=[{data}/test.parquet]",
             "data.max_prompt_length=512", "data.max_response_length=384", f"actor_rollout_ref.model.path={model}",
             "actor_rollout_ref.model.enable_gradient_checkpointing=true"]
        if self.algo == "grpo":  # 32 prompts x 4: 128 sequences, 64 a mini batch (as the user line)
            w += ["data.train_batch_size=32", "actor_rollout_ref.rollout.n=4",
                  "actor_rollout_ref.actor.ppo_mini_batch_size=16", "actor_rollout_ref.actor.use_kl_loss=true",
                  f"actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu={self.log_prob}"]
        else:  # 128 prompts x 1, the same 128 sequences and 64 a mini batch; no KL loss: no ref
            w += ["data.train_batch_size=128", "actor_rollout_ref.rollout.n=1",
                  "actor_rollout_ref.actor.ppo_mini_batch_size=64", "actor_rollout_ref.actor.use_kl_loss=false",
                  f"critic.model.path={model}", "critic.model.enable_gradient_checkpointing=true",
                  f"critic.ppo_micro_batch_size_per_gpu={self.micro}",
                  f"critic.forward_micro_batch_size_per_gpu={self.log_prob}"]
        if self.attention == PADDED:
            w += ["actor_rollout_ref.model.use_remove_padding=false",
                  "+actor_rollout_ref.model.override_config.attn_implementation=sdpa"]
        else:
            w += ["actor_rollout_ref.model.use_remove_padding=true"]
        if self.offload:
            w += ["actor_rollout_ref.actor.fsdp_config.param_offload=true",
                  "actor_rollout_ref.actor.fsdp_config.optimizer_offload=true"]
        return w + [f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={self.micro}",
                    f"actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu={self.log_prob}",
                    "actor_rollout_ref.rollout.name=vllm", "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
                    "actor_rollout_ref.rollout.gpu_memory_utilization=0.4", "trainer.logger=[console]",
                    "trainer.nnodes=1", f"trainer.n_gpus_per_node={self.gpus}",
                    f"trainer.total_training_steps={self.steps}", "trainer.save_freq=-1", "trainer.test_freq=-1",
                    "trainer.val_before_train=false", f"trainer.default_local_dir={self.ckpt_dir}"] + (
            [f"global_profiler.save_path={self.profile_dir}"] + list(PROFILE_WORDS)
            + (list(CRITIC_PROFILE_WORDS) if self.algo == "gae" else []) if self.profile else [])

    @property
    def ckpt_dir(self) -> Path:
        """Where the line saves (a run again saves where its first did: the same line)."""
        return VC / "ckpt" / (self.repeat_of or self.name)

    @property
    def profile_dir(self) -> Path:
        """Where a profiled run's traces go: a folder of its own, so its summary reads only its traces."""
        return PROFILE_DIR / self.name


PROFILE_DIR = VC / "profile"  # the traces stay on the device (tens of MB); profile_summary.py's summary comes back
# verl 0.9.1's torch profiler on the actor's update of step 3, one trace per stage (discrete), the whole stage (both
# mini batches). No schedule: with schedule.active=2 (2026-11-28, batch P) verl saved the log-prob and critic traces
# but no trace of the actor's update (kineto: "External init callback must run in same thread as registerClient").
PROFILE_WORDS = ("global_profiler.tool=torch", "global_profiler.steps=[3]",
                 "actor_rollout_ref.actor.profiler.enable=true",
                 "actor_rollout_ref.actor.profiler.tool_config.torch.discrete=true",
                 "actor_rollout_ref.actor.profiler.tool_config.torch.contents=[cuda]")
CRITIC_PROFILE_WORDS = ("critic.profiler.enable=true", "critic.profiler.tool_config.torch.discrete=true",
                        "critic.profiler.tool_config.torch.contents=[cuda]")  # the same micro batch, no LM head


@dataclass(frozen=True)
class Family:
    name: str
    role: str  # "fit" | "hold-out"
    what: str
    defines: dict[str, Any] = field(default_factory=dict)  # axis -> value, or (lo, hi) for a micro batch

    def matches(self, axes: dict[str, Any]) -> bool:
        for axis, want in self.defines.items():
            v = axes.get(axis)
            if isinstance(want, tuple) and not (v is not None and want[0] <= v <= want[1]):
                return False
            if not isinstance(want, tuple) and v != want:
                return False
        return True


FAMILIES = (
    Family("1gpu-padded", "fit", "1 GPU, sdpa padded without flash-attn, GRPO, micro 2 and 8",
           {"nodes": 1, "ranks": 1, "attention": PADDED, "algorithm": "grpo", "offload": "none"}),
    Family("2gpu-padded-large-micro", "fit", "2 GPUs, sdpa padded, GRPO, micro 16 and 32",
           {"nodes": 1, "ranks": 2, "attention": PADDED, "algorithm": "grpo", "offload": "none",
            "micro_update": (16, 64)}),
    Family("1gpu-packed", "fit", "1 GPU, packed flash-attn, GRPO, micro 2 and 8 (the one-H100 grid: 16-64)",
           {"nodes": 1, "ranks": 1, "attention": PACKED, "algorithm": "grpo", "offload": "none", "params_b": (0, 1)}),
    # deeper models (28 and 36 layers): the one-H100 grid fitted 1.5B and 3B runs, so U's are held out by run
    Family("1gpu-deep", "fit", "1 GPU, packed flash-attn, GRPO, the 1.5B and 3B shapes",
           {"nodes": 1, "ranks": 1, "attention": PACKED, "algorithm": "grpo", "offload": "none",
            "params_b": (1, 4)}),
    Family("1gpu-ppo", "fit", "1 GPU, PPO with a GAE critic (packed flash-attn)",
           {"nodes": 1, "ranks": 1, "algorithm": "gae+critic", "offload": "none"}),
    Family("2gpu-padded-small-micro", "hold-out", "2 GPUs at small micro batch (2, 8), sdpa padded, GRPO",
           {"nodes": 1, "ranks": 2, "attention": PADDED, "algorithm": "grpo", "offload": "none",
            "micro_update": (1, 8)}),
    Family("2gpu-packed", "hold-out", "2 GPUs, packed flash-attn, GRPO, micro 2 / 8 / 32",
           {"nodes": 1, "ranks": 2, "attention": PACKED, "algorithm": "grpo", "offload": "none"}),
    Family("2gpu-ppo", "hold-out", "PPO with a GAE critic on 2 GPUs, micro 2 / 8 / 32",
           {"nodes": 1, "ranks": 2, "algorithm": "gae+critic", "offload": "none"}),
    # for after the refit that P calls for: C and g2fa-m32 become fit runs then (looked at), so the three families
    # above are no longer never-fitted; this one is (offload was fitted on one GPU only: fit-offload05, -15)
    # 4 ranks: no run of any grid had them, so all three are held out by axis and never fitted on
    Family("4gpu-packed", "hold-out", "4 GPUs of one node, packed flash-attn, GRPO, micro 8",
           {"nodes": 1, "ranks": 4, "attention": PACKED, "algorithm": "grpo", "offload": "none"}),
    Family("4gpu-padded", "hold-out", "4 GPUs of one node, sdpa padded, GRPO, micro 8",
           {"nodes": 1, "ranks": 4, "attention": PADDED, "algorithm": "grpo", "offload": "none"}),
    Family("4gpu-ppo", "hold-out", "PPO with a GAE critic on 4 GPUs of one node, micro 8",
           {"nodes": 1, "ranks": 4, "algorithm": "gae+critic", "offload": "none"}),
    Family("2gpu-offload", "hold-out", "2 GPUs, the actor's params and optimizer offloaded, packed, GRPO, micro 8/32",
           {"nodes": 1, "ranks": 2, "attention": PACKED, "algorithm": "grpo", "offload": "param+optimizer"}),
    # after the refit of 2026-11-29 took D, E, F and Q: the one family of batch S no run of any grid had
    Family("2gpu-ppo-offload", "hold-out", "PPO with a GAE critic on 2 GPUs, the actor's params and optimizer "
           "offloaded, micro 8", {"nodes": 1, "ranks": 2, "algorithm": "gae+critic", "offload": "param+optimizer"}),
)
RUNS = (  # batch = the device session it runs in, most wanted first; the hold-out batches run after the refit on A
    # and B is committed and predicted again (`predict --batch C --batch D`)
    Run("g1pad-m2", "1gpu-padded", "A", 1, "grpo", PADDED, 2, 4),
    Run("g1pad-m8", "1gpu-padded", "A", 1, "grpo", PADDED, 8, 16),  # the one-GPU line
    Run("g2pad-m32", "2gpu-padded-large-micro", "A", 2, "grpo", PADDED, 32, 32),  # log-prob 64: 81 GiB of logits
    Run("g2pad-m16", "2gpu-padded-large-micro", "B", 2, "grpo", PADDED, 16, 32),
    Run("g1fa-m8", "1gpu-packed", "B", 1, "grpo", PACKED, 8, 16),
    Run("g1ppo-m8", "1gpu-ppo", "B", 1, "gae", PACKED, 8, 16),
    Run("g1fa-m2", "1gpu-packed", "B", 1, "grpo", PACKED, 2, 4),
    # held out: three 2-GPU runs a session (one after another on a node of 2), each session one of every family
    Run("g2pad-m8", "2gpu-padded-small-micro", "C", 2, "grpo", PADDED, 8, 16),  # the 2-GPU line
    Run("g2fa-m8", "2gpu-packed", "C", 2, "grpo", PACKED, 8, 16),
    Run("g2ppo-m8", "2gpu-ppo", "C", 2, "gae", PACKED, 8, 16),
    Run("g2fa-m32", "2gpu-packed", "G", 2, "grpo", PACKED, 32, 32),  # ran alone after C (was E's first); fitted on
    Run("g2pad-m2", "2gpu-padded-small-micro", "D", 2, "grpo", PADDED, 2, 4),
    Run("g2fa-m2", "2gpu-packed", "D", 2, "grpo", PACKED, 2, 4),
    Run("g2ppo-m32", "2gpu-ppo", "D", 2, "gae", PACKED, 32, 32),
    Run("g2ppo-m2", "2gpu-ppo", "E", 2, "gae", PACKED, 2, 4),
    Run("g2off-m8", "2gpu-offload", "F", 2, "grpo", PACKED, 8, 16, offload=True),
    Run("g2off-m32", "2gpu-offload", "F", 2, "grpo", PACKED, 32, 32, offload=True),
    # H: 4 ranks, when a 4-GPU kind is lent, predicted by the model that D, E and F were held out from (the first try
    # at g4fa-m8 was lost with its machine, 2026-11-28); one run a family, one after another on the 4 GPUs
    Run("g4fa-m8", "4gpu-packed", "H", 4, "grpo", PACKED, 8, 16),
    Run("g4pad-m8", "4gpu-padded", "H", 4, "grpo", PADDED, 8, 16),
    Run("g4ppo-m8", "4gpu-ppo", "H", 4, "gae", PACKED, 8, 16),
    # P: diagnoses, not measurements (the report and the fixture leave them out): where the actor's micro batches
    # spend the ~0.3-0.45 s of host work the critic's do not (step_time.UPDATE_LM_MICRO_S), actor and critic profiled;
    # at micro 8 a rank's mini batch is 4 (2 GPUs) or 8 (1 GPU) micro batches, so the trace also says whether the
    # cost falls on every micro batch or only on those that accumulate into gradients already there (g2fa-m32, one
    # micro batch a mini batch, took 0.83 s where 8 a rank took 3.46 s)
    Run("g2ppo-m8-prof", "2gpu-ppo", "P", 2, "gae", PACKED, 8, 16, profile=True),
    Run("g1ppo-m8-prof", "1gpu-ppo", "P", 1, "gae", PACKED, 8, 16, profile=True),
    # Q: the one-step outliers (a phase under 1.6 s slow on one step in 4: D-F's phase misses) against the collector's
    # pauses, 15 steps a run, each step's end time kept: the two configurations that had them, watched, and the PPO
    # one again with every process freezing what survives a full collection (a diagnosis; the watched two are
    # held-out measurements of their families, predicted by the round before them like any other)
    Run("g2ppo-m32-gc", "2gpu-ppo", "Q", 2, "gae", PACKED, 32, 32, steps=15),
    Run("g2ppo-m32-frz", "2gpu-ppo", "Q", 2, "gae", PACKED, 32, 32, steps=15, gc_freeze=True),
    Run("g2off-m32-gc", "2gpu-offload", "Q", 2, "grpo", PACKED, 32, 32, offload=True, steps=15),
    # R: `submit --gc-freeze` against the default, the two side by side on the two GPUs of a node of 2 (each its own
    # cluster; the host's drift falls on both) and then swapped: Q's one frozen run was 6-13% slower a phase than
    # the watched run before it, which one pair cannot tell from the machine. 12 steps each, PPO at micro 32 on 1 GPU
    Run("g1ppo-m32-def-a", "1gpu-ppo", "R", 1, "gae", PACKED, 32, 32, steps=12, ab=True),
    Run("g1ppo-m32-frz-a", "1gpu-ppo", "R", 1, "gae", PACKED, 32, 32, steps=12, ab=True, submit_flags=("--gc-freeze",)),
    Run("g1ppo-m32-frz-b", "1gpu-ppo", "R", 1, "gae", PACKED, 32, 32, steps=12, ab=True, submit_flags=("--gc-freeze",)),
    Run("g1ppo-m32-def-b", "1gpu-ppo", "R", 1, "gae", PACKED, 32, 32, steps=12, ab=True),
    # then, on both GPUs, g2ppo-m32 with torch's recompile log: step 2's old_log_prob (2.31 s in Q, 0.60 after) should
    # be the compiled entropy's one recompile past 32-bit indexing (docs/placement.md, "One-step outliers")
    Run("g2ppo-m32-rc", "2gpu-ppo", "R", 2, "gae", PACKED, 32, 32, steps=10, ab=True,
        submit_flags=("env.TORCH_LOGS=recompiles",)),
    # S, T: held out from the refit of 2026-11-29 (steps 3+ timed, verl's poll in whole periods), predicted by the
    # round after it; 10 steps a run (8 timed: a full collection's 0.5-0.7 s falls on a phase one step in 4). S on 2
    # GPUs: the family never fitted, then micro 16 (2 and 8 and 32 were fitted) packed and PPO; T on 1 GPU (the kind
    # lent most), micro 16 in the three 1-GPU families
    Run("g2ppooff-m8", "2gpu-ppo-offload", "S", 2, "gae", PACKED, 8, 16, offload=True, steps=10),
    Run("g2fa-m16", "2gpu-packed", "S", 2, "grpo", PACKED, 16, 32, steps=10),
    Run("g2ppo-m16", "2gpu-ppo", "S", 2, "gae", PACKED, 16, 32, steps=10),
    Run("g1fa-m16", "1gpu-packed", "T", 1, "grpo", PACKED, 16, 32, steps=10, held_out=True),
    Run("g1ppo-m16", "1gpu-ppo", "T", 1, "gae", PACKED, 16, 32, steps=10, held_out=True),
    Run("g1pad-m16", "1gpu-padded", "T", 1, "grpo", PADDED, 16, 32, steps=8, held_out=True),
    # U: depth, on 1 GPU. On the 24-layer 0.5B the fit cannot tell a micro batch's per-layer host floor from its LM
    # head's (docs/placement.md, "The second refit": 0.5 ms and 100 ms by the fit, ~3-5 ms a layer by batch P's
    # trace); 28 and 36 layers at micro 8 / 16, host-bound, say which
    Run("g1fa3b-m8", "1gpu-deep", "U", 1, "grpo", PACKED, 8, 16, steps=10, held_out=True, shape="qwen2.5-3b"),
    Run("g1fa15b-m8", "1gpu-deep", "U", 1, "grpo", PACKED, 8, 16, steps=10, held_out=True, shape="qwen2.5-1.5b"),
    # V: held out from the third refit (2026-12-07), predicted by the round after it, on 1 GPU (the only kind lent
    # three sessions running): settings no run had, one a family. The critic at 28 layers, the packed update at
    # micro 4 (2 and 8 fitted, 16 seen), the padded pass at 28 layers (every padded run was 24); 8 steps, 6 timed.
    # ~450, 500 and 560 s: a session holds the first two
    Run("g1ppo15b-m8", "1gpu-ppo", "V", 1, "gae", PACKED, 8, 16, steps=8, held_out=True, shape="qwen2.5-1.5b"),
    Run("g1fa-m4", "1gpu-packed", "V", 1, "grpo", PACKED, 4, 8, steps=8, held_out=True),
    Run("g1pad15b-m8", "1gpu-padded", "V", 1, "grpo", PADDED, 8, 16, steps=8, held_out=True, shape="qwen2.5-1.5b"),
    # W: held out on 1 GPU, predicted by the round after batch R (2026-12-07; the model of 2173f09, no refit since):
    # the micro batch of 4 that V's g1fa-m4 missed by +52% (its host, 0.65 of the fit's: check_run.host_fit) in the
    # critic's and the padded families, and at 28 layers; each chain's host probe now says the CPU steal and what
    # else ran beside it. 8 steps, 6 timed
    Run("g1ppo-m4", "1gpu-ppo", "W", 1, "gae", PACKED, 4, 8, steps=8, held_out=True),
    Run("g1pad-m4", "1gpu-padded", "W", 1, "grpo", PADDED, 4, 8, steps=8, held_out=True),
    Run("g1fa15b-m4", "1gpu-deep", "W", 1, "grpo", PACKED, 4, 8, steps=8, held_out=True, shape="qwen2.5-1.5b"),
    # X: W's runs again, each on another machine than its first (same line, same recorded prediction): W's first
    # machine ran g1ppo-m4 at 0.57 of the fit's host seconds; the run again says whether the miss is the machine's
    # or the model's. g1ppo-m4-b ran on the H100 that ran g1pad-m4 (2026-12-07 16:13, started as g1ppo-m4)
    Run("g1ppo-m4-b", "1gpu-ppo", "X", 1, "gae", PACKED, 4, 8, steps=8, held_out=True, repeat_of="g1ppo-m4"),
    Run("g1fa15b-m4-b", "1gpu-deep", "X", 1, "grpo", PACKED, 4, 8, steps=8, held_out=True, shape="qwen2.5-1.5b",
        repeat_of="g1fa15b-m4"),
    # Y: V's two misses again on another machine (g1fa-m4 +51.7%, g1ppo15b-m8 +36.9% on V's H100, factor ~0.7), with
    # the chain's layer floor read before the runs as well as after (X's machine read it after its run only:
    # docs/placement.md, "The 1.5B line on a third H100"). Predicted again by round 5970744, recorded before the
    # session (the model V was judged by, no refit since)
    Run("g1fa-m4-b", "1gpu-packed", "Y", 1, "grpo", PACKED, 4, 8, steps=8, held_out=True, repeat_of="g1fa-m4"),
    Run("g1ppo15b-m8-b", "1gpu-ppo", "Y", 1, "gae", PACKED, 8, 16, steps=8, held_out=True, shape="qwen2.5-1.5b",
        repeat_of="g1ppo15b-m8"),
)
# G: g2fa-m32, run alone after C; H: 4 GPUs; the held-out batches last
BATCHES = ("A", "B", "C", "G", "D", "E", "F", "P", "Q", "R", "H", "S", "T", "U", "V", "W", "X", "Y")
BY_NAME = {r.name: r for r in RUNS}
FAMILY = {f.name: f for f in FAMILIES}
# Runs of held-out families looked at before a refit and then fitted on: fit runs from then on (the issue: "a run
# looked at before a refit becomes a fit run - say so"), each with the refit that took it. Their families keep their
# other runs held out; the target needs a family none of whose runs were ever fitted on.
REFIT_1 = "looked at (held out, predicted by round dea32d7) before the refit of 2026-11-28 (batch P's findings)"
REFIT_2 = "looked at (held out) before the refit of 2026-11-29 (steps 3+, batch Q's findings)"
FITTED_ON: dict[str, str] = {"g2pad-m8": REFIT_1, "g2fa-m8": REFIT_1, "g2ppo-m8": REFIT_1, "g2fa-m32": REFIT_1,
                             **{n: REFIT_2 for n in ("g2pad-m2", "g2fa-m2", "g2ppo-m32", "g2ppo-m2", "g2off-m8",
                                                     "g2off-m32", "g2ppo-m32-gc", "g2off-m32-gc")}}
# Held-out runs looked at before a refit that did not fit on them: seen (neither fitted nor blind) from then on. The
# refit of 2026-12-07 took its form from T's and U's log-prob passes; fitted on as well, it put a 3B's per-layer floor
# where U measured none and took the one-H100 grid's held-out padded run's old_log_prob to +53% (docs/placement.md).
REFIT_3 = ("looked at (held out, predicted by round 3278625) before the refit of 2026-12-07, which took its form "
           "from these runs' log-prob passes (a packed pass's logits serial after its layers' syncs); not fitted on")
SEEN: dict[str, str] = {n: REFIT_3 for n in ("g1fa-m16", "g1ppo-m16", "g1pad-m16", "g1fa3b-m8", "g1fa15b-m8")}


def run_role(run: Run) -> str:
    """fit, hold-out or seen: its family's, unless a refit took it (FITTED_ON) or looked at it (SEEN), or it is held
    out on its own."""
    if run.name in FITTED_ON:
        return "fit"
    if run.name in SEEN:
        return "seen"
    return "hold-out" if run.held_out else FAMILY[run.family].role


def batch_runs(batch: str) -> list[Run]:
    if batch not in BATCHES:
        raise SystemExit(f"no batch {batch!r}: the batches are {', '.join(BATCHES)}")
    return [r for r in RUNS if r.batch == batch]


def phases(batches: list[str], skip: tuple[str, ...] = ()) -> list[tuple[bool, list[Run]]]:
    """The batches' runs for one session, less SKIP: the padded ones (flash-attn out of the site), then those that
    need it. The site is shared, so flash-attn moves only between phases, with nothing running. Fit and held-out
    batches never share a session: the held-out ones run after the refit, with its predictions committed first."""
    unknown = [n for n in skip if n not in BY_NAME]
    if unknown:
        raise SystemExit(f"--skip {', '.join(unknown)}: no such run (the runs: {', '.join(BY_NAME)})")
    roles = {run_role(r) for b in batches for r in batch_runs(b) if not r.diagnosis}
    if len(roles) > 1:
        raise SystemExit(f"batches {'+'.join(batches)} mix fit and held-out runs: run the held-out batches in a "
                         "session of their own, after the refit and `predict --batch ...` are committed")
    runs = [r for b in dict.fromkeys(batches) for r in batch_runs(b) if r.name not in skip]
    return [(flash, got) for flash in (False, True) if (got := [r for r in runs if r.flash == flash])]


def gpu_sets(total: int) -> list[tuple[int, ...]]:
    """The GPU sets runs go on, one Ray cluster each: every GPU alone, aligned pairs (0-1, 2-3, ...) and aligned
    fours (0-3, ...)."""
    return ([(i,) for i in range(total)] + [(i, i + 1) for i in range(0, total - 1, 2)]
            + [tuple(range(i, i + 4)) for i in range(0, total - 3, 4)])


def first_free_set(size: int, total: int, busy: set[int]) -> Optional[tuple[int, ...]]:
    """The first GPU set of SIZE on a node of TOTAL GPUs that holds none of BUSY, else None."""
    return next((gs for gs in gpu_sets(total) if len(gs) == size and not busy & set(gs)), None)


def lane_plan(batches: list[str], gpus: int, need: dict[str, float],
              skip: tuple[str, ...] = ()) -> tuple[float, dict[str, tuple[float, float]]]:
    """Expected (seconds to the end, {run: (start, end)}) when each phase's runs start in order on the first free GPU
    set of their size (`gpu_sets`) of a node of GPUS, as the device chain starts them (NEED: expected seconds)."""
    t, out = 0.0, {}
    for _, runs in phases(batches, skip):
        going: list[tuple[float, tuple[int, ...]]] = []  # (end, GPU set) of the runs started
        for r in (r for r in runs if r.gpus <= gpus):
            for at in [t] + sorted(e for e, _ in going if e > t):
                free = first_free_set(r.gpus, gpus, {g for e, gs in going if e > at for g in gs})
                if free:
                    break
            going.append((at + need[r.name], free))
            out[r.name] = (at, at + need[r.name])
            t = at  # later runs start no earlier (in order)
        t = max((e for e, _ in going), default=t)
    return t, out


# ---------------------------------------------------------------- the plan, through the CLI
def facts_file(card: str, flash: bool, folder: Path, gpus: int = 2) -> Path:
    """A node of GPUS x CARD (the recorded 2x H200 node's facts, GPUs renamed for H100, copied up to 4) with or
    without flash-attn."""
    path = folder / f"{card}x{gpus}-{'fa' if flash else 'nofa'}.json"
    return _write_facts(card, flash, path, gpus)


def fixture_facts(card: str, gpus: int = 2) -> Path:
    """The facts a measured run is replayed on (committed beside the other facts; the flash-attn variant: the
    replay drops flash_attn for a run that ran without it)."""
    return _write_facts(card, True, REPO / "tests/fixtures/facts" / f"grid2_{card.lower()}x{max(gpus, 2)}.json",
                        max(gpus, 2))


def _write_facts(card: str, flash: bool, path: Path, gpus: int = 2) -> Path:
    if not path.exists():
        doc = json.loads(FACTS_TEMPLATE.read_text())
        nodes = doc if isinstance(doc, list) else [doc]
        name, mib = CARDS[card]
        for nf in nodes:
            _grow(nf, gpus)
            for g in nf["gpus"]:
                g.update(name=name, memory_total_mib=mib, memory_free_mib=mib - 600)
            versions = {k: v for k, v in nf["versions"].items() if k != "flash_attn"}
            nf["versions"] = {**versions, "verl": "0.9.1", **({"flash_attn": "2.8.3"} if flash else {})}
        path.write_text(json.dumps(nodes if isinstance(doc, list) else nodes[0]))
    return path


def _grow(nf: dict[str, Any], gpus: int) -> None:
    """The recorded 2-GPU node as the 4-GPU machine the device lends (NVLink between every pair, as nvidia-smi topo
    showed on the 2-GPU kind; the chain keeps `nvidia-smi topo -m` of the machine it ran on; 16 cores and 128 GiB of
    host a GPU, as `status` says of each kind)."""
    if gpus <= len(nf["gpus"]):
        return
    first = nf["gpus"][0]
    nf["gpus"] = [{**first, "index": i, "uuid": f"{first['uuid'][:-2]}{i:02d}"} for i in range(gpus)]
    pair = nf["gpu_pairs"][0]
    nf["gpu_pairs"] = [{**pair, "a": a, "b": b} for a in range(gpus) for b in range(a + 1, gpus)]
    nf.update(cpu_count=16 * gpus, mem_total_mib=nf["mem_total_mib"] // 2 * gpus)


def plan_argv(run: Run, card: str, folder: Path, fill: Optional[float] = None) -> list[str]:
    """The arguments of `verl-cluster` that plan the run's line on a node of CARD, as --json."""
    argv = ["plan", "--json", "--facts", str(facts_file(card, run.flash, folder, run.gpus))]
    # the calibrated hosts' plan: a round predicts the model, not a speed this machine's store learned
    return [*argv, *(["--fill", str(fill)] if fill is not None else []), "placement.host_factor=off", "--",
            *run.line()]


def plan(run: Run, card: str, folder: Path, fill: Optional[float] = None) -> dict[str, Any]:
    """`verl-cluster plan --json` of the run's line on a node of CARD (the CLI, as a user runs it)."""
    r = subprocess.run([sys.executable, "-m", "verl_cluster", *plan_argv(run, card, folder, fill)],
                       capture_output=True, text=True, timeout=180, cwd=REPO)
    try:
        return json.loads(r.stdout)
    except ValueError:
        last = (r.stderr.strip().splitlines() or ["no output"])[-1]
        raise SystemExit(f"plan of {run.name} on {card} failed (rc {r.returncode}): {last}") from None


def expected_s(step_s: float, steps: int = STEPS) -> float:
    """Seconds a run takes from submit to its end: start-up and exit, step 1 as two steps, the rest."""
    return round(STARTUP_S + (steps + 1) * step_s, 1)


def predict_run(run: Run, card: str, folder: Path) -> dict[str, Any]:
    """The plan at each fill (the one at 1.0, the worst case, gives the verdict and the error bar)."""
    docs = {f: plan(run, card, folder, f) for f in FILLS}
    worst, by_fill = docs[1.0], [[f, (d.get("time") or {}).get("phases_s", {})] for f, d in docs.items()]
    # the phases at other hosts' speeds, at the fill a run is budgeted at (check_run.host_fit in the report)
    hosts = (docs[EXPECTED_FILL].get("time") or {}).get("by_host_factor")
    t = worst.get("time") or {}
    step = sum(at_fill(by_fill, EXPECTED_FILL).values())
    return {"feasible": worst["feasible"], "problems": worst.get("problems"), "hardware": worst["hardware"],
            "step_s": t.get("step_s"), "phases_s": t.get("phases_s"), "error_bar": t.get("error_bar"),
            "notes": t.get("notes"), "by_fill": by_fill, "tokens_full": run.sequences * (512 + 384),
            "peak_gib": max((g["peak_gib"] for g in worst.get("gpus", [])), default=None),
            "host_gib": worst.get("host_steady_gib_per_node"), "step_at_expected_fill": round(step, 2),
            "expected_s": expected_s(step, run.steps), **({"by_host_factor": hosts} if hosts else {})}


def git(*args: str) -> str:
    return subprocess.run(["git", *args], capture_output=True, text=True, cwd=REPO).stdout


def predict(names: list[str], path: Path = PREDICTIONS, workers: int = 2) -> dict[str, Any]:
    """Plan NAMES on both cards and append the round to PATH (kept: each round is what was predicted then)."""
    runs = [BY_NAME[n] for n in names]
    with tempfile.TemporaryDirectory() as tmp, ThreadPoolExecutor(workers) as pool:
        jobs = {(r.name, c): pool.submit(predict_run, r, c, Path(tmp)) for r in runs for c in CARDS}
        got = {r.name: {c: jobs[(r.name, c)].result() for c in CARDS} for r in runs}
    dirty = [ln[3:] for ln in git("status", "--porcelain", "--", "verl_cluster/placement",  # "XY path"
                                  "verl_cluster/catalog").splitlines() if ln.strip()]
    rnd = {"commit": git("rev-parse", "HEAD").strip(), "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "model_files_changed_since_commit": dirty, "runs": got}
    doc = json.loads(path.read_text()) if path.exists() else {"_comment": "", "rounds": []}
    doc["_comment"] = ("issue 33's second grid (scripts/calibration/grid2.py predict): each round is the plan of "
                       "every run named, for H100 and H200, recorded before the runs; by_fill holds the phases at "
                       "each fill, so a run is read at its own lengths. The report holds each run against the "
                       "latest round dated before it started.")
    doc["rounds"].append(rnd)
    path.write_text(dump(doc))
    return rnd


def dump(doc: dict) -> str:
    """JSON with one line per run and card (diffs stay readable)."""
    head = {k: v for k, v in doc.items() if k != "rounds"}
    out = ["{"] + [f"  {json.dumps(k)}: {json.dumps(v)}," for k, v in head.items()] + ['  "rounds": [']
    for i, rnd in enumerate(doc["rounds"]):
        meta = {k: v for k, v in rnd.items() if k != "runs"}
        out.append("    {" + json.dumps(meta)[1:-1] + ', "runs": {')
        rows = [f'      {json.dumps(f"{n}")}: {{' + ", ".join(f"{json.dumps(c)}: {json.dumps(p)}" for c, p in
                                                      cards.items()) + "}" for n, cards in rnd["runs"].items()]
        out.append(",\n".join(rows))
        out.append("    }}" + ("," if i < len(doc["rounds"]) - 1 else ""))
    return "\n".join(out + ["  ]", "}"]) + "\n"


# ---------------------------------------------------------------- verl's console metrics
_STEP = re.compile(r"step:(\d+) - (.*)$")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_NUM = re.compile(r"^(?:np\.\w+\()?(-?[0-9.]+(?:e[-+]?\d+)?)\)?$")
KEEP = ("timing_s/", "response_length/mean", "prompt_length/mean")  # and every */perf/* key
# Steps not timed: step 1 compiles and warms up; step 2 recompiles the compiled entropy once (old_log_prob, 0.2-2.7 s:
# docs/placement.md, "One-step outliers"). The planner's step is a steady one.
FIRST_STEPS = (1, 2)  # check_run.warmup, as the product holds a run to its plan


def step_line(line: str) -> Optional[re.Match]:
    """verl's console line of a step (`step:N - key:value - ...`, Ray's prefix and colours or not): N, the pairs."""
    return _STEP.search(_ANSI.sub("", line))


def parse_steps(lines: list[str]) -> dict[int, dict[str, float]]:
    """{step: metrics} from verl's console logger lines (`step:N - key:value - ...`, Ray's prefix or not)."""
    out: dict[int, dict[str, float]] = {}
    for line in lines:
        m = step_line(line)
        if not m:
            continue
        got = {}
        for kv in m.group(2).split(" - "):
            k, _, v = kv.strip().rpartition(":")
            num = _NUM.match(v.strip())
            if (k.startswith(KEEP) or "perf/" in k) and num:
                got[k] = float(num.group(1))
        out.setdefault(int(m.group(1)), {}).update(got)
    return out


def _check_run() -> Any:
    """The product's check_run, loaded from its file: the device chain runs under the machine's python3, which has
    no verl_cluster installed, and check_run needs only the standard library."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("grid2_check_run", REPO / "verl_cluster/placement/check_run.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def measured(steps: dict[Any, dict[str, float]], sequences: int) -> dict[str, Any]:
    """The product's means (check_run.measured) over the steps after FIRST_STEPS, with what the report adds: each
    phase's seconds step by step, verl's own step time, the fill."""
    steps = {int(k): v for k, v in steps.items()}
    got = _check_run().measured(steps, FIRST_STEPS)
    if not got:
        return {}
    timed = [m for s, m in sorted(steps.items()) if s not in FIRST_STEPS and "timing_s/step" in m]
    toks = got.get("tokens_per_step")
    return {"steps": got["steps"], "phases_s": got["phases_s"], "step_s": got["step_s"],
            "per_step_s": {n: [round(m[f"timing_s/{n}"], 2) for m in timed] for n in got["phases_s"]},
            "verl_step_s": sum(m["timing_s/step"] for m in timed) / len(timed),
            "fill": toks / (sequences * (512 + 384)) if toks else None,
            "max_memory_reserved_gib": got.get("gpu_reserved_gib")}


# ---------------------------------------------------------------- the measured runs as fixtures
def shared_cluster(result: dict, run: Run) -> bool:
    """A run recorded beside others on one Ray cluster (before grid2_device gave each GPU set its own): it shared
    verl's TransferQueue with them, so its steps are no measurement."""
    return (result.get("machine_gpus") or 0) > run.gpus and not result.get("gpu_set")


def to_entry(result: dict, results: list[dict]) -> Optional[tuple[str, dict]]:
    """(run, entry) in scripts/calibration/fit_plan_calibration.py's figures form (the line as it ran, the facts of its card, its
    fill and verl's timing_s/* per step), role fit or hold-out (run_role); None for a run that is no measurement
    (no timed steps, or it shared a Ray cluster: grid2_shared_queue)."""
    run = BY_NAME.get(result.get("run", ""))
    m = measured(result.get("steps") or {}, run.sequences) if run else {}
    if not run or run.diagnosis or not m or shared_cluster(result, run):
        return None
    card = card_key(result["card"])
    keep = ("timing_s/", "perf/total_num_tokens", "response_length/mean", "prompt_length/mean")
    steps = {str(k): {kk: v for kk, v in st.items() if kk.startswith(keep)} for k, st in result["steps"].items()}
    return run.name, {
        "recorded": f"{result['started_utc']}, {result['card']} (GPU {result.get('gpu_set')} of "
                    f"{result.get('machine_gpus')}, a Ray cluster of its own), verl 0.9.1 + vLLM 0.24.0, "
                    f"scripts/calibration/grid2.py batch {run.batch}",
        "facts": str(fixture_facts(card, run.gpus).relative_to(REPO)), "nodes": 1, "line": run.line(),
        "flash_attn": bool(result.get("flash_attn")), "fill": round(m["fill"], 3) if m.get("fill") else 1.0,
        "fill_how": "verl's perf/total_num_tokens over 128 x (512 + 384), mean of the timed steps",
        "first_steps": list(FIRST_STEPS), "steps": steps, "gpu_reserved_gib": m.get("max_memory_reserved_gib"),
        "family": run.family, "time": run_role(run), "card": card,
        "beside": beside(result, results), "recorded_before_the_model": False}


def write_fixture(results: list[dict], path: Path = FIXTURE) -> list[str]:
    """Add the runs that are measurements to PATH (a run measured again replaces its entry); their names."""
    doc = json.loads(path.read_text()) if path.exists() else {"runs": {}}
    doc["_comment"] = ("issue 33's second grid, measured (scripts/calibration/grid2.py fixture): each entry is a verl "
                       "run as it ran (its line, its card's facts, its fill, verl's timing_s/* per step), time fit "
                       "(fitted on by scripts/calibration/fit_plan_calibration.py) or hold-out (never fitted on; its prediction "
                       "was recorded before it ran: grid2_predictions.json).")
    got = [e for e in (to_entry(r, results) for r in results) if e]
    doc["runs"] = {**doc.get("runs", {}), **dict(got)}
    path.write_text(json.dumps({"_comment": doc["_comment"], "runs": doc["runs"]}, indent=1) + "\n")
    return [n for n, _ in got]


# ---------------------------------------------------------------- report
def at_fill(by_fill: list, fill: float) -> dict[str, float]:
    """The phases predicted at FILL, linear between the two recorded fills around it (clamped to the ends)."""
    fill = min(max(fill, by_fill[0][0]), by_fill[-1][0])
    hi = next(i for i, (f, _) in enumerate(by_fill) if f >= fill)
    (f0, a), (f1, b) = by_fill[max(hi - 1, 0)], by_fill[hi]
    w = 0.0 if f1 == f0 else (fill - f0) / (f1 - f0)
    return {k: a[k] + w * (b.get(k, a[k]) - a[k]) for k in a}


def card_key(name: str) -> str:
    return next((c for c in CARDS if c in name), name)


def prediction(rnd: dict, run: Run, card: str) -> Optional[dict]:
    """RND's prediction for RUN on CARD: its own, else (a run again) its first's, the same line."""
    return (rnd["runs"].get(run.name, {}).get(card)
            or (rnd["runs"].get(run.repeat_of, {}).get(card) if run.repeat_of else None))


def judge(result: dict, rounds: list[dict]) -> dict[str, Any]:
    """One run: the round it is held against (the latest dated before it started), the pairs, the verdict."""
    run = BY_NAME[result["run"]]
    card = card_key(result["card"])
    before = [r for r in rounds if r["date"] <= result["started_utc"] and prediction(r, run, card)]
    role = run_role(run)
    out: dict[str, Any] = {"run": run.name, "family": run.family, "card": result["card"], "gpus": run.gpus,
                           "host_python_ms": (result.get("host_cpu") or {}).get("host_python_ms")}
    m = measured(result.get("steps") or {}, run.sequences)
    if shared_cluster(result, run):
        return {**out, "role": role, "blind": False, "why": "ran beside other runs on one Ray cluster, which has one "
                "verl TransferQueue: they shared batches (not a measurement)"}
    if not before or not m:
        return {**out, "role": role, "blind": False, "why": "no steps measured" if not m else
                "no prediction recorded before it ran"}
    rnd = before[-1]
    later = [r["commit"] for r in rounds if r["date"] > rnd["date"] and r["date"] <= result["started_utc"]]
    p = prediction(rnd, run, card)
    fill = m["fill"] if m.get("fill") else 1.0
    pred = at_fill(p["by_fill"], fill)
    phases = []
    for name in sorted(set(pred) | set(m["phases_s"])):
        pv, mv = pred.get(name, 0.0), m["phases_s"].get(name, 0.0)
        row = {"phase": name, "predicted": round(pv, 3), "measured": round(mv, 3),
               "error": round(pv / mv - 1, 3) if mv > 0 else None, "held": mv > PHASE_MIN_S,
               "per_step": m.get("per_step_s", {}).get(name, [])}
        row["ok"] = (row["error"] is not None and abs(row["error"]) <= PHASE_BOUND) if row["held"] else None
        phases.append(row)
    step_p, step_m = sum(pred.values()), m["step_s"]
    err = step_p / step_m - 1
    ok = abs(err) <= STEP_BOUND and all(r["ok"] is not False for r in phases)
    return {**out, "role": role, "blind": True, "commit": rnd["commit"], "predicted_at": rnd["date"],
            "newer_rounds_before_run": later, "fill": round(fill, 3), "steps": m["steps"],
            "step_predicted": round(step_p, 2), "step_measured": round(step_m, 2), "step_error": round(err, 3),
            "error_bar_pct": (p.get("error_bar") or {}).get("pct"), "phases": phases, "meets_target": ok,
            "host": at_host_factor(p, m, fill), "host_table": bool(p.get("by_host_factor")),
            "max_memory_reserved_gib": m.get("max_memory_reserved_gib"), "planned_peak_gib": p.get("peak_gib")}


def at_host_factor(p: dict, m: dict, fill: float) -> Optional[dict[str, Any]]:
    """The product's "is it the host?" (check_run.host_fit) on a run against its round's plan, which kept its phases
    at host factors since round 2026-12-07 (None before, or when no factor moves them), with whether the run meets
    the target at that factor: the step within STEP_BOUND, every phase over PHASE_MIN_S within PHASE_BOUND. The
    target is met or not without it; this says how much of a miss is the machine's speed, which the plan cannot
    know before a run (one H100 moved 1.2x in 20 minutes: docs/placement.md, "Batch R")."""
    if not p.get("by_host_factor") or not p.get("tokens_full"):
        return None
    got = _check_run().host_fit(p, {"phases_s": m["phases_s"], "tokens_per_step": fill * p["tokens_full"]})
    if got is None:
        return None
    ends = (p["by_host_factor"][0][0], p["by_host_factor"][-1][0])  # a factor at an end may lie beyond it
    meets = ends[0] < got["factor"] < ends[1] and abs(got["step_error_at_factor"]) <= STEP_BOUND and all(
        abs(e) <= PHASE_BOUND for e in got["phases_at_factor"].values())
    return {**got, "meets_target_at_factor": meets}


def _span(result: dict) -> tuple[float, float]:
    t0 = calendar.timegm(time.strptime(result["started_utc"], "%Y-%m-%dT%H:%M:%SZ"))
    return t0, t0 + float(result.get("wall_s") or 0)


def beside(result: dict, results: list[dict]) -> list[str]:
    """The runs that ran on the same machine's other GPUs while RESULT ran (side by side in one session)."""
    a0, a1 = _span(result)
    return [o["run"] for o in results if o is not result and o.get("started_utc") and o.get("card") ==
            result.get("card") and _span(o)[0] < a1 and a0 < _span(o)[1]]


def _family_row(f: Family, role: str, mine: list[dict]) -> dict[str, Any]:
    return {"family": f.name, "role": role, "what": f.what, "runs": len(mine),
            "worst_step_error": max((r["step_error"] for r in mine), key=abs),
            "worst_phase_error": max((p["error"] for r in mine for p in r["phases"] if p["held"]),
                                     key=abs, default=None),
            "meets_target": all(r["meets_target"] for r in mine)}


def report(results: list[dict], rounds: list[dict]) -> dict[str, Any]:
    results = [r for r in results if r.get("run") in BY_NAME and not BY_NAME[r["run"]].diagnosis]
    runs = [{**judge(r, rounds), "beside": beside(r, results)} for r in results]
    fams = []
    for f in FAMILIES:  # a family's runs of another role (a refit took or saw them, or held out on their own): a row
        for role in dict.fromkeys((f.role, "fit", "hold-out", "seen")):
            mine = [r for r in runs if r["family"] == f.name and r.get("blind") and r["role"] == role]
            if mine:
                fams.append(_family_row(f, role, mine))
    held = [r for r in runs if r["role"] == "hold-out" and r.get("blind")]
    held_fams = {r["family"] for r in held}
    # a line run again on another machine (repeat_of) is one more run, not one more line: the target counts lines
    lines = {BY_NAME[r["run"]].repeat_of or r["run"] for r in held}
    target = {"held_out_runs": len(held), "held_out_lines": len(lines), "held_out_families": len(held_fams),
              "held_out_families_on_2_gpus": len({r["family"] for r in held if r["gpus"] >= 2}),
              "held_out_runs_meeting": sum(r["meets_target"] for r in held),
              # beside the target, not part of it: the runs their round's plan met at their own host's speed
              "held_out_runs_with_host_factor": sum(bool(r.get("host")) for r in held),
              "held_out_runs_meeting_at_host_factor": sum(bool((r.get("host") or {}).get("meets_target_at_factor"))
                                                          for r in held)}
    # held out by axis: a family with a blind held-out run and none of its runs ever fitted on (a fit family's runs
    # held out on their own do not count)
    target["families_never_fitted"] = len({f for f in held_fams if not any(
        r.family == f and run_role(r) == "fit" for r in RUNS)})
    target["met"] = (target["held_out_lines"] >= 6 and target["held_out_families"] >= 3 and
                     target["held_out_families_on_2_gpus"] >= 2 and target["held_out_runs_meeting"] == len(held)
                     and target["families_never_fitted"] >= 1)
    return {"families": fams, "runs": runs, "target": target}


def markdown(rep: dict[str, Any]) -> str:
    pct = (lambda x: "—" if x is None else f"{x * 100:+.1f}%")
    out = ["| family | role | runs | worst step | worst phase > 0.5 s | target |", "|---|---|---|---|---|---|"]
    for f in rep["families"]:
        name = f"**{f['family']}**" if f["role"] == "hold-out" else f["family"]
        out.append(f"| {name} | {f['role']} | {f['runs']} | {pct(f['worst_step_error'])} | "
                   f"{pct(f['worst_phase_error'])} | {'met' if f['meets_target'] else 'NOT met'} |")
    out += ["", "| run | family (role) | card | fill | step pred / meas | error | phases over 0.5 s (pred / meas, "
            "error) | at its host factor |", "|---|---|---|---|---|---|---|---|"]
    for r in rep["runs"]:
        card = r["card"] + (f" (host {r['host_python_ms']:g} ms)" if r.get("host_python_ms") else "")
        if not r.get("blind"):
            out.append(f"| {r['run']} | {r['family']} ({r['role']}) | {card} | — | — | — | {r['why']} | — |")
            continue
        h = r.get("host")
        host = ("— (no host factor moves its phases)" if r.get("host_table") else
                "— (its round kept no host table)") if not h else (
            f"{h['factor']:.2f}x: step {pct(h['step_error_at_factor'])}, worst phase "
            f"{pct(max(h['phases_at_factor'].values(), key=abs, default=None))}"
            f" ({'meets' if h['meets_target_at_factor'] else 'not met'})")
        ph = "; ".join(f"{p['phase']} {p['predicted']:.2f} / {p['measured']:.2f} ({pct(p['error'])}"
                       + (f"; steps {', '.join(f'{v:.2f}' for v in p['per_step'])}" if p["ok"] is False and
                          p.get("per_step") else "") + ")" for p in r["phases"] if p["held"])
        name = f"**{r['run']}**" if r["role"] == "hold-out" else r["run"]
        out.append(f"| {name} | {r['family']} ({r['role']}) | {card} | {r['fill']} | {r['step_predicted']} / "
                   f"{r['step_measured']} | {pct(r['step_error'])} (bar ±{r['error_bar_pct']}%) | {ph} | {host} |")
    t = rep["target"]
    out += ["", "Target (held-out step ±20%, phases over 0.5 s ±30%; ≥6 held-out runs, ≥3 families, ≥2 on 2 "
                f"GPUs, ≥1 never fitted on): {t['held_out_runs_meeting']} of {t['held_out_runs']} held-out runs "
                + (f"({t['held_out_lines']} lines: {t['held_out_runs'] - t['held_out_lines']} run again on another "
                   "machine) " if t["held_out_lines"] < t["held_out_runs"] else "") + "meet it, "
                f"{t['held_out_families']} families ({t['held_out_families_on_2_gpus']} on 2 GPUs, "
                f"{t['families_never_fitted']} never fitted on): "
                f"{'met' if t['met'] else 'NOT met'}."]
    if t.get("held_out_runs_with_host_factor"):
        out.append(f"At each run's own host factor (check_run.host_fit; not the target): "
                   f"{t['held_out_runs_meeting_at_host_factor']} of the {t['held_out_runs_with_host_factor']} "
                   "held-out runs with a host factor meet it.")
    return "\n".join(out) + "\n"


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="phase", required=True)
    p = sub.add_parser("predict")
    p.add_argument("--batch", action="append", choices=BATCHES, help="only these batches' runs (default: all)")
    for name in ("start", "chain", "run"):
        p = sub.add_parser(name)
        p.add_argument("batch", nargs="+", choices=BATCHES,
                       help="one session's batches (several run side by side on the GPUs)")
        p.add_argument("--skip", action="append", default=[], metavar="RUN",
                       help="leave this run out (a later session runs it): on 2 GPUs a fit session holds ~5 runs")
    p = sub.add_parser("fixture")
    p.add_argument("dir", type=Path, help="a folder holding grid2-RUN.json files (searched below it)")
    p = sub.add_parser("report")
    p.add_argument("dir", type=Path, help="a folder holding grid2-RUN.json files (searched below it)")
    p.add_argument("--json", type=Path)
    p.add_argument("--md", type=Path)
    a = ap.parse_args(argv)
    if a.phase == "predict":
        names = [r.name for r in RUNS if not a.batch or r.batch in a.batch]
        rnd = predict(names)
        bad = [f"{n} on {c}" for n, cs in rnd["runs"].items() for c, p in cs.items() if not p["feasible"]]
        print(f"round {rnd['commit'][:10]} {rnd['date']}: {len(names)} runs x {len(CARDS)} cards -> {PREDICTIONS}"
              + (f"; INFEASIBLE: {', '.join(bad)}" if bad else ""))
        return 1 if bad else 0
    if a.phase in ("start", "chain", "run"):
        sys.modules.setdefault("grid2", sys.modules[__name__])  # one module, run as a script or imported
        import grid2_device as dev

        {"start": dev.start, "chain": dev.chain, "run": dev.run_batch}[a.phase](a.batch, tuple(a.skip))
    else:
        files = sorted(a.dir.rglob("grid2-*.json"))
        results = [json.loads(f.read_text()) for f in files]
        results = [r for r in results if isinstance(r, dict) and "run" in r]
        if not results:
            raise SystemExit(f"no grid2-RUN.json results under {a.dir}")
        if a.phase == "fixture":
            names = write_fixture(results)
            print(f"{len(names)} of {len(results)} runs -> {FIXTURE}: {', '.join(names) or 'none'}")
            return 0 if names else 1
        rep = report(results, json.loads(PREDICTIONS.read_text())["rounds"])
        if a.json:
            a.json.write_text(json.dumps(rep, indent=1) + "\n")
        text = markdown(rep)
        if a.md:
            a.md.write_text(text)
        print(text, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
