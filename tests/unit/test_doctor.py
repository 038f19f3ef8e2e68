"""doctor: local verdicts from recorded facts, and the real probe on this (GPU-less) machine."""

import json
import os
import subprocess
import sys
from pathlib import Path

from verl_cluster.diagnostics.doctor import diagnose
from verl_cluster.facts.model import NodeFacts, from_json

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "facts"


def test_doctor_on_recorded_broken_flash_attn_is_not_ok():
    r = diagnose(from_json(NodeFacts, (FIXTURES / "broken_flash_attn.json").read_text()))
    assert not r.ok
    assert r.problems[0].severity == "error" and "flash-attn" in r.problems[0].what
    assert r.to_json()["facts"]["gpus"][0]["name"] == "NVIDIA H200"


def test_doctor_json_on_this_machine():
    p = subprocess.run([sys.executable, "-m", "verl_cluster", "doctor", "--json", "--fast"], capture_output=True,
                       text=True, timeout=120, cwd=ROOT)
    assert p.returncode in (0, 1), p.stderr
    data = json.loads(p.stdout)
    assert data["ok"] == (p.returncode == 0)
    f = data["facts"]
    assert f["python_version"] == ".".join(map(str, sys.version_info[:3]))
    assert any(i["name"] == "lo" and "127.0.0.1/8" in i["addresses"] for i in f["interfaces"])
    assert f["host_python_ms"] > 0  # the host's speed, which hosts of one CPU model differ on
    if not f["gpus"]:  # CI machines: says why, as a warning
        assert f["nvml_error"] and any(p["what"].startswith("no GPUs") for p in data["problems"])


def test_record_facts_script_needs_only_the_stdlib():
    # -S -I: no site-packages, no user paths: the script must not import the package's dependencies
    p = subprocess.run([sys.executable, "-S", "-I", str(ROOT / "scripts" / "calibration" / "record_facts.py"), "--fast",
                        "--head-ip", "127.0.0.1"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    data = json.loads(p.stdout)
    assert data["recorded"].startswith("20") and data["route_to_head"] == "lo"
    assert from_json(NodeFacts, p.stdout).python_version == data["python_version"]


def test_doctor_table_says_the_hosts_speed():
    p = subprocess.run([sys.executable, "-m", "verl_cluster", "doctor", "--fast"], capture_output=True, text=True,
                       timeout=120, cwd=ROOT, env={**os.environ, "COLUMNS": "200"})
    assert p.returncode in (0, 1), p.stderr
    assert "host speed" in p.stdout and "ms for a fixed piece of Python work" in p.stdout
