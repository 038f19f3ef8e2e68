"""Planning at the lengths the data has: where each length comes from, the two plans (worst case and known
lengths), token budgets as verl's prepare_micro_batches fills them, and `plan --data/--fill/--json`."""

import json
import math
import random
from pathlib import Path

import pytest

from verl_cluster.cli import main
from verl_cluster.config.job import load_job
from verl_cluster.errors import ConfigError
from verl_cluster.submit.data_lengths import gather_lengths
from verl_cluster.placement import parse_gpus, plan_job
from verl_cluster.placement.length_plans import plan_lengths
from verl_cluster.placement.lengths import TOTAL_SWING, micro_tokens, resolve_lengths

ROOT = Path(__file__).resolve().parents[2]
FIX = ROOT / "tests/fixtures/prompts"
TOK = str(FIX / "tokenizer")
SEQ_BALANCE = str(ROOT / "tests/fixtures/verl_recipes/run_qwen2-7b_seq_balance.yaml")
GRPO = str(ROOT / "launch/gsm8k_grpo.yaml")
H100X8 = "1x8xH100-80GB"  # the recipe's own hardware (placement.gpus)


@pytest.fixture(autouse=True)
def own_home(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # the logged-lengths store is read from ~


def _job(path=SEQ_BALANCE, *extra):
    return load_job(path, [f"model.path={TOK}", *extra])


# ---- where each length comes from ----
def test_nothing_known_is_the_worst_case_said_plainly():
    L = resolve_lengths(_job())
    assert (L.prompt_mean, L.response_mean, L.fill, L.known) == (4096, 4096, 1.0, False)
    assert L.prompt_source.startswith("worst case: data.max_prompt_length")
    assert L.response_source.startswith("worst case: data.max_response_length (responses unknown: state "
                                        "placement.mean_response_tokens")


def test_measured_prompts_and_stated_responses():
    job = _job(SEQ_BALANCE, "placement.mean_response_tokens=500")
    L, notes = gather_lengths(job, data=[str(FIX / "gsm8k_train.parquet")], logged=None)
    assert notes == [] and L.prompts is not None and L.prompts.sampled == 2000
    assert L.prompt_mean == pytest.approx(L.prompts.mean) and L.response_mean == 500
    assert L.prompt_source.startswith("measured on all 2000 rows of") and "with the tokenizer of" in L.prompt_source
    assert L.response_source.startswith("placement.mean_response_tokens in ")
    assert L.fill == pytest.approx((L.prompts.mean + 500) / 8192) and L.known
    d = L.to_dict()
    assert d["prompt"]["measured"]["p95"] == L.prompts.p95 and d["response"]["source"] == L.response_source


def test_logged_lengths_of_an_earlier_run_are_used_and_capped_at_the_limits():
    logged = {"job": "run-qwen2-7b-seq-balance", "submission_id": "raysubmit_1", "steps": 3,
              "prompt_length_mean": 120.0, "response_length_mean": 9000.0}
    L = resolve_lengths(_job(), logged=logged)
    assert L.prompt_mean == 120 and L.response_mean == 4096  # a mean above the limit is capped
    assert "prompt_length/mean logged by run raysubmit_1" in L.prompt_source
    assert "response_length/mean logged by run raysubmit_1" in L.response_source and "3 steps" in L.response_source
    stated = resolve_lengths(_job(SEQ_BALANCE, "placement.mean_response_tokens=300"), logged=logged)
    assert stated.response_mean == 300  # what the user states wins over the log


def test_a_stated_fill_replaces_both_means():
    L = resolve_lengths(_job(SEQ_BALANCE, "placement.fill=0.07"))
    assert L.fill == 0.07 and L.fill_source.startswith("placement.fill in ")
    assert resolve_lengths(_job(SEQ_BALANCE, "placement.fill=0.07"), fill=0.2).fill == 0.2  # --fill wins
    assert "as placement.fill in" in L.line()


def test_over_long_prompts_count_as_verl_treats_them():
    data = [str(FIX / "overlong_train.parquet")]
    kept, _ = gather_lengths(load_job(GRPO, [f"model.path={TOK}"]), data=data, logged=None)  # filters them
    cut, _ = gather_lengths(load_job(GRPO, [f"model.path={TOK}", "data.filter_overlong_prompts=false"]), data=data,
                            logged=None)
    assert kept.prompt_mean == pytest.approx(kept.prompts.mean_kept)
    assert cut.prompt_mean == pytest.approx(cut.prompts.mean_truncated)
    assert cut.prompt_mean > kept.prompt_mean


@pytest.mark.parametrize("item,msg", [
    ("fill: 1.5", "placement.fill must be in (0, 1], got 1.5"),
    ("mean_response_tokens: 5000", "placement.mean_response_tokens must be between 1 and "
                                   "data.max_response_length (4096), got 5000"),
    ("mean_response_tokens: 0", "got 0"),
])
def test_bad_placement_lengths_name_the_field_file_and_line(tmp_path, item, msg):
    text = Path(SEQ_BALANCE).read_text().replace("  gpus: 1x8xH100-80GB\n", f"  gpus: 1x8xH100-80GB\n  {item}\n")
    f = tmp_path / "job.yaml"
    f.write_text(text)
    line = text.splitlines().index(f"  {item}") + 1
    with pytest.raises(ConfigError) as e:
        plan_job(load_job(f), parse_gpus(H100X8))
    assert e.value.message.startswith(f"{f}:{line}: ") and msg in e.value.message


def test_bad_placement_lengths_are_exit_2_in_plan(capsys):
    assert main(["plan", SEQ_BALANCE, "placement.fill=0", "--json"]) == 2
    assert "placement.fill must be in (0, 1], got 0" in capsys.readouterr().err
    assert main(["plan", SEQ_BALANCE, "--data", str(FIX / "missing.parquet")]) == 2
    assert "--data" in capsys.readouterr().err


# ---- token budgets: the budget caps a micro batch, the rank's real tokens fill it ----
def test_micro_tokens_as_verl_splits_a_rank_batch():
    assert micro_tokens(30_000, 98_304, 8192) == 30_000  # one micro batch: the rank's tokens
    # 134,700 tokens under a 98,304 budget: verl makes 2 balanced micro batches, not one full one
    assert micro_tokens(134_700, 98_304, 8192) == pytest.approx(134_700 / 2 + 8192)
    # a step 15% shorter fits in one micro batch filled to the budget: planned at the budget
    assert micro_tokens(110_000, 98_304, 8192) == 98_304
    rng = random.Random(0)
    for _ in range(2000):
        budget = rng.randint(1000, 100_000)
        total, longest = rng.uniform(1, 20 * budget), rng.uniform(1, budget)
        got = micro_tokens(total, budget, longest)
        k = math.ceil(total / budget - 1e-9)
        assert got <= budget and got >= min(total, budget) / max(1, k) - 1e-6
        if total <= budget:
            assert got == total
        elif total * (1 - TOTAL_SWING) <= (k - 1) * budget:
            assert got == budget


def test_the_critic_update_holds_the_balanced_tokens_at_known_lengths():
    """verl's run_qwen2-7b_seq_balance.sh: critic budget 98,304 tokens, 64 sequences per GPU per mini batch."""
    job = _job()
    p = plan_job(job, parse_gpus(H100X8), fill=0.25)
    ph = next(ph for r in p.roles for ph in r.phases if ph.phase == "critic update")
    total = 64 * 8192 * 0.25
    assert ph.tokens == int(micro_tokens(total, 98_304, 8192)) < 98_304
    worst = plan_job(job, parse_gpus(H100X8))
    assert next(ph for r in worst.roles for ph in r.phases if ph.phase == "critic update").tokens == 98_304


def test_fits_at_fill_holds_at_every_shorter_average():
    job = _job()
    worst = plan_job(job, parse_gpus(H100X8))
    assert worst.fits_at_fill == 0.1
    for f in (0.05, 0.1):
        assert plan_job(job, parse_gpus(H100X8), fill=f).feasible


# ---- two plans ----
def test_seq_balance_on_gsm8k_fits_at_the_measured_lengths_with_the_warning():
    job = _job(SEQ_BALANCE, "placement.mean_response_tokens=500")
    L, _ = gather_lengths(job, data=[str(FIX / "gsm8k_train.parquet")], logged=None)
    lp = plan_lengths(job, parse_gpus(H100X8), L)
    assert lp.verdict == "fits-at-known-lengths" and not lp.worst.feasible and lp.chosen is lp.known
    assert lp.chosen.feasible and lp.chosen.fill == pytest.approx(L.fill)
    w = lp.warning()
    assert w.startswith("planned at the lengths known, not the worst case: prompts 71 tokens on average")
    assert "responses 500" in w and "every sequence 4096+4096 tokens) critic update would not fit" in w
    assert "`submit --watch` resumes the run" in w
    d = lp.chosen.to_dict()
    assert d["lengths"]["prompt"]["source"].startswith("measured") and d["worst_case"]["feasible"] is False
    assert d["worst_case"]["binding"].startswith("critic update memory")


def test_seq_balance_on_math_long_prompts_is_refused_with_both_numbers():
    job = _job(SEQ_BALANCE, "placement.mean_response_tokens=500")
    L, _ = gather_lengths(job, data=[str(FIX / "math_long_train.parquet")], logged=None)
    lp = plan_lengths(job, parse_gpus(H100X8), L)
    assert lp.verdict == "does-not-fit" and lp.warning() == ""
    r = lp.refusal()
    assert r.startswith("does not fit at the worst case (8192 tokens a sequence): critic update memory: ")
    assert f"nor at the lengths known — prompts {L.prompt_mean:.0f} tokens on average" in r
    assert r.count("critic update memory") == 2 and "GiB/GPU" in r


def test_a_job_that_fits_at_the_worst_case_runs_that_plan():
    job = load_job(GRPO, [f"model.path={TOK}"])
    L, _ = gather_lengths(job, data=[str(FIX / "gsm8k_train.parquet")], logged=None)
    lp = plan_lengths(job, parse_gpus("1x1xH100-80GB"), L)
    assert lp.verdict == "fits" and lp.chosen is lp.worst and lp.known is not None and lp.known.feasible
    assert lp.warning() == lp.refusal() == ""


def test_responses_unknown_refusal_says_what_to_state():
    lp = plan_lengths(_job(), parse_gpus(H100X8), resolve_lengths(_job()))
    assert lp.known is None and lp.verdict == "does-not-fit"
    assert "nothing is known of the real lengths" in lp.refusal()
    assert lp.refusal_hint().startswith("if your responses are shorter, state placement.mean_response_tokens")


# ---- the CLI ----
def test_plan_data_json_carries_the_lengths_and_their_sources(capsys):
    rc = main(["plan", SEQ_BALANCE, f"model.path={TOK}", "placement.mean_response_tokens=500",
               "--data", str(FIX / "gsm8k_train.parquet"), "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert rc == 0 and doc["feasible"] and doc["verdict"] == "fits-at-known-lengths"
    L = doc["lengths"]
    assert L["prompt"]["measured"]["sampled"] == 2000 and L["prompt"]["measured"]["method"] == "tokenizer"
    assert L["response"] == {"mean": 500.0, "source": L["response"]["source"]}
    assert L["response"]["source"].startswith("placement.mean_response_tokens")
    assert doc["worst_case"]["feasible"] is False and doc["settings"]["fill"] == pytest.approx(L["fill"], abs=1e-4)


def test_plan_text_says_both_verdicts(capsys):
    rc = main(["plan", SEQ_BALANCE, f"model.path={TOK}", "placement.mean_response_tokens=500",
               "--data", str(FIX / "math_long_train.parquet"), "--brief"])
    out = capsys.readouterr().out
    assert rc == 1
    assert "worst case (4096+4096 tokens every sequence): does not fit — critic update memory" in out
    assert "at these lengths (fill 0.2" in out and out.index("lengths") < out.index("binding constraint")


def test_plan_fill_shows_the_plan_at_that_fill(capsys):
    assert main(["plan", SEQ_BALANCE, "--fill", "0.07", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["settings"]["fill"] == 0.07 and doc["lengths"]["fill_source"] == "--fill"
    assert main(["plan", GRPO, "--gpus", "1x1xH100-80GB", "--fill", "0.5", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["settings"]["fill"] == 0.5  # asked for, though the worst case fits


def test_without_padding_removal_the_lengths_do_not_lower_memory():
    job = _job(SEQ_BALANCE, "placement.mean_response_tokens=500", "actor_rollout_ref.model.use_remove_padding=false",
               "critic.model.use_remove_padding=false")
    L, _ = gather_lengths(job, data=[str(FIX / "gsm8k_train.parquet")], logged=None)
    lp = plan_lengths(job, parse_gpus(H100X8), L)
    assert lp.padded and lp.verdict == "does-not-fit" and lp.known.binding == lp.worst.binding
    assert lp.refusal().endswith("(without use_remove_padding every sequence is padded to max_prompt_length + "
                                 "max_response_length, so shorter real lengths do not lower memory)")
    assert not plan_lengths(_job(), parse_gpus(H100X8), L).padded


def test_compare_lengths_script_on_a_recorded_verl_run(tmp_path, capsys):
    """scripts/bench/compare_lengths.py: `plan --data --json` next to the recorded H100 GRPO run's logged lengths (the same
    synthetic GSM8K generator and tokenizer)."""
    import subprocess
    import sys

    assert main(["plan", GRPO, f"model.path={TOK}", "--data", str(FIX / "gsm8k_train.parquet"),
                 "--gpus", "1x1xH100-80GB", "--json"]) == 0
    plan_json = tmp_path / "plan.json"
    plan_json.write_text(capsys.readouterr().out)
    log = ROOT / "tests/fixtures/verl_logs/h100_grpo_0.5b_succeeded.log"
    r = subprocess.run([sys.executable, str(ROOT / "scripts/bench/compare_lengths.py"), str(log), str(plan_json), "--json"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    rows = {row["quantity"]: row for row in json.loads(r.stdout)["rows"]}
    prompt, response = rows["prompt tokens (mean)"], rows["response tokens (mean)"]
    assert prompt["steps"] == 3 and abs(prompt["error"]) < 0.02 and prompt["source"].startswith("measured")
    assert response["predicted"] == 1024 and response["source"].startswith("worst case")  # nothing known of them
    assert response["logged_mean"] == pytest.approx((481.59 + 444.69 + 450.81) / 3, abs=0.05)
    bad = subprocess.run([sys.executable, str(ROOT / "scripts/bench/compare_lengths.py"), str(plan_json), str(plan_json)],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "no verl step line" in bad.stderr


# ---- plan without --data reads the job's own training files, as submit does on the head node ----
def _verl_line(*extra):
    return ["--", "python3", "-m", "verl.trainer.main_ppo", "algorithm.adv_estimator=grpo",
            f"actor_rollout_ref.model.path={TOK}", "data.max_prompt_length=4096", "data.max_response_length=4096",
            *extra]


def test_plan_of_a_verl_line_measures_its_train_files_here_as_plan_data_does(capsys):
    train = str(FIX / "gsm8k_train.parquet")
    args = ["plan", "--gpus", H100X8, "model.catalog=qwen2.5-7b", "--json"]
    assert main(args + _verl_line(f"data.train_files=[{train}]")) == 0
    line = json.loads(capsys.readouterr().out)["lengths"]["prompt"]
    assert main(args[:-1] + ["--data", train, "--json"] + _verl_line()) == 0
    given = json.loads(capsys.readouterr().out)["lengths"]["prompt"]
    assert line["measured"]["sampled"] == 2000 and line["measured"]["method"] == "tokenizer"
    assert line == given  # the same prompts, measured the same way


def test_plan_expands_the_jobs_tilde_paths_here_and_says_when_the_files_are_elsewhere(capsys, tmp_path):
    import shutil

    home = tmp_path / "home"
    (home / "data").mkdir(parents=True)
    shutil.copy(FIX / "gsm8k_train.parquet", home / "data/train.parquet")
    line = ["plan", "--gpus", H100X8, "model.catalog=qwen2.5-7b", "--brief"]
    assert main(line + _verl_line("data.train_files=[~/data/train.parquet]")) == 0
    out = capsys.readouterr()
    assert "prompts 71 tokens on average (p50 70, p95 78, max 81), measured on all 2000 rows of " \
           f"{home / 'data/train.parquet'}" in " ".join(out.out.split())
    assert main(line + _verl_line("data.train_files=[~/data/elsewhere.parquet]")) == 0
    err = " ".join(capsys.readouterr().err.split())
    assert "note: prompt lengths not measured: ~/data/elsewhere.parquet not on this machine (`plan -c CLUSTER` " \
           "measures them on its head node, as submit does, or --data FILE.parquet)" in err
