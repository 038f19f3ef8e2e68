#!/usr/bin/env python3
"""Measure real FSDP actor-update memory on the GPU machine and put it next to the planner's prediction.

    python scripts/calibration/calibrate_memory.py --dry-run                 # CPU: the cases and predictions only
    python scripts/calibration/calibrate_memory.py --worlds 1,2 --out calib.json

For each world size (1 and 2 GPUs, one process per GPU via torch.multiprocessing.spawn, NCCL) it builds a
randomly initialised HF model from a catalog shape (transformers AutoConfig + from_config, nothing is
downloaded), wraps it the way verl's actor does (FSDP full shard, fp32 master weights, bf16 mixed precision
with fp32 reduce, one FSDP unit per decoder layer, gradient checkpointing, AdamW), and runs update steps
(forward, fp32 log-softmax of the logits, backward, optimizer step) at each micro batch x sequence length.
It records torch.cuda.max_memory_reserved / max_memory_allocated per case (max over ranks) beside the
planner's prediction for the same case (memory.update_step: the live-tensor peak and the reserved working set,
without the CUDA context that torch does not count), prints a table and writes JSON. Target: within 10%.

Needs torch with CUDA and transformers on the GPU machine; both are imported only when not --dry-run.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Optional

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run from a checkout without installing

from verl_cluster.placement import memory as mem  # noqa: E402
from verl_cluster.placement.memory import GIB, TrainInputs  # noqa: E402
from verl_cluster.placement.model_shape import ModelShape, catalog_shape  # noqa: E402

DEFAULT_CASES = "1x512,4x512,8x512,1x2048,4x2048,8x2048"  # micro x sequence length
STEPS = 3  # Adam states appear at the first step; the peak settles by the third


@dataclass(frozen=True)
class Case:
    world: int
    micro: int
    seq: int


@dataclass
class Row:
    world: int
    micro: int
    seq: int
    predicted_allocated_gib: float
    predicted_reserved_gib: float
    measured_allocated_gib: Optional[float] = None
    measured_reserved_gib: Optional[float] = None
    error_pct: Optional[float] = None  # (predicted reserved - measured reserved) / measured
    status: str = "predicted"
    seconds: Optional[float] = None


def parse_cases(text: str, worlds: list[int]) -> list[Case]:
    out = []
    for item in text.split(","):
        micro, _, seq = item.strip().partition("x")
        if not micro.isdigit() or not seq.isdigit():
            raise SystemExit(f"--cases: `{item}` is not MICROxSEQ (e.g. 4x1024)")
        for w in worlds:
            out.append(Case(w, int(micro), int(seq)))
    return sorted(out, key=lambda c: (c.world, c.micro * c.seq))


MASTER_BYTES = {"fp32": 4, "bf16": 2}  # fsdp_config.model_dtype: the dtype the weights (and LoRA base) are kept in


def predict(shape: ModelShape, case: Case, attn: str, lora_rank: int = 0, master: str = "fp32") -> tuple[float, float]:
    """The planner's actor update working set for this case: (allocated, reserved) bytes, context excluded."""
    x = TrainInputs(shape=shape, params=shape.params, n=case.world, tokens=case.micro * case.seq, micro=case.micro,
                    seq=case.seq, c=2, m=MASTER_BYTES[master], grad_ckpt=True, attn=attn, vocab_out=shape.vocab,
                    adapter=shape.lora_params(lora_rank) if lora_rank else 0)
    step = mem.update_step(x)
    return step.allocated, step.reserved


def model_type(shape: ModelShape) -> str:
    if shape.name.startswith("qwen3"):
        return "qwen3"
    if shape.name.startswith("qwen2"):
        return "qwen2"
    return "llama"


def hf_config_kwargs(shape: ModelShape) -> dict[str, Any]:
    kw = dict(hidden_size=shape.hidden, num_hidden_layers=shape.layers, num_attention_heads=shape.heads,
              num_key_value_heads=shape.kv_heads, intermediate_size=shape.intermediate, vocab_size=shape.vocab,
              tie_word_embeddings=shape.tied_embeddings, max_position_embeddings=max(shape.max_position, 4096),
              use_cache=False)
    if shape.head_dim:
        kw["head_dim"] = shape.head_dim
    return kw


# ---------------------------------------------------------------------------------------------- GPU side

def _lora(model: Any, rank: int) -> tuple[Any, Any]:
    """Adapters the way verl's FSDP engine adds them (_build_lora_module): peft on every Linear but lm_head,
    inputs made to require grad for checkpointing, and an FSDP policy that wraps each trainable leaf alone."""
    import functools

    from peft import LoraConfig, get_peft_model
    from torch.distributed.fsdp.wrap import lambda_auto_wrap_policy

    model.enable_input_require_grads()
    model = get_peft_model(model, LoraConfig(task_type="CAUSAL_LM", r=rank, lora_alpha=16,
                                             target_modules="all-linear", bias="none"))
    leaf = functools.partial(lambda_auto_wrap_policy, lambda_fn=lambda m: bool(
        not list(m.named_children()) and getattr(m, "weight", None) is not None and m.weight.requires_grad))
    return model, leaf


def _worker(rank: int, world: int, port: int, shape_name: str, cases: list[tuple[int, int]], attn: str,
            out_path: str, lora_rank: int = 0, master: str = "fp32") -> None:
    import functools

    import torch
    import torch.distributed as dist
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp import MixedPrecision, ShardingStrategy
    from torch.distributed.fsdp.wrap import _or_policy, transformer_auto_wrap_policy
    from transformers import AutoConfig, AutoModelForCausalLM

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=world)
    shape = catalog_shape(shape_name)
    cfg = AutoConfig.for_model(model_type(shape), **hf_config_kwargs(shape))
    torch.manual_seed(0)
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[master]
    with torch.device("cuda"):  # random init on the GPU: minutes faster for 7B than on the CPU; the cache is
        # emptied and the peak reset before every case, so where the weights were made does not show
        model = AutoModelForCausalLM.from_config(cfg, torch_dtype=dtype, attn_implementation=attn)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    layer_cls = type(model.model.layers[0])
    policy = functools.partial(transformer_auto_wrap_policy, transformer_layer_cls={layer_cls})
    if lora_rank:
        model, leaf = _lora(model, lora_rank)
        policy = functools.partial(_or_policy, policies=[leaf, policy])
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    model = FSDP(
        model,
        auto_wrap_policy=policy,
        mixed_precision=MixedPrecision(param_dtype=torch.bfloat16, reduce_dtype=torch.float32,
                                       buffer_dtype=torch.float32),
        sharding_strategy=ShardingStrategy.FULL_SHARD,
        device_id=torch.cuda.current_device(),
        use_orig_params=False,
    )
    opt = torch.optim.AdamW(model.parameters(), lr=1e-6, weight_decay=0.01)
    results = []
    for micro, seq in cases:
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        t0 = time.time()
        status = "ok"
        try:
            for _ in range(STEPS):
                ids = torch.randint(0, shape.vocab, (micro, seq), device="cuda")
                # verl runs the actor's forward under autocast(bf16); peft casts a LoRA input to its adapter's
                # (fp32) dtype, so without it the adapters' bf16 FSDP weights meet fp32 inputs
                with torch.autocast("cuda", dtype=torch.bfloat16, enabled=bool(lora_rank)):
                    logits = model(input_ids=ids, use_cache=False).logits
                logp = torch.log_softmax(logits.float(), dim=-1)  # verl computes log-probs in fp32
                loss = -logp[:, :-1].gather(-1, ids[:, 1:].unsqueeze(-1)).mean()
                loss.backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
                del logits, logp, loss
            torch.cuda.synchronize()
        except torch.cuda.OutOfMemoryError:
            status = "OOM"
            opt.zero_grad(set_to_none=True)
        stats = torch.tensor([torch.cuda.max_memory_reserved(), torch.cuda.max_memory_allocated()],
                             dtype=torch.float64, device="cuda")
        dist.all_reduce(stats, op=dist.ReduceOp.MAX)
        flag = torch.tensor([1.0 if status == "OOM" else 0.0], device="cuda")
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        results.append({"micro": micro, "seq": seq, "reserved": stats[0].item(), "allocated": stats[1].item(),
                        "status": "OOM" if flag.item() else "ok", "seconds": time.time() - t0})
    if rank == 0:
        Path(out_path).write_text(json.dumps({"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__,
                                              "trainable_params": trainable, "results": results}))
    dist.barrier()
    dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def measure(shape: ModelShape, world: int, cases: list[Case], attn: str, lora_rank: int = 0,
            master: str = "fp32") -> dict[str, Any]:
    import torch
    import torch.multiprocessing as mp

    if torch.cuda.device_count() < world:
        return {"gpu": None, "results": [], "skipped": f"needs {world} GPUs, {torch.cuda.device_count()} visible"}
    with tempfile.TemporaryDirectory() as tmp:
        out_path = os.path.join(tmp, "rank0.json")
        mp.spawn(_worker, args=(world, _free_port(), shape.name, [(c.micro, c.seq) for c in cases], attn, out_path,
                                lora_rank, master),
                 nprocs=world, join=True)
        return json.loads(Path(out_path).read_text())


# ---------------------------------------------------------------------------------------------- driver

def fmt(v: Optional[float], spec: str = ".2f") -> str:
    return "-" if v is None else format(v, spec)


def print_table(rows: list[Row]) -> None:
    head = f"{'GPUs':>4} {'micro':>5} {'seq':>5} {'pred alloc':>10} {'pred resv':>10} {'meas alloc':>10} " \
           f"{'meas resv':>10} {'err %':>7} {'status':>9}"
    print(head)
    print("-" * len(head))
    for r in rows:
        print(f"{r.world:>4} {r.micro:>5} {r.seq:>5} {r.predicted_allocated_gib:>10.2f} {r.predicted_reserved_gib:>10.2f} "
              f"{fmt(r.measured_allocated_gib):>10} {fmt(r.measured_reserved_gib):>10} {fmt(r.error_pct, '+.1f'):>7} "
              f"{r.status:>9}")


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="qwen2.5-0.5b", help="catalog name (default qwen2.5-0.5b)")
    ap.add_argument("--worlds", default="1,2", help="GPU counts to run, e.g. 1,2")
    ap.add_argument("--cases", default=DEFAULT_CASES, help=f"MICROxSEQ list (default {DEFAULT_CASES})")
    ap.add_argument("--attn", default="sdpa", choices=("sdpa", "flash_attention_2", "eager"))
    ap.add_argument("--out", default="calibrate_memory.json", help="JSON results (default calibrate_memory.json)")
    ap.add_argument("--lora-rank", type=int, default=0, help="LoRA adapters of this rank on every Linear (peft)")
    ap.add_argument("--model-dtype", default="fp32", choices=tuple(MASTER_BYTES),
                    help="dtype the weights are kept in (verl's fsdp_config.model_dtype; fp32 by default)")
    ap.add_argument("--dry-run", action="store_true", help="print the cases and predictions; needs no GPU")
    args = ap.parse_args(argv)
    shape = catalog_shape(args.model)
    try:
        worlds = [int(w) for w in args.worlds.split(",") if w.strip()]
    except ValueError:
        raise SystemExit(f"--worlds: `{args.worlds}` is not a list of integers")
    cases = parse_cases(args.cases, worlds)
    rows = []
    for c in cases:
        alloc, reserved = predict(shape, c, args.attn, args.lora_rank, args.model_dtype)
        rows.append(Row(c.world, c.micro, c.seq, alloc / GIB, reserved / GIB))
    print(f"model {shape.name}: {shape.params / 1e9:.3f}B params; planner constants: loss path "
          f"{mem.loss_bytes(2, 'backward')} B per bf16 logit in backward, allocator fragmentation "
          f"{mem.FRAGMENT_UNITS} x the largest unit's gradient path, CUDA context not counted")
    meta: dict[str, Any] = {"model": shape.name, "params": shape.params, "attn": args.attn, "dry_run": args.dry_run,
                            "lora_rank": args.lora_rank, "model_dtype": args.model_dtype}
    if not args.dry_run:
        for w in worlds:
            got = measure(shape, w, [c for c in cases if c.world == w], args.attn, args.lora_rank, args.model_dtype)
            meta[f"world{w}"] = {k: v for k, v in got.items() if k != "results"}
            by_case = {(r["micro"], r["seq"]): r for r in got.get("results", [])}
            for row in rows:
                r = by_case.get((row.micro, row.seq)) if row.world == w else None
                if r is None:
                    continue
                row.measured_reserved_gib = r["reserved"] / GIB
                row.measured_allocated_gib = r["allocated"] / GIB
                row.status, row.seconds = r["status"], round(r["seconds"], 1)
                if r["status"] == "ok" and r["reserved"] > 0:
                    row.error_pct = 100 * (row.predicted_reserved_gib - row.measured_reserved_gib) / row.measured_reserved_gib
    print_table(rows)
    Path(args.out).write_text(json.dumps({**meta, "rows": [asdict(r) for r in rows]}, indent=2))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
