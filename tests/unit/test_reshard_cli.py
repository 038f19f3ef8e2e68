"""`verl-cluster reshard` through the CLI: dry run, JSON, checkpoints it refuses (exit 2, one line), and an
interrupted reshard that leaves the checkpoint as it was."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("verl")

from verl_cluster.cli import main  # noqa: E402
from verl_cluster.reshard import resume_world_size_problem  # noqa: E402

from tests.unit.test_reshard_verl import _digest, save_worker, spawn  # noqa: E402


@pytest.fixture(autouse=True)
def _own_home(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))


@pytest.fixture(scope="module")
def ckpt2(tmp_path_factory):
    root = tmp_path_factory.mktemp("cli_ws2")
    spawn(save_worker, 2, str(root))
    return root


def test_dry_run_lists_reads_and_writes_and_changes_nothing(ckpt2, capsys):
    before = _digest(ckpt2)
    assert main(["reshard", str(ckpt2), "--world-size", "3", "--dry-run", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    plan = doc["plan"]
    assert doc["dry_run"] and plan["from_world_size"] == 2 and plan["world_size"] == 3
    step = ckpt2 / "global_step_1"
    assert set(plan["reads"]) == {str(step / role / f"{k}_world_size_2_rank_{r}.pt")
                                  for role in ("actor", "critic") for k in ("model", "optim", "extra_state")
                                  for r in range(2)}
    assert str(step / ".reshard-ws3.tmp" / "critic" / "optim_world_size_3_rank_2.pt") in plan["writes"]
    assert plan["bytes_read"] > 0
    assert _digest(ckpt2) == before
    assert main(["reshard", str(ckpt2), "--world-size", "3", "--dry-run"]) == 0
    text = capsys.readouterr().out
    assert "2 -> 3 ranks" in text and "model_world_size_3_rank_2.pt" in text


def test_cli_out_then_nothing_to_do(ckpt2, tmp_path, capsys):
    out = tmp_path / "ws1"
    assert main(["reshard", str(ckpt2 / "global_step_1"), "--world-size", "1", "--out", str(out), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["peak_anon_bytes"] > 0 and doc["bytes_written"] > 0 and doc["seconds"] >= 0
    assert (out / "latest_checkpointed_iteration.txt").read_text() == "1"
    assert {p.name for p in (out / "global_step_1" / "actor").iterdir()} >= {
        "model_world_size_1_rank_0.pt", "optim_world_size_1_rank_0.pt", "extra_state_world_size_1_rank_0.pt",
        "fsdp_config.json", "huggingface"}
    assert resume_world_size_problem(out, 1) is None
    assert "has no files for world size 2" in resume_world_size_problem(out, 2)
    assert main(["reshard", str(out), "--world-size", "1"]) == 0
    assert "nothing to do" in capsys.readouterr().out
    assert main(["reshard", str(ckpt2), "--world-size", "1", "--out", str(out)]) == 2  # never over a written step
    assert "exists already" in capsys.readouterr().err


def test_interrupted_reshard_loses_nothing(ckpt2, monkeypatch):
    from verl_cluster.reshard import dtensor_files

    before = _digest(ckpt2)
    calls = {"n": 0}
    real = dtensor_files.write_torch_file

    def fail_on_third(path, obj, device=None):
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt  # Ctrl-C halfway through
        return real(path, obj, device)

    monkeypatch.setattr(dtensor_files, "write_torch_file", fail_on_third)
    assert main(["reshard", str(ckpt2), "--world-size", "4"]) == 130
    assert calls["n"] == 3
    assert _digest(ckpt2) == before  # no new file, no scratch folder, fsdp_config.json and tracker as they were
    assert resume_world_size_problem(ckpt2, 2) is None


def _fake_role(role: Path, world: int, version: int = 2, skip: str | None = None) -> None:
    role.mkdir(parents=True)
    for k in ("model", "optim", "extra_state"):
        for r in range(world):
            name = f"{k}_world_size_{world}_rank_{r}.pt"
            if name != skip:
                (role / name).write_bytes(b"x")
    (role / "fsdp_config.json").write_text(json.dumps({"FSDP_version": version, "world_size": world}))


def _exit2(capsys, path: Path, *more: str) -> str:
    assert main(["reshard", str(path), "--world-size", "2", *more]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert sum(s.startswith("error:") for s in lines) == 1 and not any("Traceback" in s for s in lines)
    return "\n".join(lines)


def test_fsdp1_to_an_hsdp_mesh_is_refused_with_the_reason(tmp_path, capsys):
    _fake_role(tmp_path / "global_step_5" / "actor", 4, version=1)
    msg = _exit2(capsys, tmp_path, "--fsdp-size", "1", "--dry-run")
    assert "FSDP1 checkpoint to an HSDP mesh" in msg and "all-gather" in msg and "leave out --fsdp-size" in msg


def test_megatron_checkpoint_is_refused(tmp_path, capsys):
    actor = tmp_path / "global_step_3" / "actor"
    (actor / "dist_ckpt").mkdir(parents=True)
    (actor / "huggingface").mkdir()
    msg = _exit2(capsys, tmp_path / "global_step_3")
    assert "Megatron" in msg and "FSDP checkpoints only" in msg


def test_missing_rank_file_is_named(tmp_path, capsys):
    _fake_role(tmp_path / "global_step_2" / "actor", 4, skip="optim_world_size_4_rank_2.pt")
    msg = _exit2(capsys, tmp_path)
    assert "optim_world_size_4_rank_2.pt" in msg


def test_sft_per_rank_dataloader_is_refused(tmp_path, capsys):
    step = tmp_path / "global_step_9"
    _fake_role(step / "actor", 2)
    (step / "data_0.pt").write_bytes(b"x")
    msg = _exit2(capsys, step)
    assert "data_0.pt" in msg and "sampler" in msg


def test_not_a_torch_file_is_exit_2(tmp_path, capsys):
    _fake_role(tmp_path / "global_step_1" / "actor", 1)
    msg = _exit2(capsys, tmp_path)
    assert "model_world_size_1_rank_0.pt" in msg and "not a torch.save" in msg
    assert not any(p.name.startswith(".reshard") for p in (tmp_path / "global_step_1").iterdir())


def test_plain_tensor_rank_files_are_refused(tmp_path, capsys):
    """Per-rank files of plain tensors (not FSDP2's DTensors): no way to tell how they split, so exit 2."""
    role = tmp_path / "global_step_4" / "actor"
    role.mkdir(parents=True)
    for r in range(2):
        torch.save({"w": torch.full((3, 2), float(r))}, role / f"model_world_size_2_rank_{r}.pt")
        torch.save({"state": {}, "param_groups": []}, role / f"optim_world_size_2_rank_{r}.pt")
    msg = _exit2(capsys, tmp_path, "--world-size", "3")
    assert "no DTensor shards" in msg
    assert not any(p.name.startswith(".reshard") for p in role.parent.iterdir())


def test_bad_arguments(tmp_path, capsys):
    assert main(["reshard", str(tmp_path / "nope"), "--world-size", "2"]) == 2
    assert "no such checkpoint folder" in capsys.readouterr().err
    _fake_role(tmp_path / "global_step_1" / "actor", 2)
    assert main(["reshard", str(tmp_path), "--world-size", "0"]) == 2
    assert main(["reshard", str(tmp_path), "--world-size", "4", "--fsdp-size", "3"]) == 2
    assert "does not divide" in capsys.readouterr().err


def test_resume_problem_messages(tmp_path):
    assert resume_world_size_problem(tmp_path / "absent", 8) is None
    assert resume_world_size_problem(tmp_path, 8) is None  # no tracker: verl starts from scratch
    (tmp_path / "latest_checkpointed_iteration.txt").write_text("7")
    assert "does not exist" in resume_world_size_problem(tmp_path, 8)
    _fake_role(tmp_path / "global_step_7" / "actor", 16)
    msg = resume_world_size_problem(tmp_path, 8)
    assert "saved by 16 ranks" in msg and f"verl-cluster reshard {tmp_path} --world-size 8" in msg
    assert resume_world_size_problem(tmp_path, 16) is None
    step = resume_world_size_problem(tmp_path / "global_step_7", 8)  # trainer.resume_from_path
    assert f"verl-cluster reshard {tmp_path / 'global_step_7'} --world-size 8" in step


class _Planted:
    """An object whose unpickling would write a file: what a hostile extra-state file could carry."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (Path.touch, (Path(self.path),))


def test_extra_state_is_read_without_running_its_code(tmp_path, capsys):
    import shutil

    ckpt = tmp_path / "ckpt"
    shutil.copytree(Path(__file__).resolve().parent.parent / "fixtures" / "verl_ckpt_ws1", ckpt)
    extra = ckpt / "global_step_2" / "actor" / "extra_state_world_size_1_rank_0.pt"
    marker = tmp_path / "ran"
    state = torch.load(extra, weights_only=False)
    state["lr_scheduler"] = _Planted(marker)
    torch.save(state, extra)
    msg = _exit2(capsys, ckpt)
    assert "extra_state_world_size_1_rank_0.pt: not the extra state verl writes" in msg and "weights-only" in msg
    assert not marker.exists() and not list(ckpt.glob("global_step_2/actor/*world_size_2*"))
