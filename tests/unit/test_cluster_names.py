"""Clusters by name, from any directory (issue 32 items 5 and 6): -c takes an existing path first, else a cluster name
recorded here; $VERL_CLUSTER sets the default; with neither, the one cluster recorded as up, else the one-node
default shipped in the package. Records only of clusters that came up, and a way to drop one (`down --forget`,
`forget`). Each test has its own HOME and runs from a folder outside the checkout."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from verl_cluster.cli import main
from verl_cluster.cli.cluster_args import packaged_default
from verl_cluster.records import job_records

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def home(tmp_path, monkeypatch):
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("VERL_CLUSTER", raising=False)
    work = tmp_path / "elsewhere"  # not the checkout: nothing relative to it may be needed
    work.mkdir()
    monkeypatch.chdir(work)
    return home


def cluster_file(tmp_path, name: str, host: str = "localhost") -> Path:
    p = tmp_path / f"{name}.yaml"
    p.write_text(f"cluster_name: {name}\nhead:\n  host: {host}\nssh:\n  connect_timeout_s: 2\n"
                 f"security:\n  token_file: {tmp_path / (name + '-token')}\n")
    return p


def dry_up(capsys, *words) -> tuple[int, dict | None, str]:
    """`up --dry-run --json`: which cluster a command resolves to, with its overrides, and nothing started."""
    rc = main(["up", "--dry-run", "--json", *words])
    cap = capsys.readouterr()
    return rc, (json.loads(cap.out) if rc == 0 else None), cap.err


def object_store(doc: dict) -> str:
    argv = doc["nodes"][0]["argv"]
    return argv[argv.index("--object-store-memory") + 1]


def test_the_packaged_default_is_used_from_any_directory(home, capsys):
    """Before: the default was the relative cluster_configs/local.yaml, 'file not found' outside the checkout."""
    assert Path(packaged_default()).is_file() and not Path(packaged_default()).is_relative_to(Path.cwd())
    rc, doc, err = dry_up(capsys)
    assert rc == 0 and doc["cluster"] == "local", err
    assert f"cluster: local ({packaged_default()}; the default: this machine)" in err
    # the copy in the source tree is the same file
    assert (ROOT / "cluster_configs/local.yaml").read_text() == Path(packaged_default()).read_text()


def test_package_data_ships_the_default():
    text = (ROOT / "pyproject.toml").read_text()
    assert '"cluster_configs/*.yaml"' in text and Path(packaged_default()).parent.name == "cluster_configs"


def test_the_one_cluster_recorded_as_up_is_the_default_with_its_overrides(home, tmp_path, capsys):
    a = cluster_file(tmp_path, "alpha")
    job_records.record_cluster("alpha", str(a), ["ray.object_store_memory=300000000"])
    rc, doc, err = dry_up(capsys)
    assert rc == 0 and doc["cluster"] == "alpha" and "300000000" in object_store(doc), err
    assert f"cluster: alpha ({a}; the one cluster up here)" in err
    # an override given again replaces the recorded one
    rc, doc, _ = dry_up(capsys, "ray.object_store_memory=400000000")
    assert "400000000" in object_store(doc)
    # a cluster taken down is not "up": with it down and none other, the packaged default
    job_records.record_down("alpha", str(a))
    rc, doc, _ = dry_up(capsys)
    assert rc == 0 and doc["cluster"] == "local"


def test_several_up_is_an_error_that_lists_them(home, tmp_path, capsys):
    for name in ("alpha", "beta"):
        job_records.record_cluster(name, str(cluster_file(tmp_path, name)))
    rc, _, err = dry_up(capsys)
    assert rc == 2 and "2 are recorded as up here: alpha, beta" in err and "-c NAME" in err and "Traceback" not in err
    rc, doc, err = dry_up(capsys, "-c", "beta")
    assert rc == 0 and doc["cluster"] == "beta" and "cluster: beta (" in err


def test_verl_cluster_sets_the_default_as_a_name_or_a_path(home, tmp_path, capsys, monkeypatch):
    a, b = cluster_file(tmp_path, "alpha"), cluster_file(tmp_path, "beta")
    job_records.record_cluster("alpha", str(a))
    job_records.record_cluster("beta", str(b))
    monkeypatch.setenv("VERL_CLUSTER", "beta")
    rc, doc, err = dry_up(capsys)
    assert rc == 0 and doc["cluster"] == "beta" and "$VERL_CLUSTER" in err
    monkeypatch.setenv("VERL_CLUSTER", str(a))
    assert dry_up(capsys)[1]["cluster"] == "alpha"
    rc, doc, _ = dry_up(capsys, "-c", "beta")  # -c wins over the variable
    assert doc["cluster"] == "beta"
    monkeypatch.setenv("VERL_CLUSTER", "gamma")
    rc, _, err = dry_up(capsys)
    assert rc == 2 and "$VERL_CLUSTER=gamma: no such file" in err and "(recorded: alpha, beta)" in err


def test_dash_c_takes_an_existing_path_first_then_a_name(home, tmp_path, capsys):
    a = cluster_file(tmp_path, "alpha")
    job_records.record_cluster("alpha", str(a))
    other = cluster_file(Path.cwd(), "other")
    os.rename(other, Path.cwd() / "alpha")  # a file called `alpha` here: the path wins over the name
    rc, doc, _ = dry_up(capsys, "-c", "alpha")
    assert rc == 0 and doc["cluster"] == "other"
    rc, doc, _ = dry_up(capsys, "-c", str(a))
    assert doc["cluster"] == "alpha"
    rc, _, err = dry_up(capsys, "-c", "nope")
    assert rc == 2 and "`nope`: no such file, and no cluster of that name is recorded" in err
    assert "(recorded: alpha)" in err and "Traceback" not in err


def test_a_name_whose_file_is_gone_says_how_to_drop_it(home, tmp_path, capsys):
    a = cluster_file(tmp_path, "alpha")
    job_records.record_cluster("alpha", str(a))
    a.unlink()
    rc = main(["status", "-c", "alpha"])
    err = capsys.readouterr().err
    assert rc == 2 and "recorded with" in err and "no longer exists" in err and "verl-cluster forget alpha" in err


def test_every_command_names_its_cluster_on_stderr_never_on_json_stdout(home, tmp_path, capsys):
    a = cluster_file(tmp_path, "alpha", host="nonexistent.invalid")
    job_records.record_cluster("alpha", str(a))
    for argv in (["status", "--json"], ["down", "--json"], ["check", "--json", "--quick"], ["jobs", "-c", "alpha"],
                 ["logs", "nojob-1"], ["stop", "nojob-1", "--json"]):
        main(argv)
        cap = capsys.readouterr()
        assert f"cluster: alpha ({a}" in cap.err, (argv, cap.err)
        assert "cluster: alpha" not in cap.out, (argv, cap.out)


def test_a_failed_up_records_nothing_and_keeps_an_earlier_record(home, tmp_path, capsys):
    """Before: `up` recorded the cluster (and its overrides, a typo included) before it tried, so a failed `up`
    stayed in `jobs` forever and its overrides came back in the next hint."""
    far = cluster_file(tmp_path, "far", host="nonexistent.invalid")
    assert main(["up", "-c", str(far), "--no-check", "ray.object_store_memory=300000000"]) == 1
    assert not (home / ".verl-cluster/clusters/far.json").exists()
    assert [k.name for k in job_records.known_clusters()] == []
    job_records.record_cluster("far", str(far), ["ray.object_store_memory=200000000"])  # an earlier `up` that worked
    assert main(["up", "-c", "far", "--no-check", "ray.object_store_memory=300000000"]) == 1
    [k] = job_records.recorded_clusters()
    assert k.overrides == ("ray.object_store_memory=200000000",)
    capsys.readouterr()


def test_down_forget_drops_an_unreachable_cluster_and_its_jobs(home, tmp_path, capsys):
    far, near = cluster_file(tmp_path, "far", host="nonexistent.invalid"), cluster_file(tmp_path, "near")
    job_records.record_cluster("far", str(far))
    job_records.record("far-job-1", str(far), "far", "smoke")
    job_records.record_cluster("near", str(near))
    job_records.record("near-job-1", str(near), "near", "smoke")
    assert main(["down", "-c", "far"]) == 1  # not stopped: said, and the record stays
    err = capsys.readouterr().err
    assert "verl-cluster down --forget -c far" in err and "verl-cluster forget far" in err
    assert "far" in [k.name for k in job_records.known_clusters()]
    assert main(["down", "-c", "far", "--forget", "--json"]) == 1  # still not stopped, but forgotten
    cap = capsys.readouterr()
    assert sorted(Path(p).name for p in json.loads(cap.out)["forgotten"]) == ["far-job-1.json", "far.json"]
    assert "forgot far" in cap.err and "nothing was stopped" in cap.err
    assert [k.name for k in job_records.known_clusters()] == ["near"] and job_records.lookup("near-job-1")
    main(["jobs", "--json", "--timeout", "5"])
    assert [c["cluster"] for c in json.loads(capsys.readouterr().out)["clusters"]] == ["near"]


def test_forget_by_name_or_file_and_an_unknown_name_forgets_nothing(home, tmp_path, capsys):
    a, b = cluster_file(tmp_path, "alpha"), cluster_file(tmp_path, "beta")
    job_records.record_cluster("alpha", str(a))
    job_records.record("beta-job-1", str(b), "beta", "smoke")  # known only through a job sent to it
    assert main(["forget", "alpha", "typo"]) == 2
    err = capsys.readouterr().err
    assert "`typo`: no cluster of that name is recorded" in err and "alpha, beta" in err
    assert len(job_records.known_clusters()) == 2  # one typo: nothing removed
    assert main(["forget", "alpha", str(b)]) == 0
    assert "forgot alpha" in capsys.readouterr().err
    assert job_records.known_clusters() == [] and job_records.lookup("beta-job-1") is None


def test_a_command_run_as_a_user_does_from_another_directory(home, tmp_path):
    """The installed command in a fresh process, cwd outside the checkout, a recorded cluster named by name."""
    a = cluster_file(tmp_path, "alpha")
    job_records.record_cluster("alpha", str(a))
    r = subprocess.run([sys.executable, "-m", "verl_cluster", "up", "-c", "alpha", "--dry-run", "--json"],
                       capture_output=True, text=True, timeout=120, cwd=Path.cwd(), env={**os.environ})
    assert r.returncode == 0 and json.loads(r.stdout)["cluster"] == "alpha", r.stderr
    assert f"cluster: alpha ({a})" in r.stderr
