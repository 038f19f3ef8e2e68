"""One reading of a job's shape (config/job_shape.py) for every reader, each keeping what it did: the planner and
the Slurm fit see "not pinned", preflight sees what verl will ask Ray for (its own 1 x 8), the watcher the world."""

from pathlib import Path

import pytest

from verl_cluster.config.job import job_from_data, load_job
from verl_cluster.config.job_shape import JobShape
from verl_cluster.errors import ConfigError
from verl_cluster.placement.settings import read_settings
from verl_cluster.slurm.fit import check_fits
from verl_cluster.submit.preflight import gpu_request

ROOT = Path(__file__).resolve().parents[2]


def _job(**overrides):
    return job_from_data({"name": "j", "entrypoint": "verl.trainer.main_ppo",
                          "overrides": {"trainer": overrides} if overrides else {}}, "j.yaml")


def test_unpinned_is_not_verls_default():
    s = JobShape.of(_job())
    assert (s.nodes, s.gpus_per_node, s.world, s.pinned) == (None, None, None, False)
    assert (s.verl_nodes, s.verl_gpus_per_node, s.verl_world) == (1, 8, 8)  # verl's ppo_trainer.yaml
    assert s.needs_gpus  # a verl trainer runs on GPUs whoever counts them
    pinned = JobShape.of(_job(nnodes=2, n_gpus_per_node=4))
    assert (pinned.world, pinned.verl_world, pinned.overrides()) == (8, 8, {"trainer.nnodes": 2,
                                                                             "trainer.n_gpus_per_node": 4})
    assert pinned.at_nodes(1).world == 4


def test_each_reader_keeps_its_default():
    job = _job()
    assert read_settings(job).shape == JobShape(None, None)  # the planner fits the cluster
    assert gpu_request({}) == (8, 1) and gpu_request({"trainer.nnodes": "2", "trainer.n_gpus_per_node": 4}) == (4, 2)
    check_fits(job, 1, 2, True, "Slurm allocation 7")  # unpinned: any allocation with GPUs fits
    with pytest.raises(ConfigError, match="needs 2"):
        check_fits(_job(nnodes=2), 1, 2, True, "Slurm allocation 7")
    cpu = job_from_data({"name": "c", "launcher": "torchrun", "command": ["python", "x.py"],
                         "overrides": {"trainer": {"n_gpus_per_node": 0}}}, "c.yaml")
    assert not JobShape.of(cpu).needs_gpus and JobShape.of(cpu).launcher == "torchrun"


def test_placement_gpus_fills_what_the_job_leaves_unstated():
    job = job_from_data({"name": "j", "entrypoint": "verl.trainer.main_ppo", "placement": {"gpus": "2x8xH100-80GB"},
                         "overrides": {"trainer": {"n_gpus_per_node": 4}}}, "j.yaml")
    assert (JobShape.of(job).nodes, JobShape.of(job).gpus_per_node) == (2, 4)  # the job's own key wins
    assert read_settings(job).shape == JobShape(None, 4)  # the planner takes placement.gpus as hardware instead


def test_a_count_that_is_not_one_names_its_key():
    with pytest.raises(ConfigError, match="`trainer.nnodes` must be a whole number, got 'two'"):
        JobShape.of_overrides({"trainer.nnodes": "two"})
    with pytest.raises(ConfigError, match="must not be negative"):
        JobShape.of_overrides({"trainer.n_gpus_per_node": -1})
    assert JobShape.of_overrides({"trainer.nnodes": 2.0, "trainer.n_gpus_per_node": " 3 "}).world == 6


def test_a_user_line_reads_the_same_as_its_job_file():
    line = load_job(ROOT / "launch/gsm8k_grpo.yaml", ["trainer.nnodes=2", "trainer.n_gpus_per_node=1"])
    assert JobShape.of(line).world == 2 and read_settings(line).shape == JobShape(2, 1)
