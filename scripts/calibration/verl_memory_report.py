#!/usr/bin/env python3
"""The plan's GPU memory against a real verl run, per phase (docs/BENCHMARKS.md, "verl for real").

    python3 scripts/calibration/verl_memory_report.py RUN_DIR NAME [--out FIXTURE.json] [--md]

RUN_DIR holds what scripts/gpu/gpu_e2e.sh leaves for run NAME: plan-NAME.json (`plan --json`), nvml-NAME.jsonl
(scripts/gpu/gpu_mem_sampler.py) and log-NAME.txt (the job's log, each line stamped with the time it appeared).
Phases come from the process titles NVML sees: Ray names a busy worker `ray::WorkerDict.<method>`, so the
trainer's phase is in its title; the rollout is when the vLLM worker (`VLLM::Worker`) is awake (well above the
memory it keeps asleep). Per phase: the peak of the GPU's memory in use (NVML, all processes), of the trainer
process and of the vLLM process, against the plan's predicted peak for that phase. From the log: verl's own
perf/max_memory_* metrics and vLLM's memory lines (KV cache, CUDA graphs, sleep).
--out writes the compact record that tests/unit/test_verl_memory_fixture.py replays.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from verl_cluster.verl_logs.verl_log import VerlProgress  # noqa: E402

# Ray task (WorkerDict method suffix) -> the plan's phase name
TASK_PHASE = {
    "update_actor": "actor update",
    "compute_log_prob": "actor log-prob",
    "compute_ref_log_prob": "ref log-prob",
    "update_critic": "critic update",
    "compute_values": "critic values",
    "critic_train_mini_batch": "critic update",  # verl 0.9.1's critic (engine TrainingWorker)
    "critic_infer_batch": "critic values",
}
AWAKE_MARGIN_MIB = 2048  # the vLLM process this far above its asleep level is serving the rollout
VLLM_LINES = {
    "model_loading_gib": re.compile(r"Model loading took ([\d.]+) GiB"),
    "kv_cache_gib": re.compile(r"Available KV cache memory: ([\d.]+) GiB"),
    "kv_cache_tokens": re.compile(r"GPU KV cache size: ([\d,]+) tokens"),
    "cuda_graphs_gib": re.compile(r"Graph capturing finished in \d+ secs, took ([\d.]+) GiB"),
    "sleep_freed_cumem_gib": re.compile(r"sleep freed ([\d.]+) GiB memory in total"),
}


def phase_of(title: str) -> str | None:
    if "WorkerDict." not in title:
        return None
    task = title.rsplit(".", 1)[-1]
    for suffix, phase in TASK_PHASE.items():
        if task.endswith(suffix):
            return phase
    return None


def read_samples(path: Path) -> list[dict]:
    out = []
    for line in path.read_text().splitlines():
        d = json.loads(line)
        if "procs" in d:
            out.append(d)
    return out


def measure(samples: list[dict]) -> dict:
    """Per phase: peak GiB of the GPU (NVML used, GPU 0), of the trainer process and of the vLLM process."""
    vllm_all = [m for d in samples for _, _, m, t in d["procs"] if t.startswith("VLLM")]
    # asleep: what the vLLM process keeps while the trainer computes (its phase is in its title)
    asleep_vals = [m for d in samples if any(phase_of(t) for _, _, _, t in d["procs"])
                   for _, _, m, t in d["procs"] if t.startswith("VLLM")]
    asleep = max(asleep_vals) if asleep_vals else None
    phases: dict[str, dict] = {}
    for d in samples:
        vllm = max((m for _, _, m, t in d["procs"] if t.startswith("VLLM")), default=0)
        trainer = [(m, t) for _, _, m, t in d["procs"] if "WorkerDict" in t]
        phase = next((p for p in (phase_of(t) for _, t in trainer) if p), None)
        if vllm and asleep is not None and vllm > asleep + AWAKE_MARGIN_MIB:
            phase = "generate"
        if phase is None:
            continue
        rec = phases.setdefault(phase, {"gpu_gib": 0.0, "trainer_gib": 0.0, "vllm_gib": 0.0, "samples": 0})
        rec["gpu_gib"] = max(rec["gpu_gib"], d["gpus"][0] / 1024)
        rec["trainer_gib"] = max(rec["trainer_gib"], max((m for m, _ in trainer), default=0) / 1024)
        rec["vllm_gib"] = max(rec["vllm_gib"], vllm / 1024)
        rec["samples"] += 1
    for rec in phases.values():
        for k in ("gpu_gib", "trainer_gib", "vllm_gib"):
            rec[k] = round(rec[k], 2)
    return {"phases": phases, "vllm_asleep_gib": round(asleep / 1024, 2) if asleep is not None else None,
            "vllm_awake_gib": round(max(vllm_all) / 1024, 2) if vllm_all else None}


def predicted(plan: dict) -> dict[str, float]:
    out = {}
    for role in plan.get("roles", {}).values():
        for ph in role.get("phases", []):
            name = "generate" if ph["phase"] == "generate" else ph["phase"]
            out[name] = max(out.get(name, 0.0), ph["peak_gib"])
    return out


def read_log(path: Path) -> dict:
    prog = VerlProgress()
    vllm: dict[str, list[float]] = {k: [] for k in VLLM_LINES}
    for line in path.read_text(errors="replace").splitlines():
        text = line.split(" ", 1)[1] if re.match(r"^\d+\.\d+ ", line) else line
        prog.feed(text + "\n")
        for k, rx in VLLM_LINES.items():
            m = rx.search(text)
            if m:
                vllm[k].append(float(m.group(1).replace(",", "")))
    s = prog.summary()
    # the longest step's mean sequence (prompt + response tokens): with use_remove_padding, micro batches hold
    # real tokens only, so the plan is compared at this length too (plan --fill)
    lens = [m["prompt_length/mean"] + m["response_length/mean"] for m in prog.steps.values()
            if "prompt_length/mean" in m and "response_length/mean" in m]
    return {"verl": {k: s.get(k) for k in ("steps", "max_memory_allocated_gb", "max_memory_reserved_gb",
                                           "mean_step_time_s", "throughput_tokens_per_gpu_s")}
            | ({"seq_tokens_mean": round(max(lens), 1)} if lens else {}),
            "vllm": {k: (v[0] if k != "sleep_freed_cumem_gib" else max(v)) for k, v in vllm.items() if v}}


def submitted(run_dir: Path, name: str) -> dict:
    """The job file and key=value arguments `submit` was given (the first line of its step log)."""
    for log in sorted(run_dir.glob(f"*-submit-{name}.log")):
        argv = log.read_text(errors="replace").splitlines()[0].split()
        if "submit" in argv:
            rest = argv[argv.index("submit") + 1:]
            return {"job": rest[0], "args": [a for a in rest[1:] if "=" in a and not a.startswith("-")]}
    return {}


def report(run_dir: Path, name: str) -> dict:
    plan = json.loads((run_dir / f"plan-{name}.json").read_text())
    got = measure(read_samples(run_dir / f"nvml-{name}.jsonl"))
    log = read_log(run_dir / f"log-{name}.txt") if (run_dir / f"log-{name}.txt").exists() else {}
    pred = predicted(plan)
    rows = []
    for phase, m in got["phases"].items():
        p = pred.get(phase)
        rows.append({"phase": phase, "predicted_gib": p, **m,
                     "error": round((p - m["gpu_gib"]) / m["gpu_gib"], 3) if p and m["gpu_gib"] else None})
    return {"run": name, "submitted": submitted(run_dir, name), "hardware": plan.get("hardware"), "model": plan.get("model"),
            "settings": plan.get("settings"), "overrides": plan.get("overrides"),
            "rows": rows, "vllm_asleep_gib": got["vllm_asleep_gib"], "vllm_awake_gib": got["vllm_awake_gib"], **log}


def markdown(r: dict) -> str:
    out = [f"{r['run']}: {r['model']['name']} ({r['model']['params'] / 1e9:.2f}B) on {r['hardware']['description']}",
           "", "| phase | predicted GiB | GPU measured GiB | error | trainer process | vLLM process |",
           "|---|---|---|---|---|---|"]
    for row in r["rows"]:
        err = f"{row['error']:+.1%}" if row["error"] is not None else "-"
        out.append(f"| {row['phase']} | {row['predicted_gib']} | {row['gpu_gib']} | {err} | {row['trainer_gib']} "
                   f"| {row['vllm_gib']} |")
    return "\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("name")
    ap.add_argument("--out", type=Path, help="write the record (JSON) here")
    ap.add_argument("--md", action="store_true", help="print a markdown table instead of JSON")
    a = ap.parse_args()
    r = report(a.run_dir, a.name)
    if a.out:
        a.out.write_text(json.dumps(r, indent=1) + "\n")
    print(markdown(r) if a.md else json.dumps(r, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
