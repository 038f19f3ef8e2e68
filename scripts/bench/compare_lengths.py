#!/usr/bin/env python3
"""Predicted sequence lengths (`verl-cluster plan --json`) next to the ones a verl run logged.

    verl-cluster plan launch/gsm8k_grpo.yaml --data ~/data/gsm8k/train.parquet --json > plan.json
    (run the job; keep its console log: `verl-cluster logs JOB > run.log`, or the driver's output)
    python scripts/bench/compare_lengths.py run.log plan.json [--json]

verl's console logger prints, per training step, `prompt_length/mean` and `response_length/mean` over the step's
batch (trainer/ppo/metric_utils.py). The plan's `lengths` says what it planned at and where each number came from.
Exit 0 when both were found, 2 when the log has no step or the plan no lengths.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from verl_cluster.verl_logs.verl_log import VerlProgress  # noqa: E402


def logged(log_text: str) -> dict[str, list[float]]:
    prog = VerlProgress()
    prog.feed(log_text)
    prog.flush()
    out: dict[str, list[float]] = {}
    for step in sorted(prog.steps):
        for key in ("prompt_length/mean", "response_length/mean", "prompt_length/max", "response_length/max"):
            if key in prog.steps[step]:
                out.setdefault(key, []).append(prog.steps[step][key])
    return out


def compare(log_text: str, plan: dict) -> dict:
    got = logged(log_text)
    lengths = plan.get("lengths") or {}
    rows = []
    for name, key in (("prompt", "prompt_length/mean"), ("response", "response_length/mean")):
        pred = (lengths.get(name) or {}).get("mean")
        vals = got.get(key, [])
        mean = sum(vals) / len(vals) if vals else None
        rows.append({"quantity": f"{name} tokens (mean)", "predicted": pred,
                     "source": (lengths.get(name) or {}).get("source"), "logged_mean": mean,
                     "logged_min": min(vals) if vals else None, "logged_max": max(vals) if vals else None,
                     "steps": len(vals),
                     "error": (pred - mean) / mean if pred is not None and mean else None})
    pred_seq = lengths.get("tokens_per_sequence")
    p, r = got.get("prompt_length/mean", []), got.get("response_length/mean", [])
    seq = [a + b for a, b in zip(p, r)]
    seq_mean = sum(seq) / len(seq) if seq else None
    rows.append({"quantity": "sequence tokens (mean)", "predicted": pred_seq, "source": "prompt + response",
                 "logged_mean": seq_mean, "logged_min": min(seq) if seq else None,
                 "logged_max": max(seq) if seq else None, "steps": len(seq),
                 "error": (pred_seq - seq_mean) / seq_mean if pred_seq is not None and seq_mean else None})
    return {"rows": rows, "fill": lengths.get("fill"), "max_prompt_length": lengths.get("max_prompt_length"),
            "max_response_length": lengths.get("max_response_length"),
            "logged_prompt_max": max(got.get("prompt_length/max", [0]) or [0]),
            "logged_response_max": max(got.get("response_length/max", [0]) or [0])}


def _num(v) -> str:
    return "-" if v is None else f"{v:.1f}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("log", type=Path, help="the verl run's console log")
    ap.add_argument("plan_json", type=Path, help="`verl-cluster plan ... --json` output")
    ap.add_argument("--json", action="store_true", help="print the comparison as JSON")
    args = ap.parse_args(argv)
    try:
        text = args.log.read_text(errors="replace")
        plan = json.loads(args.plan_json.read_text())
    except (OSError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    doc = compare(text, plan)
    if args.json:
        print(json.dumps(doc, indent=1))
    else:
        print(f"{'quantity':<24} {'predicted':>9} {'logged':>9} {'min..max over steps':>21} {'error':>7}  steps  source")
        for r in doc["rows"]:
            err = "-" if r["error"] is None else f"{r['error']:+.1%}"
            span = f"{_num(r['logged_min'])}..{_num(r['logged_max'])}"
            print(f"{r['quantity']:<24} {_num(r['predicted']):>9} {_num(r['logged_mean']):>9} {span:>21} {err:>7}  "
                  f"{r['steps']:>5}  {r['source'] or '-'}")
        print(f"limits: max_prompt_length {doc['max_prompt_length']}, max_response_length {doc['max_response_length']}; "
              f"logged maxima: prompt {doc['logged_prompt_max']:g}, response {doc['logged_response_max']:g}")
    if not doc["rows"][0]["steps"]:
        print("error: the log has no verl step line with prompt_length/mean", file=sys.stderr)
        return 2
    if doc["rows"][0]["predicted"] is None:
        print("error: the plan has no `lengths` (made by a verl-cluster without them?)", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
