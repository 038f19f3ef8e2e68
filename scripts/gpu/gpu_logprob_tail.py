#!/usr/bin/env python3
"""One packed log-prob micro batch of the 0.5B shape, run as verl 0.9.1's forward_step runs it (bf16 autocast,
no_grad, position_ids only, verl's own logprobs_from_logits and compiled entropy_from_logits, `.item()` at the end),
timed in parts: the layers, the part after them (LM head, cross-entropy, entropy) and the whole. Whether the whole
is the parts' sum or the larger of host and GPU is what docs/placement.md, "The logits after the last sync", asks.
Also counts the host<->GPU syncs of the layers (torch's sync debug mode) with position_ids alone, as verl passes them,
and with the varlen arguments given (no per-layer sync), and times both.

    PYTHONPATH=/root/stage/verl/site python3 scripts/gpu/gpu_logprob_tail.py [--seqs 32 16] [--repeat 5]   # JSON lines
Needs a GPU, torch, transformers, flash-attn and verl (the staged site and the carried flash-attn wheel).
`--cpu` runs a 2-layer shape with SDPA on the CPU (no syncs to count): the script's own check, for the tests."""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import warnings
from pathlib import Path
from typing import Optional


def lengths(seqs: int) -> list[int]:
    """Prompt + response lengths about grid2's (mean ~340 tokens), fixed so every card sees the same batch."""
    return [300 + (37 * i) % 81 for i in range(seqs)]


def timed(torch, fn, repeat: int) -> tuple[float, float]:
    """(median wall seconds to the GPU's end, median seconds until fn returned on the host)."""
    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    wall, host = [], []
    for _ in range(repeat):
        sync()
        t0 = time.perf_counter()
        fn()
        host.append(time.perf_counter() - t0)
        sync()
        wall.append(time.perf_counter() - t0)
    return statistics.median(wall), statistics.median(host)


def syncs(torch, fn) -> Optional[int]:
    """Host<->GPU syncs while FN runs (torch's sync debug mode warns at each); None without a GPU."""
    if not torch.cuda.is_available():
        return None
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as got:
            warnings.simplefilter("always")
            fn()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    return sum("synchroniz" in str(w.message) for w in got)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seqs", type=int, nargs="+", default=[32, 16])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--shape", default="qwen2.5-0.5b", help="a shape of verl_cluster/testdata/tiny_model.SHAPES (GPU)")
    ap.add_argument("--cpu", action="store_true", help="a 2-layer shape with SDPA on the CPU: the script's own check")
    a = ap.parse_args(argv)
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from verl_cluster.testdata.tiny_model import SHAPES

    if a.shape not in SHAPES or SHAPES[a.shape]["vocab_size"] is None:
        print(json.dumps({"error": f"--shape {a.shape}: one of {', '.join(k for k in SHAPES if k != 'tiny')}"}))
        return 2
    try:  # said before torch's import (seconds)
        import torch
        from transformers import Qwen2Config, Qwen2ForCausalLM
        from verl.utils.torch_functional import entropy_from_logits, logprobs_from_logits
    except ImportError as e:
        print(json.dumps({"error": f"{e}: run with the staged site on PYTHONPATH"}))
        return 2
    if not a.cpu and not torch.cuda.is_available():
        print(json.dumps({"error": "no GPU (--cpu checks the script on the CPU)"}))
        return 2
    dev = "cpu" if a.cpu else "cuda"
    shape = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, vocab_size=1000) if a.cpu else dict(SHAPES[a.shape])  # grid2 runs 0.5B
    cfg = Qwen2Config(max_position_embeddings=32768, tie_word_embeddings=True, **shape)
    cfg._attn_implementation = "sdpa" if a.cpu else "flash_attention_2"
    torch.manual_seed(0)
    with torch.device(dev):
        model = Qwen2ForCausalLM(cfg).to(torch.bfloat16).eval()
    entropy, how = entropy_from_logits, "eager"
    if not a.cpu:  # as verl's FSDP engine does (use_torch_compile); said, not fatal, if Inductor fails here
        entropy, how = torch.compile(entropy_from_logits, dynamic=True), "compiled"
    for seqs in a.seqs:
        lens = lengths(seqs)
        n = sum(lens)
        ids = torch.randint(0, cfg.vocab_size, (1, n), device=dev)
        pos = torch.cat([torch.arange(x, device=dev) for x in lens]).unsqueeze(0)
        varlen = {}  # flash-attn's varlen arguments given: transformers skips rebuilding them in each layer
        if not a.cpu:
            cu = torch.tensor([0] + [sum(lens[:i + 1]) for i in range(seqs)], dtype=torch.int32, device=dev)
            varlen = {"cu_seq_lens_q": cu, "cu_seq_lens_k": cu, "max_length_q": max(lens), "max_length_k": max(lens)}
        labels = torch.roll(ids, -1, dims=1)
        keep = {}

        def layers(**kw):
            with torch.no_grad(), torch.autocast(dev, dtype=torch.bfloat16):
                keep["h"] = model.model(input_ids=ids, position_ids=pos, **kw).last_hidden_state

        def tail(ent_fn=None):
            with torch.no_grad(), torch.autocast(dev, dtype=torch.bfloat16):
                logits = model.lm_head(keep["h"]).squeeze(0)
                lp = logprobs_from_logits(logits, labels.squeeze(0), inplace_backward=False)  # as with the entropy
                ent = (ent_fn or entropy)(logits)
            keep["out"] = (lp, ent)

        def whole():  # verl's forward_step: the layers, the tail, then loss.detach().item()
            layers()
            tail()
            torch.tensor(1.0, device=dev).item()

        try:
            for _ in range(3):  # warm-up: the compile, flash-attn's and the allocator's first calls
                whole()
        except Exception as e:  # noqa: BLE001 - Inductor missing a compiler here: the eager entropy, said
            if how != "compiled":
                raise
            entropy, how = entropy_from_logits, f"eager (torch.compile failed: {str(e)[:200]})"
            for _ in range(3):
                whole()
        layers_s, layers_host_s = timed(torch, layers, a.repeat)
        varlen_s, varlen_host_s = timed(torch, lambda: layers(**varlen), a.repeat)
        layers()
        tail_s, _ = timed(torch, tail, a.repeat)
        # the same tail with verl's entropy uncompiled (fsdp_config.use_torch_compile=false): what compiling buys
        tail_eager_s, _ = timed(torch, lambda: tail(entropy_from_logits), a.repeat)
        whole_s, _ = timed(torch, whole, a.repeat)
        doc = {"card": "cpu" if a.cpu else torch.cuda.get_device_name(0), "torch": torch.__version__,
               "shape": "cpu-2-layer" if a.cpu else a.shape, "hidden": cfg.hidden_size,
               "entropy": how, "seqs": seqs, "tokens": n,
               "layers": cfg.num_hidden_layers, "syncs_layers_position_ids": syncs(torch, layers),
               "syncs_layers_varlen": syncs(torch, lambda: layers(**varlen)),
               "layers_s": round(layers_s, 4), "layers_host_s": round(layers_host_s, 4),
               "layers_varlen_s": round(varlen_s, 4), "layers_varlen_host_s": round(varlen_host_s, 4),
               "tail_s": round(tail_s, 4), "tail_eager_entropy_s": round(tail_eager_s, 4), "whole_s": round(whole_s, 4),
               "whole_less_parts_s": round(whole_s - layers_s - tail_s, 4)}
        print(json.dumps(doc), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
