"""The CPU trainer's verl-style rank files (launch/resumable_job.py, resumable.rank_files=1): the layout `reshard`
reads as verl's, resharded 3 -> 2 and opened by the trainer's resume on 2 ranks; no files for a world size is
verl's FileNotFoundError."""

import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

from verl_cluster.reshard import read_step, reshard, resume_world_size_problem  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "launch"))
import resumable_job  # noqa: E402


def test_rank_files_reshard_and_load_on_fewer_ranks(tmp_path, capsys):
    resumable_job.save(str(tmp_path), 4, world=3)
    step = read_step(tmp_path)
    (actor,) = step.roles
    assert step.step == 4 and actor.world_sizes == (3,) and actor.kinds == ("model", "extra_state")
    assert "saved by 3 ranks" in resume_world_size_problem(tmp_path, 2)
    with pytest.raises(FileNotFoundError, match="model_world_size_2_rank_0.pt"):
        resumable_job.load_rank_files(str(actor.path), 4, 2)
    reshard(tmp_path, 2)
    assert resume_world_size_problem(tmp_path, 2) is None
    resumable_job.load_rank_files(str(actor.path), 4, 2)
    assert "on world size 2: every piece equal" in capsys.readouterr().out
    with pytest.raises(ValueError, match="do not hold step 6"):
        resumable_job.load_rank_files(str(actor.path), 6, 2)
