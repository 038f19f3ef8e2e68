"""GPU smoke job: the placement plan, followed on real GPUs (launch/gpu_smoke.yaml).

1. Facts: one zero-resource task per alive Ray node reads its GPUs through NVML (NodeFacts).
2. Plan: verl_cluster.placement.plan_job(job spec, facts) - the same plan `verl-cluster plan` prints.
3. Placement: one STRICT_PACK placement group per (pool, node) with one {"GPU": 1, "CPU": 1} bundle per planned
   GPU; one Ray actor per role and planned GPU, in the bundle of that GPU (roles that share a pool share the
   bundle's GPU as fractions, the way verl colocates them).
4. Work: a randomly initialised model of the job's catalog shape (transformers `from_config`, nothing
   downloaded) under FSDP (full shard across the role's GPUs, fp32 master weights, bf16 mixed precision, one FSDP
   unit per decoder layer, gradient checkpointing): actor and critic run AdamW update steps at the planned micro
   batch x sequence length; ref and reward run forward passes (parameters offloaded to host, as planned).
   Rollout is planned but not run (no inference engine here).
5. Report: measured torch.cuda.max_memory_reserved / max_memory_allocated per role and GPU beside the plan's
   working set for that phase, and per physical GPU the NVML memory in use beside the plan's peak. One line
   `GPU_SMOKE-REPORT {json}`; exit 1 on any failure.

The pure parts (layout, compare) need neither Ray nor torch and are unit tested (tests/unit/test_gpu_smoke.py).
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from typing import Any

RUN_ROLES = ("actor", "critic", "ref", "reward")  # rollout needs an inference engine: planned, not run
TRAIN_ROLES = ("actor", "critic")
STEPS = 2  # Adam states appear at the first step; the second is the steady peak
GIB = 1024 ** 3


# ----------------------------------------------------------------------------------------- pure (unit tested)

def layout(plan: dict[str, Any]) -> dict[str, Any]:
    """Plan document (Plan.to_dict()) -> placement groups and actor slots.

    Returns {"groups": [{"pool", "node", "gpus": [gpu, ...], "bundles": [{"GPU": 1, "CPU": 1}, ...]}],
             "actors": [{"role", "rank", "world", "node", "gpu", "group", "bundle", "num_gpus"}]}.
    Roles of one pool share its bundles; each runnable role on a GPU gets 1/k of it (k = runnable roles there).
    """
    groups: list[dict[str, Any]] = []
    index: dict[tuple[str, int], int] = {}
    roles = plan["roles"]
    for name in sorted(roles, key=lambda r: (roles[r]["pool"], r)):
        r = roles[name]
        for node, gpu in r["gpus"]:
            key = (r["pool"], node)
            if key not in index:
                index[key] = len(groups)
                groups.append({"pool": r["pool"], "node": node, "gpus": []})
            g = groups[index[key]]
            if gpu not in g["gpus"]:
                g["gpus"].append(gpu)
    for g in groups:
        g["gpus"].sort()
        g["bundles"] = [{"GPU": 1, "CPU": 1} for _ in g["gpus"]]
    sharing: dict[tuple[int, int], list[str]] = {}
    for name in RUN_ROLES:
        if name in roles:
            for node, gpu in roles[name]["gpus"]:
                sharing.setdefault((node, gpu), []).append(name)
    actors = []
    for name in RUN_ROLES:
        if name not in roles:
            continue
        r = roles[name]
        gpus = sorted((node, gpu) for node, gpu in r["gpus"])
        for rank, (node, gpu) in enumerate(gpus):
            gi = index[(r["pool"], node)]
            actors.append({"role": name, "rank": rank, "world": len(gpus), "node": node, "gpu": gpu, "group": gi,
                           "bundle": groups[gi]["gpus"].index(gpu),
                           "num_gpus": round(1.0 / len(sharing[(node, gpu)]), 4)})
    return {"groups": groups, "actors": actors}


def role_phase(plan: dict[str, Any], role: str) -> dict[str, Any]:
    """The phase the smoke job runs for a role: the update for trainers, the forward for the others."""
    phases = plan["roles"][role]["phases"]
    if role in TRAIN_ROLES:
        return next((p for p in phases if "update" in p["phase"]), phases[0])
    return phases[0]


def work_shape(plan: dict[str, Any], role: str) -> tuple[int, int]:
    """(micro batch, sequence length) of the role's planned phase."""
    p = role_phase(plan, role)
    micro = int(p["micro_batch"] or 1)
    return micro, max(1, int(p["tokens"]) // micro)


def compare(plan: dict[str, Any], measured: list[dict[str, Any]], nvml_used: dict[tuple[int, int], float]
            ) -> dict[str, Any]:
    """Measured memory beside the plan.

    measured: [{"role", "node", "gpu" (planned), "physical_gpu", "max_reserved_gib", "max_allocated_gib"}].
    Per role and GPU: the phase's working set, which the memory model states as what the caching allocator
    reserves (its fragmentation included), vs the process's measured peaks. Per GPU: the plan's peak over the phases that ran vs NVML memory in use (every
    process on it, CUDA contexts included) and the sum of the processes' reserved peaks.
    """
    rows = []
    for m in measured:
        p = role_phase(plan, m["role"])
        pred_resv = float(p["working_gib"])
        meas = m.get("max_reserved_gib")
        err = None if not meas else round(100.0 * (pred_resv - meas) / meas, 1)
        rows.append({"role": m["role"], "phase": p["phase"], "node": m["node"], "gpu": m["gpu"],
                     "physical_gpu": m.get("physical_gpu"),
                     "predicted_reserved_gib": round(pred_resv, 2),
                     "measured_allocated_gib": m.get("max_allocated_gib"), "measured_reserved_gib": meas,
                     "error_pct": err})
    gpus = []
    for slot in plan["gpus"]:
        key = (slot["node"], slot["gpu"])
        ran = [r for r in slot["roles"] if r in RUN_ROLES]
        planned = max((ph["peak_gib"] for r in ran for ph in plan["roles"][r]["phases"]
                       if r not in TRAIN_ROLES or "update" in ph["phase"]), default=0.0)
        procs = [m for m in measured if (m["node"], m["gpu"]) == key]
        summed = round(sum(m.get("max_reserved_gib") or 0.0 for m in procs), 2)
        used = nvml_used.get(key)
        gpus.append({"node": slot["node"], "gpu": slot["gpu"], "roles": slot["roles"], "roles_run": ran,
                     "planned_peak_gib_all_roles": slot["peak_gib"], "planned_peak_phase": slot["peak_phase"],
                     "planned_peak_gib_roles_run": round(planned, 2), "measured_sum_reserved_gib": summed,
                     "nvml_used_gib": None if used is None else round(used, 2)})
    return {"roles": rows, "gpus": gpus}


def check_placement(lay: dict[str, Any], actual: list[dict[str, Any]]) -> list[str]:
    """Problems when the actors did not land as planned: roles of one planned GPU must share one physical GPU,
    different planned GPUs of a node must be different physical GPUs, every actor on its planned node."""
    problems = []
    phys: dict[tuple[int, int], set] = {}
    for a in actual:
        if a.get("node_ok") is False:
            problems.append(f"{a['role']} rank {a['rank']} is not on node {a['node']}")
        phys.setdefault((a["node"], a["gpu"]), set()).add(a.get("physical_gpu"))
    for key, seen in phys.items():
        if len(seen) != 1:
            problems.append(f"planned GPU {key} maps to physical GPUs {sorted(map(str, seen))}")
    by_node: dict[int, dict] = {}
    for (node, gpu), seen in phys.items():
        by_node.setdefault(node, {})[gpu] = next(iter(seen))
    for node, m in by_node.items():
        if len(set(m.values())) != len(m):
            problems.append(f"node {node}: planned GPUs {sorted(m)} share physical GPUs {sorted(map(str, m.values()))}")
    return problems


# ----------------------------------------------------------------------------------------- Ray + GPU side

def _role_actor_class(ray):
    @ray.remote
    class RoleWorker:
        def __init__(self, role: str, env: dict):
            os.environ.update(env)
            self.role = role

        def where(self) -> dict:
            import socket
            return {"ip": ray.util.get_node_ip_address(), "node_id": ray.get_runtime_context().get_node_id(),
                    "gpu_ids": [str(g) for g in ray.get_gpu_ids()],
                    "cuda_visible": os.environ.get("CUDA_VISIBLE_DEVICES"), "port": _free_port(socket)}

        def run(self, rank: int, world: int, master: str, port: int, model_kw: dict, model_type: str,
                micro: int, seq: int, attn: str) -> dict:
            return _run_role(self.role, rank, world, master, port, model_kw, model_type, micro, seq, attn)

    return RoleWorker


def _free_port(socket) -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def _run_role(role, rank, world, master, port, model_kw, model_type, micro, seq, attn) -> dict:
    import datetime
    import functools

    import torch
    import torch.distributed as dist
    from torch.distributed.fsdp import CPUOffload, MixedPrecision, ShardingStrategy
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForTokenClassification

    t0 = time.time()
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", init_method=f"tcp://{master}:{port}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=300))
    try:
        torch.manual_seed(1234 + rank)
        value_head = role in ("critic", "reward")
        kw = dict(model_kw, **({"num_labels": 1} if value_head else {}))
        cfg = AutoConfig.for_model(model_type, **kw)
        cls = AutoModelForTokenClassification if value_head else AutoModelForCausalLM
        model = cls.from_config(cfg, dtype=torch.float32, attn_implementation=attn)
        train = role in TRAIN_ROLES
        if train:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        base = getattr(model, "model", None)
        layer_cls = type(base.layers[0])
        model = FSDP(model,
                     auto_wrap_policy=functools.partial(transformer_auto_wrap_policy, transformer_layer_cls={layer_cls}),
                     mixed_precision=MixedPrecision(param_dtype=torch.bfloat16, reduce_dtype=torch.float32,
                                                    buffer_dtype=torch.float32),
                     sharding_strategy=ShardingStrategy.FULL_SHARD,
                     cpu_offload=None if train else CPUOffload(offload_params=True),
                     device_id=None if not train else torch.cuda.current_device(), use_orig_params=False)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-6, weight_decay=0.01) if train else None
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        vocab = model_kw["vocab_size"]
        losses = []
        step_s = []
        for _ in range(STEPS if train else 1):
            ts = time.time()
            ids = torch.randint(0, vocab, (micro, seq), device="cuda")
            if train:
                out = model(input_ids=ids, use_cache=False).logits
                if role == "actor":
                    logp = torch.log_softmax(out.float(), dim=-1)  # verl: fp32 log-probs of the logits
                    loss = -logp[:, :-1].gather(-1, ids[:, 1:].unsqueeze(-1)).mean()
                else:
                    loss = ((out.float().squeeze(-1) - 1.0) ** 2).mean()
                loss.backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
            else:
                with torch.no_grad():
                    out = model(input_ids=ids, use_cache=False).logits
                    if role == "ref":
                        logp = torch.log_softmax(out.float(), dim=-1)
                        loss = -logp[:, :-1].gather(-1, ids[:, 1:].unsqueeze(-1)).mean()
                    else:
                        loss = out.float().mean()
            torch.cuda.synchronize()
            losses.append(float(loss.item()))
            step_s.append(round(time.time() - ts, 3))
            del out, loss
        ok = all(l == l and abs(l) != float("inf") for l in losses)  # finite
        return {"role": role, "rank": rank, "ok": ok, "losses": losses, "step_s": step_s,
                "max_reserved_gib": round(torch.cuda.max_memory_reserved() / GIB, 3),
                "max_allocated_gib": round(torch.cuda.max_memory_allocated() / GIB, 3),
                "device": torch.cuda.get_device_name(0), "seconds": round(time.time() - t0, 2)}
    finally:
        dist.destroy_process_group()


def _nvml_used() -> dict[str, float]:
    """Memory in use per physical GPU of this node (GiB), by NVML index."""
    import pynvml as nv
    nv.nvmlInit()
    try:
        return {str(i): nv.nvmlDeviceGetMemoryInfo(nv.nvmlDeviceGetHandleByIndex(i)).used / GIB
                for i in range(nv.nvmlDeviceGetCount())}
    finally:
        nv.nvmlShutdown()


def _import_repo():
    repo = os.environ.get("VC_REPO")
    if repo and repo not in sys.path:
        sys.path.insert(0, repo)
    import verl_cluster  # noqa: F401  (fails loudly: set env.VC_REPO=<checkout> on submit)


def main() -> int:
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy, PlacementGroupSchedulingStrategy

    report: dict[str, Any] = {"ok": False, "problems": []}
    t_start = time.time()
    try:
        _import_repo()
        from verl_cluster.config.job import load_job
        from verl_cluster.facts.model import NodeFacts, from_dict
        from verl_cluster.placement import catalog_shape, plan_job

        ray.init(address="auto", logging_level="ERROR")
        # the spec travels in working_dir; submit appends the effective verl overrides as argv
        job = load_job(os.environ.get("GPU_SMOKE_SPEC", "gpu_smoke.yaml"), [a for a in sys.argv[1:] if "=" in a])
        # env.GPU_SMOKE_STRATEGY=split on submit forces one; unset: the spec's placement.strategy (auto: the plan's
        # choice). submit's preflight (submit/preflight.check_strategy) rejects one these GPUs cannot realise.
        strategy = os.environ.get("GPU_SMOKE_STRATEGY", "").strip() or None
        nodes = sorted((n for n in ray.nodes() if n.get("Alive") and n.get("Resources", {}).get("GPU", 0) > 0),
                       key=lambda n: n["NodeManagerAddress"])
        if not nodes:
            raise RuntimeError("no alive Ray node with GPUs")

        @ray.remote(num_cpus=0)
        def read_facts():
            _import_repo()
            from verl_cluster.diagnostics.gather import local_facts
            from verl_cluster.facts.model import to_dict as td
            return td(local_facts(head_ip=None, deep=False))

        facts_raw = ray.get([read_facts.options(scheduling_strategy=NodeAffinitySchedulingStrategy(
            n["NodeID"], soft=False)).remote() for n in nodes], timeout=120)
        facts = [from_dict(NodeFacts, {**f, "host": n["NodeManagerAddress"]}) for f, n in zip(facts_raw, nodes)]
        p = plan_job(job, facts, strategy=strategy)
        plan = p.to_dict()
        report["plan"] = {"feasible": plan["feasible"], "strategy": plan["strategy"],
                          "strategy_asked": strategy or job.placement.strategy, "settings": plan["settings"],
                          "roles": {r: {"gpus": v["gpus"], "memory_gib_per_gpu": v["memory_gib_per_gpu"]}
                                    for r, v in plan["roles"].items()}, "gpus": plan["gpus"]}
        if not plan["feasible"]:
            raise RuntimeError("plan infeasible: " + "; ".join(plan["problems"]))
        lay = layout(plan)
        report["layout"] = lay
        t_pg = time.time()
        pgs = []
        for g in lay["groups"]:
            ip = nodes[g["node"]]["NodeManagerAddress"]
            bundles = [dict(b, **{f"node:{ip}": 0.001}) for b in g["bundles"]]
            pgs.append(placement_group(bundles, strategy="STRICT_PACK", name=f"gpu_smoke_{g['pool']}_{g['node']}"))
        ray.get([pg.ready() for pg in pgs], timeout=120)
        report["placement_groups_ready_s"] = round(time.time() - t_pg, 2)
        shape = catalog_shape(job.model.catalog)
        sys.path.insert(0, os.path.join(os.environ.get("VC_REPO", "."), "scripts", "calibration"))
        from calibrate_memory import hf_config_kwargs, model_type  # the calibration's shape -> HF config mapping
        model_kw, mtype = hf_config_kwargs(shape), model_type(shape)
        attn = plan["settings"]["attn_implementation"]
        Worker = _role_actor_class(ray)
        env = {"NCCL_NVLS_ENABLE": "0"}
        actors = []
        for a in lay["actors"]:
            h = Worker.options(num_gpus=a["num_gpus"], num_cpus=0, scheduling_strategy=PlacementGroupSchedulingStrategy(
                pgs[a["group"]], placement_group_bundle_index=a["bundle"])).remote(a["role"], env)
            actors.append((a, h))
        where = ray.get([h.where.remote() for _, h in actors], timeout=300)
        actual = []
        for (a, _), w in zip(actors, where):
            actual.append({**a, "ip": w["ip"], "physical_gpu": ",".join(w["gpu_ids"]),
                           "cuda_visible": w["cuda_visible"], "node_ok": w["node_id"] == nodes[a["node"]]["NodeID"]})
        report["actors"] = actual
        report["problems"] += check_placement(lay, actual)
        measured = []
        timings = {}
        for role in RUN_ROLES:  # roles time-share their GPUs: one role at a time, all its ranks together
            mine = [(a, h, w) for (a, h), w in zip(actors, where) if a["role"] == role]
            if not mine:
                continue
            micro, seq = work_shape(plan, role)
            master = next(w for a, _, w in mine if a["rank"] == 0)
            t_role = time.time()
            res = ray.get([h.run.remote(a["rank"], a["world"], master["ip"], master["port"], model_kw, mtype,
                                        micro, seq, attn) for a, h, _ in mine], timeout=600)
            timings[role] = round(time.time() - t_role, 2)
            for (a, _, _), r in zip(mine, res):
                phys = next(x["physical_gpu"] for x in actual if x["role"] == role and x["rank"] == a["rank"])
                measured.append({**r, "node": a["node"], "gpu": a["gpu"], "physical_gpu": phys,
                                 "micro": micro, "seq": seq})
                if not r["ok"]:
                    report["problems"].append(f"{role} rank {a['rank']}: non-finite loss {r['losses']}")
        report["role_seconds"] = timings
        report["measured"] = measured

        @ray.remote(num_cpus=0)
        def nvml_used():
            return _nvml_used()

        used_by_node = ray.get([nvml_used.options(scheduling_strategy=NodeAffinitySchedulingStrategy(
            n["NodeID"], soft=False)).remote() for n in nodes], timeout=60)
        nvml: dict[tuple[int, int], float] = {}
        for a in actual:  # planned (node, gpu) -> the physical GPU the actor got
            phys = (a["physical_gpu"] or "").split(",")[0]
            if phys in used_by_node[a["node"]]:
                nvml[(a["node"], a["gpu"])] = used_by_node[a["node"]][phys]
        report["comparison"] = compare(plan, measured, nvml)
        for _, h in actors:
            ray.kill(h)
        for pg in pgs:
            remove_placement_group(pg)
        report["ok"] = not report["problems"]
    except Exception as e:  # noqa: BLE001 - reported as data, exit 1
        report["problems"].append(f"{type(e).__name__}: {e}")
        report["traceback"] = traceback.format_exc()[-3000:]
    report["seconds"] = round(time.time() - t_start, 2)
    for row in (report.get("comparison") or {}).get("roles", []):
        print(f"{row['role']:>7} planned GPU {row['node']}:{row['gpu']} (physical {row['physical_gpu']}) "
              f"{row['phase']}: predicted {row['predicted_reserved_gib']:.2f} GiB reserved, "
              f"measured {row['measured_reserved_gib']} reserved "
              f"({row['measured_allocated_gib']} allocated), error {row['error_pct']}%")
    for g in (report.get("comparison") or {}).get("gpus", []):
        print(f"GPU {g['node']}:{g['gpu']} roles {','.join(g['roles'])}: planned peak {g['planned_peak_gib_all_roles']} "
              f"GiB ({g['planned_peak_phase']}), {g['planned_peak_gib_roles_run']} GiB for the roles run; "
              f"measured sum of reserved {g['measured_sum_reserved_gib']} GiB, NVML in use {g['nvml_used_gib']} GiB")
    print("GPU_SMOKE-REPORT " + json.dumps(report, sort_keys=True, default=str), flush=True)
    if not report["ok"]:
        print("GPU SMOKE FAILED: " + "; ".join(report["problems"]), file=sys.stderr)
        return 1
    print(f"GPU SMOKE OK: {len(report['measured'])} role processes in {report['seconds']} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
