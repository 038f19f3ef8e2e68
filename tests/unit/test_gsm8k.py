"""GSM8K conversion: verl's RL parquet format from a few hand-written GSM8K-style rows."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from verl_cluster.errors import ConfigError
from verl_cluster.submit.data_check import check_schema, requirement_for, schema_tree
from verl_cluster.testdata.gsm8k import (INSTRUCTION, convert_rows, final_answer, read_rows, split_of, to_verl_row,
                                      write_parquet)
from verl_cluster.testdata.synthetic_gsm8k import synthetic_splits

ROOT = Path(__file__).resolve().parents[2]
ROWS = [
    {"question": "Tom has 3 apples and buys 2 more. How many apples?", "answer": "3 + 2 = <<3+2=5>>5\n#### 5"},
    {"question": "A farm sells 1,200 eggs a day. How many in 2 days?", "answer": "1,200*2=2,400\n#### 2,400"},
    {"question": "It is 4 degrees and drops 7. What now?", "answer": "4-7=-3\n#### -3"},
]


def test_final_answer_strips_commas_and_keeps_sign():
    assert final_answer("work\n#### 2,400") == "2400"
    assert final_answer("#### -3") == "-3"
    assert final_answer("x #### 0.5") == "0.5"
    with pytest.raises(ValueError):
        final_answer("no marker here")


def test_row_matches_verl_preprocess_format():
    row = to_verl_row(ROWS[1], 7, "train")
    assert row == {
        "data_source": "openai/gsm8k",
        "prompt": [{"role": "user", "content": ROWS[1]["question"] + " " + INSTRUCTION}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": "2400"},
        "extra_info": {"split": "train", "index": 7, "answer": ROWS[1]["answer"], "question": ROWS[1]["question"]},
    }
    assert INSTRUCTION == 'Let\'s think step by step and output the final answer after "####".'


def test_bad_rows_name_the_row():
    with pytest.raises(ConfigError, match=r"row 1 has no answer"):
        convert_rows([ROWS[0], {"question": "q"}], "train", "f.jsonl")
    with pytest.raises(ConfigError, match=r"row 0: no '#### <number>'"):
        convert_rows([{"question": "q", "answer": "none"}], "test", "f.jsonl")


def test_split_from_file_name():
    assert split_of(Path("main/train-00000-of-00001.parquet")) == "train"
    assert split_of(Path("gsm8k_test.jsonl")) == "test"
    with pytest.raises(ConfigError, match="cannot tell the split"):
        split_of(Path("gsm8k.jsonl"))


def test_prepare_script_end_to_end(tmp_path):
    """jsonl + parquet inputs -> verl parquet that passes the RL schema check preflight runs."""
    import pyarrow as pa

    (tmp_path / "train.jsonl").write_text("\n".join(json.dumps(r) for r in ROWS[:2]) + "\n")
    pq.write_table(pa.Table.from_pylist(ROWS[2:]), tmp_path / "test-00000.parquet")
    out = tmp_path / "out"
    r = subprocess.run([sys.executable, str(ROOT / "scripts/prepare_gsm8k.py"), str(tmp_path / "train.jsonl"),
                        str(tmp_path / "test-00000.parquet"), "-o", str(out)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "train: 2 rows" in r.stdout and "test: 1 rows" in r.stdout
    train = pq.read_table(out / "train.parquet")
    assert train.num_rows == 2
    assert train.to_pylist()[1]["reward_model"]["ground_truth"] == "2400"
    req = requirement_for("verl.trainer.main_ppo", {})
    assert check_schema("train.parquet", schema_tree(train.schema), req) == []
    assert read_rows(out / "test.parquet")[0]["extra_info"]["split"] == "test"


def test_prepare_script_bad_input_is_one_line(tmp_path):
    (tmp_path / "train.jsonl").write_text('{"question": "q"}\n')
    r = subprocess.run([sys.executable, str(ROOT / "scripts/prepare_gsm8k.py"), str(tmp_path / "train.jsonl"),
                        "-o", str(tmp_path / "o")], capture_output=True, text=True)
    assert r.returncode == 2
    assert r.stderr.startswith("error: ") and "row 0 has no answer" in r.stderr
    assert "Traceback" not in r.stderr


def test_sft_format_is_chat_messages_the_sft_trainer_accepts(tmp_path):
    rows = convert_rows(ROWS, "train", fmt="sft")
    assert rows[0]["messages"] == [{"role": "user", "content": ROWS[0]["question"]},
                                   {"role": "assistant", "content": ROWS[0]["answer"]}]
    import pyarrow as pa

    schema = schema_tree(pa.Table.from_pylist(rows).schema)
    assert check_schema("sft.parquet", schema, requirement_for("verl.trainer.sft_trainer", {})) == []
    # and the RL trainer would reject it, naming what is missing
    assert "missing columns `prompt`" in check_schema("sft.parquet", schema, requirement_for("verl.trainer.main_ppo", {}))[0]


# --- synthetic rows (offline machines) ---

def _check_notes(answer: str) -> int:
    """Re-evaluate every <<expr=value>> note; return the last value."""
    notes = re.findall(r"<<([0-9+\-*/ ]+)=(-?[0-9]+)>>", answer)
    assert notes, answer
    for expr, value in notes:
        assert eval(expr) == int(value), (expr, value)  # only digits and + - * / reach eval
    return int(notes[-1][1])


def test_synthetic_ground_truth_is_the_arithmetic_result():
    train, test = synthetic_splits(600, 100, seed=5)
    assert len(train) == 600 and len(test) == 100
    assert not {r["question"] for r in train} & {r["question"] for r in test}
    rows = convert_rows(train + test, "train")
    for raw, row in zip(train + test, rows):
        assert final_answer(raw["answer"]) == str(raw["result"]) == row["reward_model"]["ground_truth"]
        assert _check_notes(raw["answer"]) == raw["result"] >= 0
        assert raw["answer"].splitlines()[-1] == f"#### {raw['result']}"
        assert row["prompt"][0]["content"] == f"{raw['question']} {INSTRUCTION}"
    assert synthetic_splits(600, 100, seed=5) == (train, test)
    assert synthetic_splits(50, 0, seed=6)[0] != train[:50]


def test_verl_reward_scores_synthetic_answers():
    from verl.utils.reward_score.gsm8k import compute_score  # the function verl's reward manager calls

    train, _ = synthetic_splits(50, 0, seed=1)
    for row in convert_rows(train, "train"):
        truth = row["reward_model"]["ground_truth"]
        assert compute_score(row["extra_info"]["answer"], truth) == 1.0
        assert compute_score(f"so the answer is\n#### {truth}", truth) == 1.0
        assert compute_score(f"#### {int(truth) + 1}", truth) == 0
        assert compute_score(truth, truth) == 0  # strict: no '####', no reward


def test_prepare_script_synthetic(tmp_path):
    out = tmp_path / "out"
    r = subprocess.run([sys.executable, str(ROOT / "scripts/prepare_gsm8k.py"), "--synthetic", "40",
                        "--test-rows", "8", "--seed", "3", "-o", str(out)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "train: 40 rows" in r.stdout and "test: 8 rows" in r.stdout
    train = pq.read_table(out / "train.parquet")
    req = requirement_for("verl.trainer.main_ppo", {})
    assert check_schema("train.parquet", schema_tree(train.schema), req) == []
    first = train.to_pylist()[0]
    assert first["data_source"] == "openai/gsm8k" and first["ability"] == "math"
    assert first["reward_model"]["ground_truth"] == final_answer(first["extra_info"]["answer"])
    both = subprocess.run([sys.executable, str(ROOT / "scripts/prepare_gsm8k.py"), "--synthetic", "4",
                           str(tmp_path / "train.jsonl")], capture_output=True, text=True)
    assert both.returncode == 2 and "one of the two" in both.stderr


def test_verl_dataset_reads_synthetic_parquet_with_the_offline_tokenizer(tmp_path, monkeypatch):
    """What verl's trainer builds at start: RLHFDataset over the parquet, prompts measured with the tokenizer."""
    import datasets
    from omegaconf import OmegaConf
    from transformers import AutoTokenizer
    from verl.utils.dataset.rl_dataset import RLHFDataset

    from verl_cluster.testdata.tiny_model import write_tokenizer

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "hf"))
    train, _ = synthetic_splits(30, 0, seed=2)
    write_parquet(convert_rows(train, "train"), tmp_path / "train.parquet")
    write_tokenizer(tmp_path)
    tok = AutoTokenizer.from_pretrained(tmp_path)

    def dataset(max_prompt_length: int):
        cfg = OmegaConf.create({"max_prompt_length": max_prompt_length, "filter_overlong_prompts": True,
                                "filter_overlong_prompts_workers": 1, "cache_dir": str(tmp_path / "cache")})
        return RLHFDataset([str(tmp_path / "train.parquet")], tok, cfg)

    ds = dataset(512)
    assert len(ds) == 30  # every prompt fits
    item = ds[0]
    assert item["raw_prompt"] == item["prompt"] and item["reward_model"]["ground_truth"] == str(train[0]["result"])
    # verl 0.9 tokenises raw_prompt in its agent loop, as here
    ids = tok.apply_chat_template(item["raw_prompt"], add_generation_prompt=True, tokenize=True)
    ids = ids["input_ids"] if not isinstance(ids, list) else ids
    assert 20 < len(ids) <= 512 and max(ids) < len(tok)
    assert len(dataset(10)) == 0  # the length filter really used the tokenizer
