"""`verl-cluster reshard` on checkpoint files that parse but do not hold what verl writes there: exit 2 with one
error line naming the file and what was expected, never an internal error or a "done" over garbage."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from verl_cluster.cli import main  # noqa: E402


@pytest.fixture(autouse=True)
def _own_home(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))


def _role(root: Path, *, model=None, optim=None, version: int = 2, world: int = 2) -> Path:
    """A step whose rank files are real torch.save files holding `model` / `optim` (default: empty dicts)."""
    role = root / "global_step_1" / "actor"
    role.mkdir(parents=True)
    for kind, obj in (("model", model), ("optim", optim), ("extra_state", {"lr_scheduler": None})):
        for r in range(world):
            torch.save({} if obj is None else obj, role / f"{kind}_world_size_{world}_rank_{r}.pt")
    (role / "fsdp_config.json").write_text(json.dumps({"FSDP_version": version, "world_size": world}))
    return role


def _exit2(capsys, path: Path) -> str:
    assert main(["reshard", str(path), "--world-size", "3"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert sum(s.startswith("error:") for s in lines) == 1, lines
    assert not any("internal error" in s or "Traceback" in s for s in lines), lines
    return next(s for s in lines if s.startswith("error:"))


@pytest.mark.parametrize("model,optim,version,bad,expected", [
    ([torch.zeros(2)], None, 2, "model_world_size_2_rank_0.pt", "holds a list, expected a model state_dict"),
    ({0: "w"}, None, 2, "model_world_size_2_rank_0.pt", "keys are not all parameter names"),
    ({}, {"step": 3}, 2, "optim_world_size_2_rank_0.pt", "keys ['step'], expected an optimizer state_dict"),
    ({}, [1, 2], 1, "optim_world_size_2_rank_0.pt", "holds a list, expected an optimizer state_dict"),
    ({}, {"state": {0: [1]}, "param_groups": [{"params": [0]}]}, 1, "optim_world_size_2_rank_0.pt",
     "a state that is not a dict per parameter"),
    ({}, {"state": {}, "param_groups": [7]}, 1, "optim_world_size_2_rank_0.pt", "param_groups that are not dicts"),
], ids=["model-list", "model-int-keys", "optim-no-state", "fsdp1-optim-list", "fsdp1-state-list",
        "fsdp1-groups-ints"])
def test_rank_file_of_the_wrong_shape_is_named(tmp_path, capsys, model, optim, version, bad, expected):
    role = _role(tmp_path, model=model, optim=optim, version=version)
    msg = _exit2(capsys, tmp_path)
    assert f"{role / bad}: " in msg and expected in msg
    assert not list(role.glob("*world_size_3*")) and not list(role.parent.glob(".reshard-*"))


@pytest.mark.parametrize("raw,expected", [
    (b"\xff\xfe\x00{", "not the JSON verl writes"),
    (b'{"FSDP_version": "1", "world_size": 2}', 'FSDP_version is "1", expected a whole number'),
    (b'{"FSDP_version": 2, "world_size": [2]}', "world_size is [2], expected a whole number"),
], ids=["not-utf8", "version-string", "world-list"])
def test_fsdp_config_of_the_wrong_shape_is_named(tmp_path, capsys, raw, expected):
    role = _role(tmp_path)
    (role / "fsdp_config.json").write_bytes(raw)
    msg = _exit2(capsys, tmp_path)
    assert f"{role / 'fsdp_config.json'}: " in msg and expected in msg


def test_tracker_with_no_step_number_is_named(tmp_path, capsys):
    _role(tmp_path)
    (tmp_path / "latest_checkpointed_iteration.txt").write_text("step-one\n")
    msg = _exit2(capsys, tmp_path)
    assert "latest_checkpointed_iteration.txt: expected a step number, found 'step-one'" in msg
