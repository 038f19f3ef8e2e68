"""The lengths a verl run logged, kept per job name after `submit` follows it, and used by the next plan."""

import json
from pathlib import Path

import pytest

from verl_cluster.config.job import load_job
from verl_cluster.records import job_records, length_store
from verl_cluster.submit.data_lengths import gather_lengths
from verl_cluster.verl_logs.verl_log import VerlProgress

ROOT = Path(__file__).resolve().parents[2]
LOG = ROOT / "tests/fixtures/verl_logs/h100_grpo_0.5b_succeeded.log"


@pytest.fixture(autouse=True)
def own_home(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))


def _progress(text: str) -> VerlProgress:
    prog = VerlProgress()
    for i in range(0, len(text), 1000):  # in chunks, as the log stream arrives
        prog.feed(text[i:i + 1000])
    prog.flush()
    return prog


def test_a_recorded_run_gives_its_prompt_mean_and_largest_response_mean():
    got = _progress(LOG.read_text()).lengths()
    assert got["steps"] == 3
    assert got["prompt_length_mean"] == pytest.approx((71.328125 + 70.234375 + 69.984375) / 3, abs=0.05)
    assert got["response_length_mean"] == pytest.approx(481.6, abs=0.05)  # the largest of 481.6, 444.7, 450.8
    assert got["response_length_mean_avg"] == pytest.approx((481.59 + 444.69 + 450.81) / 3, abs=0.05)
    assert got["response_length_max"] == 1024 and 0 < got["response_length_clip_ratio"] < 1
    assert VerlProgress().lengths() == {"steps": 0}


def test_submits_follow_records_them_under_the_job_name_and_the_next_plan_uses_them():
    job_records.record("raysubmit_abc", str(ROOT / "cluster_configs/local.yaml"), "local", "gsm8k-grpo")
    assert length_store.remember_run("raysubmit_abc", _progress(LOG.read_text()))
    doc = length_store.lookup("gsm8k-grpo")
    assert doc["submission_id"] == "raysubmit_abc" and doc["steps"] == 3
    assert json.loads((Path.home() / ".verl-cluster/lengths/gsm8k-grpo.json").read_text()) == doc
    job = load_job(ROOT / "launch/gsm8k_grpo.yaml")
    L, notes = gather_lengths(job)
    assert notes == [] and L.response_mean == pytest.approx(481.6, abs=0.05)
    assert L.prompt_mean == pytest.approx(70.5, abs=0.1)
    assert "logged by run raysubmit_abc of job gsm8k-grpo" in L.response_source
    assert L.fill == pytest.approx((70.5 + 481.6) / 1536, abs=1e-3)


def test_nothing_is_recorded_without_a_step_or_a_job_record():
    assert not length_store.remember_run("raysubmit_abc", _progress(LOG.read_text()))  # submit recorded no job
    job_records.record("raysubmit_x", str(ROOT / "cluster_configs/local.yaml"), "local", "j")
    assert not length_store.remember_run("raysubmit_x", _progress("no step lines here\n"))
    assert length_store.lookup("j") is None and length_store.lookup("gsm8k-grpo") is None


def test_job_names_are_plain_file_names():
    assert length_store.record("../../etc/x y", {"steps": 1, "response_length_mean": 5.0}, "s")
    assert [p.name for p in (Path.home() / ".verl-cluster/lengths").iterdir()] == ["_.._etc_x_y.json"]
    assert length_store.lookup("../../etc/x y")["response_length_mean"] == 5.0
    assert length_store.lookup("other") is None
