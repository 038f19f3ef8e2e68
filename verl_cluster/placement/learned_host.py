"""The host factor a plan starts from (placement.host_factor): the speed earlier runs showed on the same machines
(records/host_speed.py), a number the job states, or none.

The plan's step time is fitted on a mix of hosts; machines of one GPU kind ran verl's host side up to 1.75x apart
and no probe before a run told them apart (docs/placement.md, "Batch V" to "Batch Y"), while a run planned from its
machine's other runs came within 13% on four of five held-out runs. So the factor is learned from the machine's
runs, never guessed from a probe.
"""

from __future__ import annotations

import hashlib
import math
from typing import Any, Callable, Optional, Sequence

from verl_cluster.errors import ConfigError

RUNS = 3  # the newest runs on the machines a learned factor is the geometric mean of
AUTO, OFF = "auto", "off"
HINT = ("auto (the speed earlier runs showed on these machines), off (the calibrated hosts' speed), or a number "
        "from 0.5 to 2 (the host's time against the calibrated hosts', as `vs_plan_host` reports it)")


def machines_key(facts: Sequence[Any]) -> Optional[str]:
    """A name for the machines a plan is for: each node's hostname and its GPUs' UUIDs (NVML's), hashed. None for
    hardware no run can have shown a speed on: hypothetical (`--gpus`: cards without a UUID), no GPU, a node
    without a hostname."""
    nodes = []
    for f in facts or ():
        name, gpus = getattr(f, "hostname", "") or "", list(getattr(f, "gpus", ()) or ())
        if not name or not all(g.uuid for g in gpus):
            return None
        nodes.append(name + "|" + ",".join(sorted(g.uuid for g in gpus)))
    if not any(getattr(f, "gpus", None) for f in facts or ()):
        return None
    return hashlib.sha256("\n".join(sorted(nodes)).encode()).hexdigest()[:16]


def stated(job: Any) -> str | float:
    """placement.host_factor as auto, off or a number; ConfigError naming the field for anything else."""
    from verl_cluster.config.loader import short
    from verl_cluster.placement.factors import HOST_FACTOR_RANGE
    from verl_cluster.placement.lengths import field_origin

    value = job.placement.host_factor
    if value is False:  # YAML reads a bare `off` as false
        return OFF
    raw = str(value).strip().lower()
    if raw in (AUTO, OFF):
        return raw
    try:
        x = math.nan if isinstance(value, (bool, list, dict)) else float(raw)
    except ValueError:
        x = math.nan
    lo, hi = HOST_FACTOR_RANGE
    if not lo <= x <= hi:  # NaN fails too
        raise ConfigError(f"{field_origin(job, 'host_factor')}: placement.host_factor must be auto, off or a number "
                          f"from {lo:g} to {hi:g}, got {short(repr(value), 80)}", HINT)
    return x


def host_factors(job: Any, facts: Sequence[Any], runs_on: Callable[[str], list[dict[str, Any]]]
                 ) -> Optional[tuple[dict[str, tuple[float, Optional[int], bool]], str]]:
    """(factors for factors.apply_factors, where they come from) for the job on these machines; None: plan for the
    calibrated hosts (off, no runs kept for these machines, or hypothetical hardware). RUNS_ON(machines_key): the
    newest runs kept for those machines (records/host_speed.for_machines), newest first."""
    from verl_cluster.placement.factors import HOST_FACTOR
    from verl_cluster.placement.lengths import field_origin

    how = stated(job)
    if how == OFF:
        return None
    if isinstance(how, float):
        return {HOST_FACTOR: (how, None, True)}, f"placement.host_factor ({field_origin(job, 'host_factor')})"
    key = machines_key(facts)
    if key is None:
        return None
    runs = runs_on(key)[:RUNS]
    if not runs:
        return None
    xs = [float(e["factor"]) for e in runs]
    f = round(math.exp(sum(map(math.log, xs)) / len(xs)), 2)
    ids = ", ".join(f"{e['submission_id']} at {e['factor']:g}" for e in runs)
    return {HOST_FACTOR: (f, len(runs), True)}, f"the last {_runs(len(runs))} on these machines ({ids})"


def _runs(n: int) -> str:
    return "run" if n == 1 else f"{n} runs"


def host_note(factors: dict[str, tuple[float, Optional[int], bool]], source: str, short: bool = False) -> str:
    """What a plan says of the host factor host_factors gave: in full under its step time, SHORT in submit's
    one-line plan note."""
    from verl_cluster.placement.factors import HOST_FACTOR

    f, runs, _ = factors[HOST_FACTOR]
    where = f"from {_runs(runs)} on these machines" if runs else "from placement.host_factor"
    if short:
        return f"host factor {f:g} {where}"
    return (f"host factor {f:g} from {source}: the phases as on a host whose CPU-side work (launches, Python between "
            f"kernels, the rollout's scheduling) takes {f:g}x the calibrated hosts' time"
            + ("; placement.host_factor=off plans for the calibrated hosts" if runs else ""))
