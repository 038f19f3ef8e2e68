#!/usr/bin/env python3
"""Reshard time and peak memory for verl FSDP2 checkpoints of real model shapes (random weights).

    .venv/bin/python scripts/bench/bench_reshard.py --shape qwen2.5-0.5b --from 8 --to 4 --to 1
    .venv/bin/python scripts/bench/bench_reshard.py --shape qwen2.5-7b --layers 2 --from 8 --to 4 --to 1

Writes `global_step_1/actor` with model, optimizer (AdamW exp_avg, exp_avg_sq) and extra-state files for W ranks,
as verl's FSDP2 manager lays them out (fp32 DTensor shards), generated one tensor at a time; drops the files
from the page cache; then runs `verl-cluster reshard --json` in a fresh process per target world size and reads
its own figures (time, bytes, sampled peak anonymous memory and the kernel's high-water mark VmHWM). The
disk-bound baseline is `cp -r` of the same checkpoint (same bytes read and written, cold cache) right before each
reshard. `--layers` keeps the full-size embedding / lm_head (the largest tensors) and fewer
decoder layers, for machines whose disk cannot hold two copies of the whole checkpoint.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from collections import OrderedDict
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from verl_cluster.reshard.shards import chunk_bounds  # noqa: E402
from verl_cluster.reshard.torchfile import OutStorage, OutTensor, WrapperRef, write_torch_file  # noqa: E402

SHAPES = {
    "qwen2.5-0.5b": dict(hidden=896, inter=4864, layers=24, heads=14, kv=2, vocab=151936, tied=True),
    "qwen2.5-7b": dict(hidden=3584, inter=18944, layers=28, heads=28, kv=4, vocab=152064, tied=False),
}


def param_shapes(s: dict, layers: int) -> "OrderedDict[str, tuple]":
    h, kvd = s["hidden"], s["kv"] * (s["hidden"] // s["heads"])
    out = OrderedDict([("model.embed_tokens.weight", (s["vocab"], h))])
    for i in range(layers):
        p = f"model.layers.{i}."
        out.update({p + "self_attn.q_proj.weight": (h, h), p + "self_attn.q_proj.bias": (h,),
                    p + "self_attn.k_proj.weight": (kvd, h), p + "self_attn.k_proj.bias": (kvd,),
                    p + "self_attn.v_proj.weight": (kvd, h), p + "self_attn.v_proj.bias": (kvd,),
                    p + "self_attn.o_proj.weight": (h, h), p + "mlp.gate_proj.weight": (s["inter"], h),
                    p + "mlp.up_proj.weight": (s["inter"], h), p + "mlp.down_proj.weight": (h, s["inter"]),
                    p + "input_layernorm.weight": (h,), p + "post_attention_layernorm.weight": (h,)})
    out["model.norm.weight"] = (h,)
    if not s["tied"]:
        out["lm_head.weight"] = (s["vocab"], h)
    return out


def _mesh(world: int, rank: int):
    from torch.distributed.device_mesh import DeviceMesh

    mesh = DeviceMesh("cpu", torch.arange(world), mesh_dim_names=("fsdp",), _init_backend=False, _rank=rank)
    mesh._dim_group_names = ["0"]
    return mesh


def _contiguous_stride(shape: tuple) -> tuple:
    out, acc = [], 1
    for n in reversed(shape):
        out.append(acc)
        acc *= n
    return tuple(reversed(out))


def _dtensor(shape: tuple, world: int, rank: int, mesh, seed: int) -> WrapperRef:
    from torch.distributed.tensor import DTensor, Shard
    from torch.distributed.tensor._dtensor_spec import DTensorSpec, TensorMeta

    a, b = chunk_bounds(shape[0], world)[rank]
    local = (b - a,) + tuple(shape[1:])
    numel = 1
    for n in local:
        numel *= n
    full_stride, local_stride = _contiguous_stride(tuple(shape)), _contiguous_stride(local)

    def produce():
        g = torch.Generator().manual_seed(seed)
        return torch.empty(local, dtype=torch.float32).normal_(0, 0.02, generator=g)

    st = OutStorage(torch.float32, numel, "cpu", produce=produce)
    spec = DTensorSpec(mesh, (Shard(0),), TensorMeta(torch.Size(shape), full_stride, torch.float32))
    args = (DTensor, torch.float32, torch.Size(shape), full_stride, 0, torch.strided, torch.device("cpu"), False)
    return WrapperRef(torch._utils._rebuild_wrapper_subclass, DTensor, args,
                      (None, {"_local_tensor": OutTensor(st, 0, local, local_stride), "_spec": spec}))


def make_checkpoint(root: Path, shape: str, layers: int, world: int) -> int:
    s = SHAPES[shape]
    params = param_shapes(s, layers)
    role = root / "global_step_1" / "actor"
    (role / "huggingface").mkdir(parents=True)
    (role / "huggingface" / "config.json").write_text(json.dumps({"architectures": ["Qwen2ForCausalLM"]}))
    (role / "fsdp_config.json").write_text(json.dumps({"FSDP_version": 2, "world_size": world}))
    total = 0
    for r in range(world):
        mesh = _mesh(world, r)
        model = OrderedDict((n, _dtensor(shp, world, r, mesh, hash((n, r)) & 0xFFFF)) for n, shp in params.items())
        total += write_torch_file(str(role / f"model_world_size_{world}_rank_{r}.pt"), model)
        state = {i: {"step": torch.tensor(10.0), "exp_avg": _dtensor(shp, world, r, mesh, i),
                     "exp_avg_sq": _dtensor(shp, world, r, mesh, i + 1)} for i, shp in enumerate(params.values())}
        optim = {"state": state, "param_groups": [{"lr": 1e-6, "betas": (0.9, 0.999), "eps": 1e-8,
                                                   "weight_decay": 0.01, "params": list(range(len(params)))}]}
        total += write_torch_file(str(role / f"optim_world_size_{world}_rank_{r}.pt"), optim)
        torch.manual_seed(r)
        torch.save({"lr_scheduler": {"last_epoch": 10}, "rng": {"cpu": torch.get_rng_state()}},
                   role / f"extra_state_world_size_{world}_rank_{r}.pt")
    torch.save({"dataloader": 10}, root / "global_step_1" / "data.pt")
    (root / "latest_checkpointed_iteration.txt").write_text("1")
    return total


def drop_cache(folder: Path) -> None:
    for p in folder.rglob("*"):
        if p.is_file():
            fd = os.open(p, os.O_RDONLY)
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            os.close(fd)


def copy_baseline(src: Path, dest: Path) -> float:
    """Seconds for `cp -r` + `sync` of the checkpoint from a cold cache: the same bytes read and written."""
    drop_cache(src)
    t0 = time.monotonic()
    subprocess.run(["cp", "-r", str(src), str(dest)], check=True)
    subprocess.run(["sync"], check=True)
    took = time.monotonic() - t0
    shutil.rmtree(dest)
    return took


def run_reshard(src: Path, out: Path, world: int) -> dict:
    cmd = [sys.executable, "-m", "verl_cluster", "reshard", str(src), "--world-size", str(world),
           "--out", str(out), "--json"]
    t0 = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    wall = time.monotonic() - t0
    if proc.returncode:
        raise SystemExit(f"reshard failed ({proc.returncode}): {proc.stderr[-2000:]}")
    doc = json.loads(proc.stdout)
    doc["wall_s"] = wall
    return doc


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", choices=sorted(SHAPES), required=True)
    ap.add_argument("--layers", type=int, help="decoder layers to write (default: all of the shape's)")
    ap.add_argument("--from", dest="src", type=int, default=8, help="world size the checkpoint is written for")
    ap.add_argument("--to", type=int, action="append", required=True, help="target world size (repeatable)")
    ap.add_argument("--dir", default=None, help="scratch folder (default: a temp dir, removed afterwards)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    layers = args.layers if args.layers is not None else SHAPES[args.shape]["layers"]
    base = Path(tempfile.mkdtemp(prefix="bench_reshard_", dir=args.dir))
    rows = []
    try:
        src = base / "src"
        t0 = time.monotonic()
        tensor_bytes = make_checkpoint(src, args.shape, layers, args.src)
        gen_s = time.monotonic() - t0
        drop_cache(src)
        on_disk = sum(p.stat().st_size for p in src.rglob("*") if p.is_file())
        for m in args.to:
            copy_s = copy_baseline(src, base / "copy")  # right before each reshard: the same load on the box
            drop_cache(src)
            out = base / f"ws{m}"
            doc = run_reshard(src, out, m)
            rows.append({"shape": args.shape, "layers": layers, "from": args.src, "to": m,
                         "checkpoint_bytes": on_disk, "seconds": round(doc["seconds"], 2),
                         "wall_s": round(doc["wall_s"], 2),
                         "read_gb_s": round(on_disk / doc["seconds"] / 1e9, 2),
                         "cp_s": round(copy_s, 2), "vs_cp": round(doc["seconds"] / copy_s, 2),
                         "load_avg": round(os.getloadavg()[0], 1),
                         "peak_anon_gib": round(doc["peak_anon_bytes"] / 2**30, 3),
                         "start_anon_gib": round(doc["start_anon_bytes"] / 2**30, 3),
                         "hwm_gib": round(doc["hwm_bytes"] / 2**30, 3),
                         "largest_tensor": doc["largest_tensor"],
                         "largest_tensor_gib": round(doc["largest_tensor_bytes"] / 2**30, 3)})
            shutil.rmtree(out)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    meta = {"date": time.strftime("%Y-%m-%d"), "machine": f"{platform.node()} {os.cpu_count()} CPUs "
            f"{os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 2**30:.0f} GiB RAM",
            "generate_s": round(gen_s, 1), "tensor_bytes": tensor_bytes, "torch": torch.__version__}
    if args.json:
        print(json.dumps({"meta": meta, "rows": rows}, indent=2))
    else:
        print(json.dumps(meta))
        for r in rows:
            print(json.dumps(r))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
