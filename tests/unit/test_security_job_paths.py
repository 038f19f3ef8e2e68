"""A job file's relative `cluster:` and `placement.factors:` name files beside the job file, never files in
whatever directory the command runs from (a folder anyone can write, such as /tmp, could plant them there)."""

from pathlib import Path

from verl_cluster.config.job import job_cluster_path, job_factors_path, load_job


def test_relative_paths_resolve_against_the_job_file_only(tmp_path, monkeypatch):
    jobs, cwd = tmp_path / "jobs", tmp_path / "elsewhere"
    for d in (jobs, cwd):
        d.mkdir()
        (d / "c.yaml").write_text("cluster_name: c\n")
        (d / "f.json").write_text('{"factors": {}}')
    (jobs / "j.yaml").write_text("name: j\ncommand: [python, x.py]\ncluster: c.yaml\nplacement: {factors: f.json}\n")
    monkeypatch.chdir(cwd)  # a c.yaml and f.json here too: they must not be the ones used
    job = load_job(str(jobs / "j.yaml"))
    assert job_cluster_path(job).resolve() == jobs / "c.yaml"
    assert Path(job_factors_path(job)).resolve() == jobs / "f.json"
    monkeypatch.chdir(tmp_path)  # the job named by a relative path: still beside it
    job = load_job("jobs/j.yaml")
    assert job_cluster_path(job).resolve() == jobs / "c.yaml"
    assert Path(job_factors_path(job)).resolve() == jobs / "f.json"


def test_absolute_and_home_paths_are_kept(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "j.yaml").write_text(f"name: j\ncommand: [python, x.py]\ncluster: ~/c.yaml\n"
                                     f"placement: {{factors: {tmp_path}/f.json}}\n")
    job = load_job(str(tmp_path / "j.yaml"))
    assert job_cluster_path(job) == tmp_path / "c.yaml"
    assert job_factors_path(job) == str(tmp_path / "f.json")
