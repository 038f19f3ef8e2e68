#!/usr/bin/env python3
"""Write a randomly initialised Qwen2.5-shaped model folder for offline verl runs (nothing is downloaded).

    python scripts/make_tiny_model.py -o ~/models/tiny-qwen2.5                        # 2 layers, ~1 MB
    python scripts/make_tiny_model.py -o ~/models/qwen2.5-0.5b-random --shape qwen2.5-0.5b   # real shape, ~1 GB

The folder has config.json (model_type qwen2), generation_config.json, model.safetensors (bf16, normal(0,
0.02) init) and a byte-level BPE tokenizer trained here on synthetic word problems, with Qwen2.5's special
tokens and chat template. The same --seed gives the same files. Needs numpy and tokenizers, not torch.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from verl_cluster.testdata.tiny_model import SHAPES, write_model  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-o", "--output-dir", type=Path, required=True, help="model folder to write")
    p.add_argument("--shape", choices=sorted(SHAPES), default="tiny")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    start = time.monotonic()
    info = write_model(args.output_dir.expanduser(), args.shape, args.seed)
    c = info["config"]
    print(f"{args.shape}: {info['params']:,} params, {c['num_hidden_layers']} layers, hidden {c['hidden_size']}, "
          f"vocab {c['vocab_size']} (tokenizer {info['tokenizer_size']}), "
          f"model.safetensors {info['weights_bytes'] / 1e6:.1f} MB -> {args.output_dir} "
          f"({time.monotonic() - start:.1f}s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
