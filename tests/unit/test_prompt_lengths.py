"""Prompt lengths measured on recorded parquet samples (tests/fixtures/prompts, written by its make_samples.py) with
the tiny tokenizer fixture, as preflight measures them on a node and `plan --data` here."""

import json
import math
import sys
from pathlib import Path

import pytest

from verl_cluster.submit import prompt_probe
from verl_cluster.verl_logs.verl_log import VerlProgress
from verl_cluster.placement.lengths import PromptStats

ROOT = Path(__file__).resolve().parents[2]
FIX = ROOT / "tests/fixtures/prompts"
TOK = str(FIX / "tokenizer")
GSM8K, MATH, OVERLONG = (str(FIX / n) for n in ("gsm8k_train.parquet", "math_long_train.parquet",
                                                "overlong_train.parquet"))


@pytest.fixture(scope="module")
def gsm8k():
    return prompt_probe.measure([GSM8K], TOK, limit=512)


def test_gsm8k_all_rows_with_the_tokenizer_and_its_chat_template(gsm8k):
    d = gsm8k
    assert (d["rows"], d["sampled"], d["method"], d["how"]) == (2000, 2000, "tokenizer", "chat template applied")
    assert d["min"] <= d["p50"] <= d["p95"] <= d["max"] and d["min"] < d["mean"] < d["max"]
    assert d["over_limit"] == 0 and d["mean_kept"] == d["mean_truncated"] == d["mean"]


def test_gsm8k_mean_matches_the_prompt_length_verl_logged_on_an_h100():
    """The recorded GRPO run (tests/fixtures/verl_logs/h100_grpo_0.5b_succeeded.log) trained on synthetic GSM8K rows
    with this tokenizer (tiny_model's, the same for every shape): its per-step prompt_length/mean over 64 prompts."""
    d = prompt_probe.measure([GSM8K], TOK, limit=512)
    prog = VerlProgress()
    prog.feed((ROOT / "tests/fixtures/verl_logs/h100_grpo_0.5b_succeeded.log").read_text())
    logged = [m["prompt_length/mean"] for m in prog.steps.values() if "prompt_length/mean" in m]
    assert len(logged) == 3
    assert abs(d["mean"] - sum(logged) / 3) / (sum(logged) / 3) < 0.02
    assert all(abs(d["mean"] - x) / x < 0.03 for x in logged)


def test_the_template_adds_the_system_prompt_and_role_markers(gsm8k):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(TOK, local_files_only=True)
    prompts, _, _ = prompt_probe.sample_prompts([GSM8K], "prompt", 5)
    plain = [len(tok(m[0]["content"], add_special_tokens=False)["input_ids"]) for m in prompts]
    templated, how = prompt_probe.token_lengths(tok, prompts, {})
    extra = {t - p for t, p in zip(templated, plain)}
    assert how == "chat template applied" and len(extra) == 1 and extra.pop() >= 10  # the same overhead on each


def test_without_a_tokenizer_lengths_are_estimated_from_characters_with_the_ratio_stated():
    d = prompt_probe.measure([GSM8K], str(FIX / "no-such-model"), limit=512)
    assert d["method"] == "characters" and d["chars_per_token"] == prompt_probe.CHARS_PER_TOKEN
    assert "no tokenizer for" in d["how"]
    prompts, _, _ = prompt_probe.sample_prompts([GSM8K], "prompt", 10**6)
    chars = [len(m[0]["content"]) for m in prompts]
    want = [math.ceil(c / prompt_probe.CHARS_PER_TOKEN) + prompt_probe.TEMPLATE_TOKENS_PER_MESSAGE
            + prompt_probe.TEMPLATE_TOKENS_BASE for c in chars]
    assert d["max"] == max(want) and d["mean"] == pytest.approx(sum(want) / len(want))
    s = PromptStats.from_probe(d)
    assert "from characters at 3 per token" in s.where() and "no tokenizer for" in s.where()
    assert prompt_probe.measure([GSM8K], None)["how"] == "the job names no model"


def test_a_large_file_is_sampled_evenly(gsm8k):
    d = prompt_probe.measure([GSM8K], TOK, limit=512, sample=300)
    assert d["rows"] == 2000 and 280 <= d["sampled"] <= 300
    assert abs(d["mean"] - gsm8k["mean"]) / gsm8k["mean"] < 0.03
    s = PromptStats.from_probe(d)
    assert f"{d['sampled']} of 2000 rows" in s.where()
    both = prompt_probe.measure([GSM8K, OVERLONG], TOK, limit=512, sample=600)  # files share the sample by rows
    assert both["rows"] == 2400 and 560 <= both["sampled"] <= 600


def test_math_shaped_prompts_are_long():
    d = prompt_probe.measure([MATH], TOK, limit=4096)
    assert d["rows"] == d["sampled"] == 600 and d["over_limit"] == 0
    assert d["mean"] > 1000 and d["p95"] > d["p50"] > 1000 and d["max"] < 4096


def test_over_long_prompts_are_counted_and_both_verl_behaviours_give_their_mean():
    d = prompt_probe.measure([OVERLONG], TOK, limit=512)
    assert d["over_limit"] == 40 and d["sampled"] == 400 and d["max"] > 512
    s = PromptStats.from_probe(d)
    assert s.mean_kept < s.mean_truncated < s.mean
    assert s.mean_used(filter_overlong=True) == s.mean_kept  # verl drops them
    assert s.mean_used(filter_overlong=False) == s.mean_truncated  # verl 0.9 left-truncates them to the limit
    assert s.mean_truncated == pytest.approx((s.mean_kept * 360 + 512 * 40) / 400)


def test_unreadable_files_and_missing_columns_are_named(tmp_path):
    bad = tmp_path / "x.parquet"
    bad.write_bytes(b"not parquet")
    d = prompt_probe.measure([str(bad)], TOK)
    assert d["error"].startswith(f"{bad}: ")
    d = prompt_probe.measure([GSM8K], TOK, prompt_key="question")
    assert "no column `question`" in d["error"] and "prompt" in d["error"]
    d = prompt_probe.measure([GSM8K, str(tmp_path / "gone.parquet")], TOK, limit=512)
    assert d["sampled"] == 2000 and str(tmp_path / "gone.parquet") in d["errors"]


def test_the_node_side_script_runs_as_preflight_ships_it():
    """The probe as preflight runs it on a node: its source through `python -c` (a real subprocess)."""
    from verl_cluster.runners.local import LocalRunner
    from verl_cluster.runners.remote_python import run_python

    arg = json.dumps({"files": [GSM8K], "model": TOK, "prompt_key": "prompt", "limit": 512})
    doc = run_python(LocalRunner(), sys.executable, (ROOT / "verl_cluster/submit/prompt_probe.py").read_text(), [arg],
                     timeout=120)
    here = prompt_probe.measure([GSM8K], TOK, limit=512)
    assert {k: doc[k] for k in ("mean", "p95", "max", "sampled", "method")} == \
        {k: here[k] for k in ("mean", "p95", "max", "sampled", "method")}


def test_a_file_much_larger_than_the_sample_is_read_in_spread_row_groups(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    big = tmp_path / "big.parquet"
    rows = [{"prompt": [{"role": "user", "content": "word " * (1 + i // 500)}]} for i in range(40_000)]
    pq.write_table(pa.Table.from_pylist(rows), big, row_group_size=500)  # 80 groups, lengths grow along the file
    pf = pq.ParquetFile(big)
    groups, n = prompt_probe.spread_row_groups(pf, 500)
    assert (groups[0], groups[-1], len(groups), n) == (0, 79, prompt_probe.SPREAD_GROUPS, 500 * len(groups))
    d = prompt_probe.measure([str(big)], None, sample=500)
    assert d["rows"] == 40_000 and 450 <= d["sampled"] <= 500
    whole = prompt_probe.char_lengths([prompt_probe.as_messages(r["prompt"]) for r in rows])
    assert abs(d["mean"] - sum(whole) / len(whole)) / (sum(whole) / len(whole)) < 0.05  # spans the file
