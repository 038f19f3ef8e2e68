"""A real 2-rank checkpoint: verl 0.9.1 (FSDP1, its default) ran GRPO across two Ray nodes of one GPU each (torch
2.11 on an H200 machine) and saved `global_step_2` (model, optimizer, extra state, huggingface/), kept compressed
as tests/fixtures/verl_ckpt_ws2_h200.tgz. Its rank files hold only globals the reshard's unpickler lists; the CLI
reshards it 2 -> 1 -> 2 and 2 -> 3 -> 2 bit for bit (its torch-2.11 device meshes read as saved); the watcher
reshards it for the one node left, and refuses, with the reason, whatever a reshard of an odd file raises;
`--out` copies no link out of the folder."""

from __future__ import annotations

import dataclasses
import json
import os
import pickletools
import shutil
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from verl_cluster.cli import main  # noqa: E402
from verl_cluster.reshard import apply_reshard, plan_reshard  # noqa: E402
from verl_cluster.reshard.extra import load_extra  # noqa: E402
from verl_cluster.reshard.torchfile import open_torch_file  # noqa: E402

TGZ = Path(__file__).resolve().parent.parent / "fixtures" / "verl_ckpt_ws2_h200.tgz"
KINDS = ("model", "optim", "extra_state")

# exactly what torch 2.11's torch.save wrote into each rank file (both ranks alike). Model: FSDP1's sharded state
# dict, DTensors on a 1-D mesh whose layout torch 2.11 pickles as (shape, stride), no _FlatLayout
MODEL_GLOBALS = {
    "collections OrderedDict", "torch FloatStorage", "torch IntStorage", "torch Size", "torch device",
    "torch float32", "torch._tensor _rebuild_from_type_v2", "torch._utils _rebuild_tensor_v2",
    "torch._utils _rebuild_wrapper_subclass", "torch.distributed._mesh_layout _MeshLayout",
    "torch.distributed.device_mesh DeviceMesh", "torch.distributed.tensor DTensor",
    "torch.distributed.tensor._dtensor_spec DTensorSpec", "torch.distributed.tensor._dtensor_spec ShardOrderEntry",
    "torch.distributed.tensor._dtensor_spec TensorMeta", "torch.distributed.tensor.placement_types Shard",
    "torch.serialization _get_layout"}
# the optimizer over FSDP1's flat parameters: plain tensors
OPTIM_GLOBALS = {"collections OrderedDict", "torch FloatStorage", "torch._utils _rebuild_tensor_v2"}
# extra state (lr scheduler, RNG with numpy's state): read by torch's weights-only loader, numpy's RNG allowed
EXTRA_GLOBALS = {"_codecs encode", "collections OrderedDict", "numpy dtype", "numpy ndarray",
                 "numpy._core.multiarray _reconstruct", "torch ByteStorage", "torch._utils _rebuild_tensor_v2"}


@pytest.fixture(autouse=True)
def _own_home(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> Path:
    """The fixture extracted (read-only to the tests: each copies it before changing anything)."""
    root = tmp_path_factory.mktemp("ws2_h200")
    with tarfile.open(TGZ) as t:
        t.extractall(root, filter="data")
    (root / "latest_checkpointed_iteration.txt").write_text("2")
    return root


@pytest.fixture
def ckpt(saved, tmp_path) -> Path:
    shutil.copytree(saved, tmp_path / "ckpt")
    return tmp_path / "ckpt"


def _load(p: Path):
    return torch.load(p, weights_only=False, map_location="cpu")


def _globals(path: Path) -> set[str]:
    with zipfile.ZipFile(path) as z:
        data = z.read(next(n for n in z.namelist() if n.endswith("/data.pkl")))
    ops = list(pickletools.genops(data))
    assert data[:2] == b"\x80\x02" and not any(op.name == "STACK_GLOBAL" for op, _, _ in ops)
    return {arg for op, arg, _ in ops if op.name == "GLOBAL"}


def test_every_global_in_its_rank_files_is_on_the_list(saved):
    from verl_cluster.reshard.safe_pickle import torch_globals

    table = torch_globals()
    actor = saved / "global_step_2" / "actor"
    expect = {"model": MODEL_GLOBALS, "optim": OPTIM_GLOBALS, "extra_state": EXTRA_GLOBALS}
    for kind in KINDS:
        for r in (0, 1):
            assert _globals(actor / f"{kind}_world_size_2_rank_{r}.pt") == expect[kind], (kind, r)
    for g in MODEL_GLOBALS | OPTIM_GLOBALS:
        module, name = g.split(" ")
        assert getattr(sys.modules[module], name) is table[(module, name)][0], g  # the object its module defines
    for r in (0, 1):
        for kind in ("model", "optim"):
            open_torch_file(str(actor / f"{kind}_world_size_2_rank_{r}.pt")).close()
        assert isinstance(load_extra(actor / f"extra_state_world_size_2_rank_{r}.pt")["rng"], dict)


def _mesh_state(mesh) -> dict:
    """A pickled DeviceMesh's fields as saved (its torch-2.11 layout is not usable through this torch's methods)."""
    out = {k: v for k, v in vars(mesh).items() if k not in ("_hash", "_pg_registry")}
    out["_layout"] = vars(out["_layout"])
    out["_rank_map"] = out["_rank_map"].tolist()
    return out


def _same_files(a: Path, b: Path, world: int) -> None:
    """Every model DTensor (local tensor, placement, mesh as saved) and optimizer tensor of `a` equals `b`'s."""
    for r in range(world):
        ma, mb = _load(a / f"model_world_size_{world}_rank_{r}.pt"), _load(b / f"model_world_size_{world}_rank_{r}.pt")
        assert ma and list(ma) == list(mb)
        for k, v in ma.items():
            assert v.placements == mb[k].placements and torch.equal(v._local_tensor, mb[k]._local_tensor), k
        oa, ob = _load(a / f"optim_world_size_{world}_rank_{r}.pt"), _load(b / f"optim_world_size_{world}_rank_{r}.pt")
        assert oa["param_groups"] == ob["param_groups"] and set(oa["state"]) == set(ob["state"])
        assert all(torch.equal(v, ob["state"][i][k]) for i, st in oa["state"].items() for k, v in st.items())


def test_cli_reshards_it_2_to_1_and_back_to_2_bit_for_bit(saved, tmp_path, capsys):
    src = saved / "global_step_2" / "actor"
    assert main(["reshard", str(saved), "--world-size", "1", "--out", str(tmp_path / "ws1")]) == 0
    one = tmp_path / "ws1" / "global_step_2" / "actor"
    # world size 1: plain full tensors (FSDP1 runs unsharded there), each the two shards joined
    shards = [_load(src / f"model_world_size_2_rank_{r}.pt") for r in (0, 1)]
    full = _load(one / "model_world_size_1_rank_0.pt")
    assert full and list(full) == list(shards[0]) and all(type(v) is torch.Tensor for v in full.values())
    for k, v in full.items():
        assert torch.equal(torch.cat([s[k]._local_tensor for s in shards]), v), k
    # the optimizer's flat chunks: the two joined, less FSDP1's zero padding
    chunks = [_load(src / f"optim_world_size_2_rank_{r}.pt") for r in (0, 1)]
    flat = _load(one / "optim_world_size_1_rank_0.pt")
    assert flat["param_groups"] == chunks[0]["param_groups"] and set(flat["state"]) == set(chunks[0]["state"])
    for i, st in flat["state"].items():
        assert torch.equal(st["step"], chunks[0]["state"][i]["step"])
        for k in ("exp_avg", "exp_avg_sq"):
            joined = torch.cat([c["state"][i][k] for c in chunks])
            n = st[k].numel()
            assert n > joined.numel() - 2 and torch.equal(joined[:n], st[k]) and not joined[n:].any(), (i, k)
    assert main(["reshard", str(tmp_path / "ws1"), "--world-size", "2", "--out", str(tmp_path / "ws2")]) == 0
    two = tmp_path / "ws2" / "global_step_2" / "actor"
    _same_files(src, two, 2)
    assert (two / "extra_state_world_size_2_rank_0.pt").read_bytes() == \
        (src / "extra_state_world_size_2_rank_0.pt").read_bytes()
    assert json.loads((two / "fsdp_config.json").read_text()) == {"FSDP_version": 1, "world_size": 2}
    hf = sorted(p.relative_to(src) for p in (src / "huggingface").rglob("*"))
    assert hf and all((two / p).read_bytes() == (src / p).read_bytes() for p in hf)
    assert (tmp_path / "ws2" / "latest_checkpointed_iteration.txt").read_text() == "2"
    assert "Traceback" not in capsys.readouterr().err


def test_cli_reshards_it_2_to_3_and_back_keeping_torch_2_11s_mesh_layout(saved, tmp_path):
    """Its DTensors' meshes were pickled by torch 2.11 (`_MeshLayout(shape, stride)`), which this torch's mesh
    methods cannot read; the sizes are read from the saved fields and the new layout is written in that form."""
    assert main(["reshard", str(saved), "--world-size", "3", "--out", str(tmp_path / "ws3")]) == 0
    three = _load(tmp_path / "ws3" / "global_step_2" / "actor" / "model_world_size_3_rank_2.pt")
    mesh = next(iter(three.values()))._spec.mesh
    assert vars(mesh._layout) == {"shape": (3,), "stride": (1,)} and mesh._rank_map.tolist() == [0, 1, 2]
    assert main(["reshard", str(tmp_path / "ws3"), "--world-size", "2", "--out", str(tmp_path / "back")]) == 0
    src, back = saved / "global_step_2" / "actor", tmp_path / "back" / "global_step_2" / "actor"
    _same_files(src, back, 2)
    for r in (0, 1):
        a, b = _load(src / f"model_world_size_2_rank_{r}.pt"), _load(back / f"model_world_size_2_rank_{r}.pt")
        assert all(_mesh_state(v._spec.mesh) == _mesh_state(b[k]._spec.mesh) for k, v in a.items())
        assert (back / f"extra_state_world_size_2_rank_{r}.pt").read_bytes() == \
            (src / f"extra_state_world_size_2_rank_{r}.pt").read_bytes()


# ---------------------------------------------------------------- the watcher, with one node left


def _watcher_on(tmp_path, monkeypatch, ckpt: Path):
    from tests.unit.test_watch_loop import _watcher

    w, _ = _watcher(tmp_path, monkeypatch, [])
    w.job = dataclasses.replace(w.job, overrides={**w.job.overrides, "trainer.default_local_dir": str(ckpt)})
    return w


def test_the_watcher_reshards_it_for_the_one_gpu_left(ckpt, tmp_path, monkeypatch):
    w = _watcher_on(tmp_path, monkeypatch, ckpt)
    ok, why = w._reshard_for(1)
    assert ok and "resharded the newest checkpoint to 1 GPUs (global_step_2, actor: 2 -> 1 ranks, " in why
    assert "{" not in why  # said in words, not a dict dump
    actor = ckpt / "global_step_2" / "actor"
    assert {p.name for p in actor.glob("*_world_size_1_rank_*.pt")} == {f"{k}_world_size_1_rank_0.pt" for k in KINDS}
    assert len(list(actor.glob("*_world_size_2_rank_*.pt"))) == 6  # kept: the step still resumes on 2
    assert json.loads((actor / "fsdp_config.json").read_text())["world_size"] == 1
    assert w._reshard_for(1) == (True, "")  # nothing left to do


def _odd_model_files(ckpt: Path) -> None:
    """Well-formed rank files the reader loads, with a DTensor whose spec has no tensor metadata."""
    for r in (0, 1):
        p = ckpt / "global_step_2" / "actor" / f"model_world_size_2_rank_{r}.pt"
        sd = _load(p)
        object.__setattr__(next(iter(sd.values()))._spec, "tensor_meta", None)
        torch.save(sd, p)


def test_any_reshard_failure_is_a_refusal_with_its_reason(ckpt, tmp_path, monkeypatch):
    """Before: an odd file's AttributeError (and a symbolic-link tracker's refusal, raised before the reshard was
    tried) ended the watcher with a traceback; now the run waits for the node, and the record says why."""
    w = _watcher_on(tmp_path, monkeypatch, ckpt)
    _odd_model_files(ckpt)
    ok, why = w._reshard_for(1)
    assert not ok and "resharding the checkpoint to 1 GPUs failed: AttributeError" in why
    assert not list(ckpt.rglob("*world_size_1*")) and not list(ckpt.rglob(".reshard-*"))
    tracker = ckpt / "latest_checkpointed_iteration.txt"
    tracker.unlink()
    (tmp_path / "two").write_text("2")
    tracker.symlink_to(tmp_path / "two")
    ok, why = w._reshard_for(1)
    assert not ok and "cannot be resumed on 1 GPUs" in why and "symbolic link" in why


# ---------------------------------------------------------------- --out never follows a link in the folder


@pytest.mark.parametrize("plant", ["link in huggingface/", "link to a folder", "link beside the roles", "fifo"])
def test_out_refuses_a_link_or_special_file_instead_of_copying_its_target(ckpt, tmp_path, capsys, plant):
    secret = tmp_path / "secret"
    secret.mkdir()
    (secret / "key").write_text("hunter2-SECRET")
    step = ckpt / "global_step_2"
    planted = {"link in huggingface/": step / "actor" / "huggingface" / "vocab.txt",
               "link to a folder": step / "actor" / "extra", "link beside the roles": step / "data.pt",
               "fifo": step / "actor" / "huggingface" / "pipe"}[plant]
    if plant == "fifo":
        os.mkfifo(planted)  # copied by reading, a pipe would hang the reshard
    else:
        planted.symlink_to(secret if plant == "link to a folder" else secret / "key")
    out = tmp_path / "out"
    for dry in ([], ["--dry-run"]):
        assert main(["reshard", str(ckpt), "--world-size", "1", "--out", str(out), *dry]) == 2
        err = capsys.readouterr().err
        assert str(planted) in err and ("symbolic link" in err or "not a regular file" in err), err
        assert "hunter2" not in err and "Traceback" not in err
    assert not out.exists()


def test_a_link_planted_after_the_plan_is_not_followed(ckpt, tmp_path):
    from verl_cluster.reshard import NotReshardable

    (tmp_path / "secret").write_text("hunter2-SECRET")
    out = tmp_path / "out"
    out.mkdir()
    plan = plan_reshard(ckpt, 1, out_dir=out)
    config = ckpt / "global_step_2" / "actor" / "huggingface" / "config.json"
    config.unlink()
    config.symlink_to(tmp_path / "secret")
    with pytest.raises(NotReshardable, match="symbolic link"):
        apply_reshard(plan)
    assert os.listdir(out) == []  # the scratch folder is gone; nothing was copied
