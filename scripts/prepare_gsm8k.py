#!/usr/bin/env python3
"""Turn GSM8K files you already have into verl's parquet (train.parquet / test.parquet).

    python scripts/prepare_gsm8k.py ~/gsm8k/main/train-*.parquet ~/gsm8k/main/test-*.parquet -o ~/data/gsm8k

Accepts parquet, jsonl/json or arrow files of the openai/gsm8k `main` splits; the split comes from the file
name (or --split). Output rows match verl's examples/data_preprocess/gsm8k.py. Nothing is downloaded.

Without GSM8K at hand (an offline machine), generate GSM8K-style arithmetic word problems instead:

    python scripts/prepare_gsm8k.py --synthetic 2000 --test-rows 200 --seed 0 -o ~/data/gsm8k
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from verl_cluster.errors import VerlClusterError  # noqa: E402
from verl_cluster.testdata.gsm8k import convert_rows, read_rows, split_of, write_parquet  # noqa: E402
from verl_cluster.testdata.synthetic_gsm8k import synthetic_splits  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("inputs", nargs="*", type=Path, help="GSM8K split files (parquet, jsonl, json, arrow)")
    p.add_argument("-o", "--output-dir", type=Path, default=Path("~/data/gsm8k").expanduser())
    p.add_argument("--split", choices=("train", "test"), help="split of all inputs (default: from file names)")
    p.add_argument("--format", choices=("rl", "sft"), default="rl",
                   help="rl: verl's PPO/GRPO rows (prompt, reward_model, ...); sft: chat messages for verl's SFT trainer")
    p.add_argument("--synthetic", type=int, metavar="N", help="instead of inputs: N generated train rows")
    p.add_argument("--test-rows", type=int, default=100, metavar="M", help="generated test rows (default 100)")
    p.add_argument("--seed", type=int, default=0, help="seed of the generated rows")
    args = p.parse_args(argv)
    if bool(args.inputs) == (args.synthetic is not None):
        p.error("give GSM8K files or --synthetic N (one of the two)")
    if args.synthetic is not None and (args.synthetic < 1 or args.test_rows < 0):
        p.error("--synthetic needs N >= 1 and --test-rows M >= 0")
    try:
        by_split: dict[str, list[dict]] = {}
        for path in args.inputs:
            split = args.split or split_of(path)
            by_split.setdefault(split, []).extend(read_rows(path))
        source = ", ".join(str(i) for i in args.inputs)
        if args.synthetic is not None:
            train, test = synthetic_splits(args.synthetic, args.test_rows, args.seed)
            by_split = {"train": train, "test": test} if test else {"train": train}
            source = f"synthetic (seed {args.seed})"
        for split, raw in sorted(by_split.items()):
            rows = convert_rows(raw, split, source=source, fmt=args.format)
            out = args.output_dir / f"{split}.parquet"
            write_parquet(rows, out)
            print(f"{split}: {len(rows)} rows -> {out}")
    except VerlClusterError as e:
        print(f"error: {e.message}", file=sys.stderr)
        if e.hint:
            print(f"hint: {e.hint}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
