"""The plan held against what verl logged: per-step metrics (verl_logs/verl_log.py VerlProgress.steps) reduced to
what the plan predicts (seconds per phase and step, host RAM, GPU memory), and the pairs with their errors."""

from __future__ import annotations

from typing import Any, Iterable, Mapping, Optional

# verl's timing_s/* names of the phases a step is made of (save_checkpoint and testing come every few steps only)
STEP_PHASES = ("gen", "old_log_prob", "ref", "values", "adv", "update_critic", "update_actor", "update_weights")
WARN_OFF_BY = 0.25  # predicted vs measured: a pair further apart than this is worth a warning
# the fills (tokens a step holds / its worst case) the plan's phases are kept at, to be read at the run's own
BY_FILL = (0.05, 0.1, 0.2, 0.35, 0.5, 0.75, 1.0)
# the steps after a start that pay for warm-up, left out of the means: the first compiles and fills the caches, the
# second recompiles what the first step's shapes specialised (torch.compile's entropy kernel in old_log_prob); the
# step-time model predicts the steps after them (docs/placement.md, "The second refit")
WARMUP_STEPS = 2


def warmup(first: int, steps: Iterable[int] = ()) -> tuple[int, ...]:
    """The steps to leave out of a run's means when its log starts at FIRST: the WARMUP_STEPS from FIRST on, or only
    FIRST while no step after the warm-up is in (STEPS: those logged), so a two-step run is still held to the plan."""
    late = any(s >= first + WARMUP_STEPS for s in steps)
    return tuple(range(first, first + WARMUP_STEPS)) if late else (first,)


class StepMeans:
    """measured()'s sums, folded one step at a time (steps in order), so that a reader of a long run's log can drop
    the steps it has counted: the same sums in the same order as over the whole mapping. JSON-able (to_json)."""

    def __init__(self, doc: Optional[Mapping[str, Any]] = None):
        d = doc or {}
        self.train = int(d.get("train", 0))  # training steps counted (not skipped, with timing_s/step)
        self.phases = {k: list(v) for k, v in (d.get("phases") or {}).items()}  # name -> [sum, count]
        self.saves, self.tokens = list(d.get("saves") or [0.0, 0]), list(d.get("tokens") or [0.0, 0])
        self.ram, self.gpu = d.get("ram"), d.get("gpu")

    def to_json(self) -> dict[str, Any]:
        return {"train": self.train, "phases": self.phases, "saves": self.saves, "tokens": self.tokens,
                "ram": self.ram, "gpu": self.gpu}

    def add(self, m: Mapping[str, float], counted: bool = True) -> None:
        if counted and "timing_s/step" in m:
            self.train += 1
            for name in STEP_PHASES:
                if f"timing_s/{name}" in m:
                    got = self.phases.setdefault(name, [0.0, 0])
                    got[0] += m[f"timing_s/{name}"]
                    got[1] += 1
            if "perf/total_num_tokens" in m:
                self.tokens[0] += m["perf/total_num_tokens"]
                self.tokens[1] += 1
        if m.get("timing_s/save_checkpoint", 0) > 0.5:
            self.saves[0] += m["timing_s/save_checkpoint"]
            self.saves[1] += 1
        for k, v in m.items():
            if k.endswith("perf/cpu_memory_used_gb"):
                self.ram = v if self.ram is None else max(self.ram, v)
            elif k.endswith("perf/max_memory_reserved_gb"):
                self.gpu = v if self.gpu is None else max(self.gpu, v)

    def result(self) -> dict[str, Any]:
        if not self.train:
            return {}
        out: dict[str, Any] = {"steps": self.train}
        phases = {}
        for name in STEP_PHASES:
            got = self.phases.get(name)
            if got and got[1] == self.train:
                phases[name] = got[0] / got[1]
        out["phases_s"] = phases
        out["step_s"] = sum(phases.values())
        if self.saves[1]:
            out["save_checkpoint_s"] = self.saves[0] / self.saves[1]
        if self.ram is not None:
            out["host_gib"] = self.ram  # verl divides psutil's bytes by 1024**3: GiB
        if self.gpu is not None:
            out["gpu_reserved_gib"] = self.gpu
        if self.tokens[1]:
            out["tokens_per_step"] = self.tokens[0] / self.tokens[1]
        return out


def measured(steps: Mapping[int, Mapping[str, float]], skip: Iterable[int] = (1,),
             before: Optional[StepMeans] = None) -> dict[str, Any]:
    """Means over the training steps not in `skip` (a step that is first after a start pays for compilation and
    warm-up): seconds per phase, the step as the sum of its phases, node RAM (the largest), tokens per step.
    `before`: the steps already folded (older than every one in `steps`)."""
    skip = set(skip)
    acc = StepMeans(before.to_json() if before is not None else None)
    for s, m in sorted(steps.items()):
        acc.add(m, s not in skip)
    return acc.result()


def at_run_lengths(predicted: Mapping[str, Any], got: Mapping[str, Any]) -> tuple[dict[str, float], Optional[float]]:
    """The plan's seconds per phase at the fill the run really had (tokens per step / the plan's tokens at fill 1),
    read off the plan's phases by fill (linear between the two around it); the phases as planned, and None, when
    either side lacks what that needs (a plan kept by an older version, a log without perf/total_num_tokens)."""
    table, full, toks = predicted.get("by_fill"), predicted.get("tokens_full"), got.get("tokens_per_step")
    if not table or not full or not toks:
        return dict(predicted.get("phases_s") or {}), None
    return between(table, toks / full), toks / full


def between(table: list, x: float) -> dict[str, float]:
    """TABLE's phases ([[x, {phase: seconds}], ...], x ascending) at X: linear between the two rows around it, the
    first or last row outside them."""
    x = min(max(x, table[0][0]), table[-1][0])
    hi = next(i for i, (f, _) in enumerate(table) if f >= x)
    (f0, a), (f1, b) = table[max(hi - 1, 0)], table[hi]
    w = 0.0 if f1 == f0 else (x - f0) / (f1 - f0)
    return {k: a[k] + w * (b.get(k, a[k]) - a[k]) for k in a}


def planned_step_s(predicted: Mapping[str, Any], tokens_per_step: Optional[float]) -> tuple[Optional[float],
                                                                                         Optional[float]]:
    """(the plan's seconds per step, the fill it is read at): at the run's own lengths when the plan kept its
    phases by fill and the run logged its tokens per step (at_run_lengths), else the step as planned."""
    phases, fill = at_run_lengths(predicted, {"tokens_per_step": tokens_per_step})
    return _step_of(predicted, phases, fill), fill


def _step_of(predicted: Mapping[str, Any], phases: Mapping[str, float], fill: Optional[float]) -> Optional[float]:
    return sum(phases.values()) if fill is not None and phases else predicted.get("step_s")


def pairs(predicted: Mapping[str, Any], got: Mapping[str, Any]) -> list[dict[str, Any]]:
    """[{what, predicted, measured, error}] for every figure both sides have; error = predicted / measured - 1.
    Time is predicted at the run's own lengths when the plan kept its phases by fill (at_run_lengths)."""
    rows: list[tuple[str, Optional[float], Optional[float]]] = []
    phases, fill = at_run_lengths(predicted, got)
    for name, v in phases.items():
        rows.append((f"time {name} (s)", v, (got.get("phases_s") or {}).get(name)))
    step = _step_of(predicted, phases, fill)
    rows.append(("time step (s)", step, got.get("step_s") if got.get("phases_s") else None))
    rows.append(("save_checkpoint (s)", predicted.get("save_checkpoint_s") or None, got.get("save_checkpoint_s")))
    if predicted.get("shared_machine") and predicted.get("host_gib_all_nodes"):  # one machine's RAM for every node
        rows.append(("host RAM, all nodes on one machine (GiB)", predicted["host_gib_all_nodes"], got.get("host_gib")))
    else:
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


HOST_FIT = tuple(round(0.5 + 0.01 * i, 2) for i in range(151))  # the host factors tried: 0.50 ... 2.00
HOST_STEP_WITHIN = 0.10  # at its host factor, the step this close ...
HOST_PHASE_WITHIN = 0.25  # ... and every phase of PHASE_MIN_S or more this close: the host explains the miss
PHASE_MIN_S = 0.5  # a timing under half a second is judged by nothing: its percent is jitter (as the calibration target)


def host_table(predicted: Mapping[str, Any]) -> Optional[list[list]]:
    """The plan's phases at host factors ([[factor, {phase: seconds}], ...], ascending, the row at 1 among them), or
    None when it kept no such table."""
    table = [[float(h), ph] for h, ph in predicted.get("by_host_factor") or []]
    return table if len(table) >= 2 and any(h == 1.0 and ph for h, ph in table) else None


def host_ratios(predicted: Mapping[str, Any], h: float) -> Optional[dict[str, float]]:
    """Each phase's seconds on a host H times the fit's over its seconds on the fit's hosts, from the plan's phases
    at host factors (linear between them); None for a plan that kept none."""
    table = host_table(predicted)
    return None if table is None else _ratios(table, h)


def _ratios(table: list[list], h: float) -> dict[str, float]:
    """host_ratios on a table host_table has read."""
    base, row = next(ph for x, ph in table if x == 1.0), between(table, h)
    return {k: row[k] / v for k, v in base.items() if v > 0 and k in row}


def host_fit(predicted: Mapping[str, Any], got: Mapping[str, Any]) -> Optional[dict[str, Any]]:
    """The factor on the plan's host terms (the CPU's part of each phase: launches, Python between kernels, verl's
    scheduling; step_time.HOST_TERMS) that brings the plan's phases closest to the run's, and whether it explains
    the run's miss: the step within HOST_STEP_WITHIN and every phase of PHASE_MIN_S or more within
    HOST_PHASE_WITHIN at it. Machines of one GPU kind ran verl's host side up to ~1.4x apart, one machine 1.2x apart
    within 20 minutes (docs/placement.md, "Batch R"). Each phase at the run's lengths times its ratio at the plan's
    (the plan's by_host_factor, linear between its factors; tried only within them). None when the plan kept no
    such table, the run no phases, or no factor moves the phases (none of them the host's). A plan made at a host
    factor (its `host_factor`: placement.host_factor, `plan --factors`) has its phases at that factor and its table
    at the calibrated hosts': the factor is taken back out first, so the one found is the host's against theirs."""
    table, meas = host_table(predicted), got.get("phases_s") or {}
    if table is None or not meas:
        return None
    phases, _ = at_run_lengths(predicted, got)
    one = _ratios(table, 1.0)
    as_made, applied = phases, predicted.get("host_factor")
    planned_at = None
    if isinstance(applied, (int, float)) and not isinstance(applied, bool) and applied != 1.0 \
            and table[0][0] <= applied <= table[-1][0]:
        back, planned_at = _ratios(table, float(applied)), float(applied)
        phases = {k: v / back[k] if back.get(k) else v for k, v in phases.items()}
    names = [k for k in phases if meas.get(k) and k in one]
    big = [k for k in names if meas[k] >= PHASE_MIN_S] or names
    tried = [h for h in HOST_FIT if table[0][0] <= h <= table[-1][0]]
    if not names or len(tried) < 2:
        return None

    def at(h: float) -> dict[str, float]:
        ratios = _ratios(table, h)  # the table read once, not at each factor tried
        return {k: phases[k] * ratios.get(k, 1.0) for k in names}

    cost = {h: sum((v / meas[k] - 1) ** 2 for k, v in at(h).items() if k in big) for h in tried}
    best = min(tried, key=cost.get)
    if max(cost.values()) - cost[best] < 1e-9:
        return None
    there, total = at(best), sum(meas[k] for k in names)
    errors = {k: round(there[k] / meas[k] - 1, 3) for k in big}
    step = sum(there.values()) / total - 1
    return {"factor": best, "step_error": round(sum(as_made[k] for k in names) / total - 1, 3),
            "step_error_at_factor": round(step, 3), "phases_at_factor": errors,
            "explains": tried[0] < best < tried[-1] and abs(step) <= HOST_STEP_WITHIN
            and all(abs(e) <= HOST_PHASE_WITHIN for e in errors.values()),
            **({"planned_at": planned_at} if planned_at is not None else {})}


def off(rows: list[dict[str, Any]], bound: float = WARN_OFF_BY) -> list[dict[str, Any]]:
    return [r for r in rows if abs(r["error"]) > bound]


def worth_warning(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The pairs off by more than WARN_OFF_BY, less the timings under PHASE_MIN_S both predicted and measured (batch
    Y's update_weights: 0.30 s planned, 0.21 s measured, +44%)."""
    return [r for r in off(rows) if not (r["what"].startswith("time ") and
                                         max(r["predicted"], r["measured"]) < PHASE_MIN_S)]
