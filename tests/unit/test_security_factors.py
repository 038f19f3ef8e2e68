"""A factors file is input like any other: its numbers bounded, its fields of their type, and only a regular file
is read (a FIFO named as the factors file hung `plan`)."""

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from verl_cluster.errors import ConfigError
from verl_cluster.placement.factors import read_factors

ROOT = Path(__file__).resolve().parents[2]


def refused(tmp_path, doc) -> ConfigError:
    p = tmp_path / "f.json"
    p.write_text(doc if isinstance(doc, str) else json.dumps(doc))
    with pytest.raises(ConfigError) as e:
        read_factors(str(p))
    assert str(p) in e.value.message
    return e.value


@pytest.mark.parametrize("factor", [1e308, "1e308", 1e-300, 1000, 0.001])
def test_a_factor_out_of_any_real_range_is_refused(tmp_path, factor):
    text = json.dumps({"factors": {"gen": {"factor": 1.0, "runs": 3}}}).replace("1.0", str(factor))
    e = refused(tmp_path, text)
    assert "factors.gen.factor" in e.message


@pytest.mark.parametrize("entry, field", [
    ({"factor": 1.2, "runs": 3, "enough": "no"}, "factors.gen.enough"),
    ({"factor": 1.2, "runs": 3, "enough": 1}, "factors.gen.enough"),
    ({"factor": 1.2, "runs": 10**30}, "factors.gen.runs"),
    ({"factor": 1.2, "runs": 3.0}, "factors.gen.runs"),
])
def test_fields_must_have_their_type(tmp_path, entry, field):
    assert field in refused(tmp_path, {"factors": {"gen": entry}}).message


def test_plausible_factors_still_apply(tmp_path):
    p = tmp_path / "f.json"
    p.write_text(json.dumps({"factors": {"gen": {"factor": 19.5, "runs": 3, "enough": True},
                                         "adv": {"factor": 0.06, "runs": 1, "enough": False}, "host_gib": 1.1}}))
    assert read_factors(str(p)) == {"gen": (19.5, 3, True), "adv": (0.06, 1, False), "host_gib": (1.1, None, True)}


def test_a_fifo_or_a_device_is_not_read(tmp_path):
    fifo = tmp_path / "f.json"
    os.mkfifo(fifo)
    got = []

    def read(path):
        try:
            read_factors(str(path))
        except ConfigError as e:
            got.append(e.message)

    for path in (fifo, Path("/dev/zero")):
        t = threading.Thread(target=read, args=(path,), daemon=True)
        t.start()
        t.join(10)
        assert got and "not a regular file" in got[-1] and str(path) in got[-1], (path, got)


def test_plan_json_of_a_huge_factor_is_exit_2_not_infinity(tmp_path):
    p = tmp_path / "f.json"
    p.write_text('{"factors": {"gen": {"factor": 1e308, "runs": 3}}}')
    r = subprocess.run([sys.executable, "-m", "verl_cluster", "plan", "launch/gsm8k_grpo.yaml", "--gpus", "1x1xH100",
                        "--factors", str(p), "--json"], capture_output=True, text=True, cwd=ROOT, timeout=120,
                       env={**os.environ, "HOME": str(tmp_path)})
    assert r.returncode == 2 and "Infinity" not in r.stdout and "Traceback" not in r.stderr, r.stderr
