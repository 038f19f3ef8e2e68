"""The suite never writes into the user's home: it runs with a HOME of its own (tests/conftest.py), and the
session fails if the user's ~/.verl-cluster or ~/.ssh changed during the run."""

import os
import subprocess
import sys
from pathlib import Path

from verl_cluster.records import job_records


def test_tests_run_with_a_home_that_is_not_the_users(real_home):
    assert Path(os.environ["HOME"]).resolve() != real_home.resolve()
    assert Path(os.environ["HOME"]).name.startswith("vc-test-home-")


def test_job_records_land_under_the_suite_home(real_home):
    job_records.record("raysubmit_home_check", "/nonexistent/cluster.yaml", "home-check", "j")
    assert job_records.lookup("raysubmit_home_check")["cluster"] == "home-check"
    where = job_records.jobs_dir().resolve()
    assert Path(os.environ["HOME"]).resolve() in where.parents
    assert real_home.resolve() not in where.parents


def test_the_cli_a_test_starts_prints_200_columns_wide():
    """tests/conftest.py sets COLUMNS for the session's environment, so a CLI started with it (the integration
    helpers pass os.environ on) prints its tables and one-line messages whole on both streams; rich alone would
    wrap stderr at 80 when piped."""
    show = "from verl_cluster.cli.output import err, out; print(out.width, err.width)"
    r = subprocess.run([sys.executable, "-c", show], capture_output=True, text=True, timeout=60)  # inherits os.environ
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split() == ["200", "200"]
