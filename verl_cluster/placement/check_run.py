"""The plan held against what verl logged: per-step metrics (launch/verl_log.py VerlProgress.steps) reduced to
what the plan predicts (seconds per phase and step, host RAM, GPU memory), and the pairs with their errors."""

from __future__ import annotations

from typing import Any, Iterable, Mapping, Optional

# verl's timing_s/* names of the phases a step is made of (save_checkpoint and testing come every few steps only)
STEP_PHASES = ("gen", "old_log_prob", "ref", "values", "adv", "update_critic", "update_actor", "update_weights")
WARN_OFF_BY = 0.25  # predicted vs measured: a pair further apart than this is worth a warning
# the fills (tokens a step holds / its worst case) the plan's phases are kept at, to be read at the run's own
BY_FILL = (0.05, 0.1, 0.2, 0.35, 0.5, 0.75, 1.0)


def measured(steps: Mapping[int, Mapping[str, float]], skip: Iterable[int] = (1,)) -> dict[str, Any]:
    """Means over the training steps not in `skip` (a step that is first after a start pays for compilation and
    warm-up): seconds per phase, the step as the sum of its phases, node RAM (the largest), tokens per step."""
    skip = set(skip)
    train = [m for s, m in sorted(steps.items()) if s not in skip and "timing_s/step" in m]
    if not train:
        return {}
    out: dict[str, Any] = {"steps": len(train)}
    phases = {}
    for name in STEP_PHASES:
        vals = [m[f"timing_s/{name}"] for m in train if f"timing_s/{name}" in m]
        if len(vals) == len(train):
            phases[name] = sum(vals) / len(vals)
    out["phases_s"] = phases
    out["step_s"] = sum(phases.values())
    saves = [m["timing_s/save_checkpoint"] for m in steps.values() if m.get("timing_s/save_checkpoint", 0) > 0.5]
    if saves:
        out["save_checkpoint_s"] = sum(saves) / len(saves)
    ram = [v for m in steps.values() for k, v in m.items() if k.endswith("perf/cpu_memory_used_gb")]
    if ram:
        out["host_gib"] = max(ram)  # verl divides psutil's bytes by 1024**3: GiB
    gpu = [v for m in steps.values() for k, v in m.items() if k.endswith("perf/max_memory_reserved_gb")]
    if gpu:
        out["gpu_reserved_gib"] = max(gpu)
    toks = [m["perf/total_num_tokens"] for m in train if "perf/total_num_tokens" in m]
    if toks:
        out["tokens_per_step"] = sum(toks) / len(toks)
    return out


def at_run_lengths(predicted: Mapping[str, Any], got: Mapping[str, Any]) -> tuple[dict[str, float], Optional[float]]:
    """The plan's seconds per phase at the fill the run really had (tokens per step / the plan's tokens at fill 1),
    read off the plan's phases by fill (linear between the two around it); the phases as planned, and None, when
    either side lacks what that needs (a plan kept by an older version, a log without perf/total_num_tokens)."""
    table, full, toks = predicted.get("by_fill"), predicted.get("tokens_full"), got.get("tokens_per_step")
    if not table or not full or not toks:
        return dict(predicted.get("phases_s") or {}), None
    fill = min(max(toks / full, table[0][0]), table[-1][0])
    hi = next(i for i, (f, _) in enumerate(table) if f >= fill)
    (f0, a), (f1, b) = table[max(hi - 1, 0)], table[hi]
    w = 0.0 if f1 == f0 else (fill - f0) / (f1 - f0)
    return {k: a[k] + w * (b.get(k, a[k]) - a[k]) for k in a}, toks / full


def pairs(predicted: Mapping[str, Any], got: Mapping[str, Any]) -> list[dict[str, Any]]:
    """[{what, predicted, measured, error}] for every figure both sides have; error = predicted / measured - 1.
    Time is predicted at the run's own lengths when the plan kept its phases by fill (at_run_lengths)."""
    rows: list[tuple[str, Optional[float], Optional[float]]] = []
    phases, fill = at_run_lengths(predicted, got)
    for name, v in phases.items():
        rows.append((f"time {name} (s)", v, (got.get("phases_s") or {}).get(name)))
    step = sum(phases.values()) if fill is not None and phases else predicted.get("step_s")
    rows.append(("time step (s)", step, got.get("step_s") if got.get("phases_s") else None))
    rows.append(("save_checkpoint (s)", predicted.get("save_checkpoint_s") or None, got.get("save_checkpoint_s")))
    rows.append(("host RAM per node (GiB)", predicted.get("host_gib"), got.get("host_gib")))
    rows.append(("GPU reserved, trainer (GiB)", predicted.get("gpu_reserved_gib"), got.get("gpu_reserved_gib")))
    out = []
    for what, p, m in rows:
        if p is None or m is None or m <= 0:
            continue
        out.append({"what": what, "predicted": round(float(p), 2), "measured": round(float(m), 2),
                    "error": round(float(p) / float(m) - 1.0, 3)})
        if fill is not None and what.startswith("time "):
            out[-1]["at_fill"] = round(fill, 3)  # predicted at the run's lengths, not the plan's
    return out


def off(rows: list[dict[str, Any]], bound: float = WARN_OFF_BY) -> list[dict[str, Any]]:
    return [r for r in rows if abs(r["error"]) > bound]
