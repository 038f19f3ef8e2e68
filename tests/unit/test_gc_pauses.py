"""The grid's collector-pause watch (scripts/calibration/gc_pauses.py): installed as a sitecustomize, a real Python
process logs its full collections, and the summary reads them back."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts" / "calibration"))

import gc_pauses  # noqa: E402

HEAP = "import gc\nx = [[i] for i in range(200000)]\nfor a in x: a.append(a)\ngc.collect(2)\n"


def _run(tmp_path: Path, env: dict) -> subprocess.CompletedProcess:
    site = tmp_path / "site"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text((ROOT / "scripts/calibration/gc_pauses.py").read_text())
    return subprocess.run([sys.executable, "-c", HEAP], env={**os.environ, "PYTHONPATH": str(site), **env},
                          capture_output=True, text=True, timeout=120)


def test_a_process_logs_its_full_collection_and_the_summary_reads_it(tmp_path):
    out = tmp_path / "gc"
    out.mkdir()
    r = _run(tmp_path, {"GC_PAUSES_DIR": str(out), "GC_PAUSES_MIN_S": "0"})
    assert r.returncode == 0, r.stderr
    logs = list(out.glob("*.jsonl"))
    assert len(logs) == 1
    text = gc_pauses.summary(str(out))
    assert "processes" in text and " gen 2 " in text and "freed" in text
    assert gc_pauses.summary(str(out), since=4102444800).startswith("gc pauses >= ")  # after 2100: none
    assert "none" in gc_pauses.summary(str(out), since=4102444800)


def test_without_its_folder_the_watch_does_nothing(tmp_path):
    r = _run(tmp_path, {"GC_PAUSES_DIR": "", "GC_PAUSES_MIN_S": "0"})
    assert r.returncode == 0 and not list(tmp_path.rglob("*.jsonl"))


def test_the_chain_installs_it_in_the_site_and_keeps_a_site_s_own(tmp_path, monkeypatch):
    import grid2_device

    monkeypatch.setattr(grid2_device, "GC_DIR", tmp_path / "gc")
    monkeypatch.delenv("GC_PAUSES_DIR", raising=False)
    site = tmp_path / "site"
    site.mkdir()
    assert "logged by every Python process" in grid2_device.gc_watch(site)
    assert "gc.callbacks.append" in (site / "sitecustomize.py").read_text()
    assert os.environ["GC_PAUSES_DIR"] == str(tmp_path / "gc")
    assert "logged" in grid2_device.gc_watch(site)  # its own file again: replaced, not refused
    (site / "sitecustomize.py").write_text("import something_of_the_users\n")
    assert "not watched" in grid2_device.gc_watch(site)
    assert (site / "sitecustomize.py").read_text() == "import something_of_the_users\n"


def test_imported_for_its_summary_it_watches_nothing(tmp_path):
    out = tmp_path / "gc"
    out.mkdir()
    code = "import gc_pauses\n" + HEAP
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "PYTHONPATH": str(ROOT / "scripts" / "calibration"),
                            "GC_PAUSES_DIR": str(out), "GC_PAUSES_MIN_S": "0"})
    assert r.returncode == 0, r.stderr
    assert not list(out.glob("*.jsonl"))


def test_with_its_freeze_flag_a_full_collection_freezes_its_survivors(tmp_path):
    out = tmp_path / "gc"
    out.mkdir()
    code = HEAP + "print(gc.get_freeze_count())\n"
    r = _run(tmp_path, {"GC_PAUSES_DIR": str(out), "GC_PAUSES_MIN_S": "0"})
    assert r.returncode == 0 and "frozen" not in (next(out.glob("*.jsonl"))).read_text()
    (out / "freeze").touch()
    site = tmp_path / "site"
    r = subprocess.run([sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": str(site),
                                                          "GC_PAUSES_DIR": str(out), "GC_PAUSES_MIN_S": "0"},
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert int(r.stdout.split()[-1]) >= 200000  # the 200,000 self-referring lists survived and were frozen
    rows = [json.loads(ln) for p in out.glob("*.jsonl") for ln in p.read_text().splitlines()]
    assert any(row.get("frozen") for row in rows)
    assert all(row["title"].startswith(sys.executable + " -c") for row in rows)  # the command line, as ps shows it


def test_the_chain_keeps_when_each_step_line_reached_the_log(tmp_path):
    import time

    import grid2_device

    from tests.harness.wait import wait_for

    log, seen = tmp_path / "submit.log", {}
    tail = grid2_device.StepTimes(log, seen)
    tail.start()
    time.sleep(0.4)  # the log does not exist yet: nothing seen, nothing raised
    with open(log, "w") as fh:
        fh.write("\x1b[36m(TaskRunnerV1 pid=7)\x1b[0m step:1 - timing_s/step:9.5\n(TaskRunnerV1 pid=7) step:2 - ti")
        fh.flush()
        wait_for(lambda: 1 in seen, 10, "step 1")  # the poll that saw step 1 saw step 2's first half too
        first = dict(seen)
        fh.write("ming_s/step:5.1\n")
        fh.flush()
        wait_for(lambda: 2 in seen, 10, "step 2")
    tail.done.set()
    tail.join(5)
    assert list(first) == [1] and sorted(seen) == [1, 2]  # a half-written line waits for its end
    assert seen[1] < seen[2] <= time.time()


def test_start_reads_only_its_own_chain_s_lines_of_steps_log(tmp_path):
    import grid2_device

    steps = tmp_path / "steps.log"
    assert grid2_device.this_chain(steps, "R") == ""
    steps.write_text("09:00 +0s chain Q (budget 1400s)\n09:01 +55s clusters up: g0 rc=0\n09:20 end\n"
                     "10:00 +0s chain R (budget 1100s)\n10:00 +11s setup: models\n")
    assert "clusters up:" not in grid2_device.this_chain(steps, "R")  # Q's setup, on the same machine, is not R's
    steps.write_text(steps.read_text() + "10:01 +56s clusters up: g0 rc=0\n")
    assert grid2_device.this_chain(steps, "R").startswith("chain R (budget") and "clusters up:" in \
        grid2_device.this_chain(steps, "R")
    # a second chain of the same batch on the machine: until its own first line, the first chain's are not its own
    since = steps.stat().st_size
    assert grid2_device.this_chain(steps, "R", since) == ""
    steps.write_text(steps.read_text() + "10:20 +0s chain R (budget 590s)\n")
    assert grid2_device.this_chain(steps, "R", since) == "chain R (budget 590s)\n"


def test_start_refuses_while_a_chain_it_started_still_runs(tmp_path, monkeypatch):
    """Batch W (2026-12-07): a second `start` beside a running chain started a second chain on the same GPU; each saw
    the other's flash-attn install and skipped its run. start now refuses while the pid it recorded is a live chain."""
    import grid2_device

    out = tmp_path / "out"
    out.mkdir()
    assert grid2_device.running_chain(out) is None  # nothing started here
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "grid2.py", "chain", "W"])
    try:
        (out / "chain.pid").write_text(f"{live.pid}\n")
        deadline = time.time() + 10  # until the child has exec'd, its /proc cmdline is still pytest's
        while grid2_device.running_chain(out) is None and time.time() < deadline:
            time.sleep(0.05)
        assert grid2_device.running_chain(out) == live.pid
        monkeypatch.setattr(grid2_device, "OUT", out)
        monkeypatch.setattr(grid2_device, "VC", tmp_path / "vc")  # were the refusal to regress: nothing real starts
        monkeypatch.setattr(grid2_device.subprocess, "Popen", None)
        with pytest.raises(SystemExit, match=rf"a chain \(pid {live.pid}\) is still running[\s\S]*kill -- -{live.pid}"):
            grid2_device.start(["W"])
    finally:
        live.kill()
        live.wait()
    assert grid2_device.running_chain(out) is None  # gone: a start may go on
    (out / "chain.pid").write_text(f"{os.getpid()}\n")  # a live process that is no chain (pids are reused)
    assert grid2_device.running_chain(out) is None
