"""GSM8K rows -> verl's RL parquet rows, the same shape verl's examples/data_preprocess/gsm8k.py writes.

Input: the openai/gsm8k train/test splits the user already has (parquet, jsonl or arrow files with
`question` and `answer`). Nothing is downloaded.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Iterable

from verl_cluster.errors import ConfigError

DATA_SOURCE = "openai/gsm8k"
INSTRUCTION = "Let's think step by step and output the final answer after \"####\"."
_FINAL = re.compile(r"#### (-?[0-9.,]+)")


def final_answer(answer: str) -> str:
    """The number after '####' with thousands separators removed: '#### 1,200' -> '1200'."""
    m = _FINAL.search(answer)
    if m is None:
        raise ValueError("no '#### <number>' in the answer")
    return m.group(1).replace(",", "")


def to_verl_row(example: dict, index: int, split: str) -> dict[str, Any]:
    question, answer = example["question"], example["answer"]
    return {
        "data_source": DATA_SOURCE,
        "prompt": [{"role": "user", "content": f"{question} {INSTRUCTION}"}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": final_answer(answer)},
        "extra_info": {"split": split, "index": index, "answer": answer, "question": question},
    }


def to_sft_row(example: dict, index: int, split: str) -> dict[str, Any]:
    """Chat messages for verl 0.9's SFT trainer (data.messages_key: messages)."""
    final_answer(example["answer"])  # same validation as the RL rows
    return {
        "messages": [{"role": "user", "content": example["question"]},
                     {"role": "assistant", "content": example["answer"]}],
        "data_source": DATA_SOURCE,
        "extra_info": {"split": split, "index": index},
    }


def convert_rows(rows: Iterable[dict], split: str, source: str = "<rows>", fmt: str = "rl") -> list[dict]:
    out = []
    for i, row in enumerate(rows):
        missing = [k for k in ("question", "answer") if k not in row]
        if missing:
            raise ConfigError(f"{source}: row {i} has no {', '.join(missing)} column",
                              f"GSM8K files need `question` and `answer`; this row has: {', '.join(row)}")
        try:
            out.append((to_sft_row if fmt == "sft" else to_verl_row)(row, i, split))
        except ValueError as e:
            raise ConfigError(f"{source}: row {i}: {e}", "is this the GSM8K `main` config?")
    return out


def read_rows(path: Path) -> list[dict]:
    """Rows of a parquet, jsonl/json or arrow (IPC / HF datasets cache) file."""
    suffix = path.suffix.lower()
    if not path.is_file():
        raise ConfigError(f"{path}: file not found")
    if suffix in (".jsonl", ".json"):
        text = path.read_text()
        try:
            if suffix == ".json" and text.lstrip().startswith("["):
                return list(json.loads(text))
            return [json.loads(line) for line in text.splitlines() if line.strip()]
        except json.JSONDecodeError as e:
            raise ConfigError(f"{path}:{e.lineno}: invalid JSON: {e.msg}")
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        if suffix == ".parquet":
            table = pq.read_table(path)
        elif suffix == ".arrow":
            table = _read_arrow(path, pa)
        else:
            raise ConfigError(f"{path}: unknown file type `{suffix}`", "use .parquet, .jsonl, .json or .arrow")
    except (pa.ArrowInvalid, OSError) as e:
        raise ConfigError(f"{path}: cannot read: {str(e).splitlines()[0]}")
    return table.to_pylist()


def _read_arrow(path: Path, pa) -> Any:
    # HF datasets caches are Arrow streams; plain Arrow files use the file format
    try:
        with pa.memory_map(str(path)) as src:
            return pa.ipc.open_stream(src).read_all()
    except pa.ArrowInvalid:
        with pa.memory_map(str(path)) as src:
            return pa.ipc.open_file(src).read_all()


def write_parquet(rows: list[dict], path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), path)


def split_of(path: Path) -> str:
    """'train' or 'test' from a file name such as train-00000-of-00001.parquet or gsm8k_test.jsonl."""
    name = path.name.lower()
    for split in ("train", "test"):
        if split in name:
            return split
    raise ConfigError(f"{path}: cannot tell the split from the file name",
                      "name it after its split (train.* / test.*) or pass --split")
