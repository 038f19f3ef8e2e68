"""Verdicts from facts: what is wrong on a node or between nodes, each with a fix hint. Pure."""

from __future__ import annotations

from typing import Mapping, Optional

from verl_cluster.diagnostics.problem import ERROR, WARNING, Problem
from verl_cluster.diagnostics.ray_versions import drift
from verl_cluster.facts.model import NodeFacts

MIN_NOFILE = 65536  # Ray opens a socket per worker and object transfer; it warns below this too
MAX_CLOCK_OFFSET_S = 1.0
MAX_STEAL_PCT = 10.0  # a tenth of the CPUs' time taken by a VM's neighbours slows verl's host-bound phases


def _minor(version: str) -> str:
    return ".".join(version.split("+")[0].split(".")[:2])


def flash_attn_fix(f: NodeFacts) -> str:
    torch = f.versions.get("torch")
    if not torch:
        return "install torch first, then the flash-attn wheel built for it"
    abi = f.versions.get("torch_cxx11_abi", "TRUE")
    cu = f.versions.get("torch_cuda", "").replace(".", "")[:2] or "12"
    py = "".join((f.python_version or "3.x").split(".")[:2])
    return (f"pip install the flash-attn wheel built for torch {_minor(torch)} with cxx11abi{abi} "
            f"(flash_attn-*+cu{cu}torch{_minor(torch)}cxx11abi{abi}-cp{py}-*.whl), or rebuild it against this torch: "
            "pip install --no-build-isolation --force-reinstall flash-attn")


def node_verdicts(f: NodeFacts, expect_gpus: Optional[int] = None) -> list[Problem]:
    """Problems visible on one machine (what `doctor` reports)."""
    out: list[Problem] = []
    h = f.host
    # ---- Python packages ----
    fa_err = f.import_errors.get("flash_attn")
    if fa_err and "undefined symbol" in fa_err:
        out.append(Problem(h, f"flash-attn does not match this torch ABI: {fa_err[:160]}", flash_attn_fix(f)))
    elif fa_err:
        out.append(Problem(h, f"flash-attn fails to import: {fa_err[:160]}", flash_attn_fix(f)))
    for pkg in ("torch", "verl", "ray"):
        if pkg in f.import_errors:
            out.append(Problem(h, f"{pkg} fails to import: {f.import_errors[pkg][:160]}",
                               f"reinstall {pkg} in {f.python_executable or 'the node environment'}"))
    if "import" in f.import_errors:
        out.append(Problem(h, f.import_errors["import"], "check the node's Python environment", WARNING))
    if "torch" not in f.versions and "torch" not in f.import_errors:
        out.append(Problem(h, "torch is not installed: verl's workers and the collective test need it",
                           "pip install torch (the CUDA build matching the driver)", WARNING))
    # ---- GPUs ----
    if not f.gpus:
        why = f.nvml_error or "NVML reports no GPUs"
        sev = ERROR if expect_gpus else WARNING
        out.append(Problem(h, f"no GPUs: {why}" + (f" (config says gpus: {expect_gpus})" if expect_gpus else ""),
                           "install the NVIDIA driver (libnvidia-ml.so.1) or fix the node's gpus in the config"
                           if expect_gpus else "fine for a CPU-only node; verl rollout and training need GPUs",
                           sev))
    elif expect_gpus is not None and expect_gpus > len(f.gpus):
        out.append(Problem(h, f"config says gpus: {expect_gpus} but NVML sees {len(f.gpus)}",
                           f"set gpus: {len(f.gpus)} for {h}, or check nvidia-smi there"))
    if f.gpus and f.versions.get("torch") and not f.versions.get("torch_cuda"):
        out.append(Problem(h, f"torch {f.versions['torch']} is a CPU build on a node with GPUs",
                           "pip install the CUDA build of torch (e.g. --index-url https://download.pytorch.org/whl/cu128)"))
    low = sorted({g.compute_capability for g in f.gpus if g.sm < (8, 0)})
    if low:
        names = sorted({g.name for g in f.gpus if g.sm < (8, 0)})
        # same rule as the planner: below SM 7.0 torch's fused SDPA kernels are not built, so eager
        attn = "eager" if min(g.sm for g in f.gpus) < (7, 0) else "sdpa"
        out.append(Problem(h, f"{', '.join(names)} is SM {', '.join(low)}: no bf16 and no flash-attn 2 (need SM 8.0)",
                           f"use fp32/{attn}: GPU is SM {low[0]} (+actor_rollout_ref.model.override_config"
                           f".attn_implementation={attn}, fp32 or fp16 weights); `verl-cluster plan` emits these",
                           WARNING))
    for g in f.gpus:
        if g.ecc_errors_uncorrected:
            out.append(Problem(h, f"GPU {g.index} has {g.ecc_errors_uncorrected} uncorrected ECC errors",
                               "drain the node and reset the GPU (nvidia-smi -r) or replace it"))
        if g.processes:
            out.append(Problem(h, f"GPU {g.index} is in use by {g.processes} process(es) "
                                  f"({g.memory_free_mib} of {g.memory_total_mib} MiB free)",
                               "stop them (nvidia-smi shows which) before a run", WARNING))
    islands = f.p2p_islands() if len(f.gpus) > 1 else []
    if len(islands) > 1:
        out.append(Problem(h, f"GPUs cannot all peer (P2P groups {islands}): NCCL's P2P path would fail",
                           "`up` and `submit` set NCCL_P2P_DISABLE=1 for this node (slower all-reduce, but it "
                           "works); on consumer GPUs that is the only way", WARNING))
    # ---- system ----
    if f.ulimit_nofile is not None and f.ulimit_nofile < MIN_NOFILE:
        out.append(Problem(h, f"open-file limit is {f.ulimit_nofile} (Ray wants >= {MIN_NOFILE})",
                           f"ulimit -n {MIN_NOFILE} in the shell that starts Ray, or nofile in "
                           "/etc/security/limits.conf", WARNING))
    if f.host_steal_pct is not None and f.host_steal_pct >= MAX_STEAL_PCT:
        took = "" if f.host_python_ms is None else f" ({f.host_python_ms:g} ms for the Python work)"
        out.append(Problem(h, f"the hypervisor took {f.host_steal_pct:g}% of the CPU time this node wanted while it was "
                              f"probed{took}: verl's host-bound phases (launching "
                              "kernels, the rollout's scheduling, each micro batch's set-up) run slower and vary",
                           "a dedicated instance (no CPU overcommit), or read the plan's step time at the slow end of "
                           "its error bar; `doctor` again shows whether it lasts", WARNING))
    if f.clock_offset_s is not None and abs(f.clock_offset_s) > MAX_CLOCK_OFFSET_S:
        out.append(Problem(h, f"clock is {f.clock_offset_s:+.2f}s off the head",
                           "enable NTP (chronyd/systemd-timesyncd): logs and timeouts compare clocks", WARNING))
    return out


def consistency_verdicts(facts: Mapping[str, NodeFacts]) -> list[Problem]:
    """Problems between nodes: versions and GPU counts must agree."""
    out: list[Problem] = []
    if len(facts) < 2:
        return out

    def differ(label: str, values: dict[str, Optional[str]], fix: str, severity: str = ERROR) -> None:
        seen = {v for v in values.values() if v}
        if len(seen) > 1:
            detail = ", ".join(f"{h}={v or 'missing'}" for h, v in values.items())
            out.append(Problem("cluster", f"{label} differs between nodes: {detail}", fix, severity))

    py = {h: f.python_version for h, f in facts.items()}
    if len({_minor(v) for v in py.values() if v}) > 1:
        differ("Python", py, "use the same Python minor version everywhere (Ray refuses to mix them)")
    else:
        differ("Python", py, "use the same Python patch version everywhere", WARNING)
    def version(f: NodeFacts, pkg: str) -> Optional[str]:
        v = f.versions.get(pkg)
        # Ray and verl must be on every node: absent (not merely failing to import, which node_verdicts
        # reports, nor unknown after an interrupted probe) is drift too
        if not v and pkg in ("ray", "verl") and pkg not in f.import_errors and "import" not in f.import_errors:
            return "missing"
        return v

    out += drift({h: version(f, "ray") for h, f in facts.items()})
    for pkg, sev in (("torch", ERROR), ("verl", ERROR), ("flash_attn", WARNING), ("nccl", ERROR)):
        differ(pkg, {h: version(f, pkg) for h, f in facts.items()},
               f"install the same {pkg} version on every node (one image or one lock file)", sev)
    counts = {h: len(f.gpus) for h, f in facts.items()}
    if len(set(counts.values())) > 1:
        detail = ", ".join(f"{h}={n}" for h, n in counts.items())
        out.append(Problem("cluster", f"GPU count differs between nodes ({detail}): verl puts n_gpus_per_node on "
                           "every node and waits forever for a short one",
                           "use nodes with equal GPU counts, or leave the odd node out of the cluster"))
    models = {h: f.gpus[0].name for h, f in facts.items() if f.gpus}
    if len(set(models.values())) > 1:
        differ("GPU model", models, "mixed GPU models run at the pace of the slowest", WARNING)
    return out


def mtu_verdicts(facts: Mapping[str, NodeFacts], interfaces: Mapping[str, str]) -> list[Problem]:
    mtus = {}
    for h, name in interfaces.items():
        f = facts.get(h)
        i = next((i for i in f.interfaces if i.name == name), None) if isinstance(f, NodeFacts) else None
        if i and i.mtu:
            mtus[h] = i.mtu
    if len(set(mtus.values())) > 1:
        detail = ", ".join(f"{h}={m}" for h, m in mtus.items())
        return [Problem("cluster", f"MTU differs on the chosen interfaces ({detail}): large packets may be dropped",
                        "set the same MTU on every node's interface", WARNING)]
    return []
