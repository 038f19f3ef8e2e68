"""The grid's collector-pause watch (scripts/calibration/gc_pauses.py): installed as a sitecustomize, a real Python
process logs its full collections, and the summary reads them back."""

import os
import subprocess
import sys
from pathlib import Path

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
