"""scripts/calibration/calib_from_runs.py: a run folder as scripts/gpu/gpu_e2e.sh leaves it, rebuilt from the recorded H100 runs
(their plan, submitted command and verl log), gives back the calibration entries already in
tests/fixtures/verl_runs/calibration_runs.json, and a real host-memory recording lines up with the log's steps."""

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from verl_cluster.placement.check_run import measured
from tests.harness.scripts import load_script

ROOT = Path(__file__).resolve().parents[2]
FIX = ROOT / "tests/fixtures"
C = load_script("scripts/calibration/calib_from_runs.py")
RUNS = json.loads((FIX / "verl_runs/calibration_runs.json").read_text())["runs"]
# entry name -> (recorded summary with the plan and submitted command, its log fixture, run name in gpu_e2e.sh)
RECORDED = {"grpo_0.5b": ("h100_grpo_0.5b.json", "h100_grpo_0.5b_succeeded.log", "grpo05"),
            "ppo_0.5b": ("h100_ppo_0.5b.json", "h100_ppo_0.5b_succeeded.log", "ppo05")}


@pytest.fixture(autouse=True)
def _home(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))


def run_folder(logs: Path, entry: str) -> str:
    """$LOGS as gpu_e2e.sh's run_verl leaves it: plan-NAME.json and NN-submit-NAME.log (command line + job log)."""
    summary, log, name = RECORDED[entry]
    d = json.loads((FIX / "verl_runs" / summary).read_text())
    logs.mkdir(exist_ok=True)
    plan = {k: d[k] for k in ("model", "hardware", "settings", "overrides")}
    (logs / f"plan-{name}.json").write_text(json.dumps(plan))
    cmd = " ".join(["$ python3 -m verl_cluster submit", d["submitted"]["job"], *d["submitted"]["args"], "--json"])
    (logs / f"08-submit-{name}.log").write_text(cmd + "\n" + (FIX / "verl_logs" / log).read_text())
    return name


def steps_of(text: str) -> dict:
    return C.progress(text.splitlines()).steps


@pytest.mark.parametrize("entry", sorted(RECORDED))
def test_a_recorded_run_gives_back_its_entry(entry, tmp_path):
    name = run_folder(tmp_path / "logs", entry)
    want = RUNS[entry]
    got, lines = C.entry_for(tmp_path / "logs", name, host_role=want["host"], time_role=want["time"])
    assert got["args"][0] == want["args"][0] == "model.catalog=qwen2.5-0.5b"
    assert sorted(got["args"]) == sorted(want["args"])
    for key in ("job", "flash_attn", "first_steps", "host", "time"):
        assert got[key] == want[key], key
    assert got["logs"] == [f"h100_{name}.log"] and "sampled" not in got and "tiny_model" not in got
    # the log fixture it writes holds what the replay reads: the same measurements as the recorded log
    original = (FIX / "verl_logs" / want["logs"][0]).read_text()
    assert measured(steps_of("\n".join(lines)), [1]) == measured(steps_of(original), [1])
    assert len(lines) <= len(original.splitlines())


def test_write_adds_the_entry_and_the_replay_reads_it(tmp_path):
    name = run_folder(tmp_path / "logs", "grpo_0.5b")
    runs, logs_dir = tmp_path / "runs.json", tmp_path / "verl_logs"
    logs_dir.mkdir()
    runs.write_text((FIX / "verl_runs/calibration_runs.json").read_text())
    assert C.main([str(tmp_path / "logs"), name, "--role", "fit", "--entry-name", "fit-grpo05-again", "--write",
                   "--runs-file", str(runs), "--logs-dir", str(logs_dir), "--json"]) == 0
    doc = json.loads(runs.read_text())
    assert set(doc["runs"]) == set(RUNS) | {"fit-grpo05-again"}
    for key, entry in RUNS.items():  # the entries already there are kept as they were
        assert doc["runs"][key] == entry
    assert doc["_comment"] == json.loads((FIX / "verl_runs/calibration_runs.json").read_text())["_comment"]
    new = doc["runs"]["fit-grpo05-again"]
    assert (logs_dir / new["logs"][0]).exists()
    rows = {r["what"]: r for r in C.replay_pairs(new, logs_dir, tmp_path)}
    # the run as the model of the fourth refit predicts it (68.50 s by the third's, 68.58 s by the model of 2026-11-29)
    assert rows["time step (s)"]["predicted"] == pytest.approx(69.48, abs=0.01)
    assert rows["time step (s)"]["measured"] == pytest.approx(71.59, abs=0.01)
    assert rows["host RAM per node (GiB)"]["measured"] == pytest.approx(29.75, abs=0.01)


def test_the_host_recording_is_lined_up_with_the_steps(tmp_path):
    """A real recording of this machine's RAM (the sampler without a GPU) and the run's step lines stamped inside
    it, as the sampler's --log-out copy has them."""
    logs = tmp_path / "logs"
    name = run_folder(logs, "grpo_0.5b")
    stop = tmp_path / "stop"
    p = subprocess.Popen([sys.executable, str(ROOT / "scripts/gpu/gpu_mem_sampler.py"), str(logs / f"nvml-{name}.jsonl"),
                          "--no-gpu", "--host-interval", "0.2", "--stop-file", str(stop)])
    samples = logs / f"nvml-{name}.jsonl"
    deadline = time.time() + 20
    while time.time() < deadline and not (samples.exists() and samples.read_text().count("\n")):
        time.sleep(0.05)
    t0 = time.time()  # after the first host sample
    time.sleep(1.2)
    log = (FIX / "verl_logs/h100_grpo_0.5b_succeeded.log").read_text().splitlines()
    stamped = [f"{t0 + 0.1 + 0.15 * i:.2f} {line}" for i, line in enumerate(log)]
    (logs / f"log-{name}.txt").write_text("\n".join(stamped) + "\n")
    stop.touch()
    assert p.wait(timeout=20) == 0
    entry, _ = C.entry_for(logs, name, host_role="fit", time_role="fit")
    s = entry["sampled"]
    assert s["psutil_used_is"] in ("total - available", "total - free - buffers - cached")
    assert 0 < s["baseline_used_gib"] <= s["peak_used_gib"] and 0 < s["min_available_gib"]
    assert s["peak_used_in_steps_gib"] <= s["peak_used_gib"]
    assert [a["step"] for a in s["at_steps"]] == [1, 2, 3]
    assert [a["verl_gib"] for a in s["at_steps"]] == pytest.approx([29.50, 29.66, 29.75], abs=0.01)
    for a in s["at_steps"]:
        assert a["used_available_gib"] > 0 and a["used_legacy_gib"] > 0
    assert "other" in s["roles_peak_gib"] and s["roles_peak_gib"]["other"]["rss"] > 0


def test_missing_files_and_runs_without_steps_are_named(tmp_path, capsys):
    assert C.main([str(tmp_path), "fit-x"]) == 2
    assert "plan-fit-x.json: missing" in capsys.readouterr().err
    name = run_folder(tmp_path / "logs", "grpo_0.5b")
    log = next((tmp_path / "logs").glob("*-submit-*.log"))
    log.write_text(log.read_text().splitlines()[0] + "\nonly start-up lines\n")
    assert C.main([str(tmp_path / "logs"), name, "--role", "fit"]) == 2
    assert "no `step:N - ` metrics lines" in capsys.readouterr().err
    # one good run and one the budget skipped: the good one is kept, the other named, exit 1
    ok = run_folder(tmp_path / "logs", "ppo_0.5b")
    assert C.main([str(tmp_path / "logs"), ok, "hold-never-ran", "--role", "fit"]) == 1
    out = capsys.readouterr()
    assert out.out.startswith(f"{ok}: ") and "plan-hold-never-ran.json: missing" in out.err
    assert "left out: hold-never-ran" in out.err
    with pytest.raises(C.RunFilesError, match="say --role"):
        C.role_for("grpo05", None)


def test_a_pinned_attention_takes_flash_attn_from_the_install_step(tmp_path):
    plan = {"settings": {"attn_implementation": "sdpa"}}
    steps = tmp_path / "steps.log"
    pinned = ["+actor_rollout_ref.model.override_config.attn_implementation=sdpa"]
    assert C.flash_attn_of(plan, [], steps, "auto") is False
    with pytest.raises(C.RunFilesError, match="--flash-attn"):
        C.flash_attn_of(plan, pinned, steps, "auto")
    steps.write_text("03-flash-attn rc=0 20.1s (limit 180s)\n")
    assert C.flash_attn_of(plan, pinned, steps, "auto") is True
    assert C.flash_attn_of(plan, pinned, steps, "no") is False


def test_roles_at_a_step_take_the_last_sample_before_it_with_every_pss():
    role = lambda rss, pss, shmem=0: {"n": 1, "rss": rss, "anon": rss, "shmem": shmem, "pss": pss}  # noqa: E731
    host = [(10.0, {"roles": {"worker_dict": role(9000, 8000, 5120), "driver": role(900, 540)}}),
            (11.0, {"roles": {"worker_dict": role(9100, None, 5120), "driver": role(900, 540)}}),  # no PSS read
            (20.0, {"roles": {"worker_dict": role(100, 50), "driver": role(900, 540)}})]
    got = C.roles_at(host, 11.5)
    assert got == {"roles_pss_gib": {"driver": 0.53, "worker_dict": 7.81}, "roles_shmem_gib": {"worker_dict": 5.0}}
    assert C.roles_at(host, 9.5) == {}  # only samples up to the step line: the one after may be the job exiting
    assert C.roles_at(host, 30.0) == {}  # nothing with every PSS within 5 s
