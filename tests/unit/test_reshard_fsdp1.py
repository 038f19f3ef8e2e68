"""FSDP1 (verl 0.9.1's default strategy) checkpoints written by verl's own FSDPCheckpointManager on gloo CPU ranks
(verl's FSDP1 wrapping: its wrap policy, sharding strategy and device mesh; one AdamW step): resharded, loaded
through the same manager on the new world size with every parameter and optimizer moment equal to the state
gathered at save, and back to the saving world size bit for bit (flat-chunk padding included)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("verl")

from verl_cluster.cli import main  # noqa: E402
from verl_cluster.reshard import reshard  # noqa: E402

from tests.unit.test_reshard_verl import ROLES, _init, build_fsdp1, fsdp1_full_state, spawn  # noqa: E402


@pytest.fixture(autouse=True)
def _own_home(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))


def _model(role: str, seed: int, world: int, use_orig_params: bool = False):
    from transformers import Qwen2Config, Qwen2ForCausalLM, Qwen2ForTokenClassification

    torch.manual_seed(seed)
    # 130 rows and flat sizes not divisible by 3: chunks end in padding on 3 ranks
    cfg = Qwen2Config(hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, vocab_size=130, tie_word_embeddings=(role == "actor"), num_labels=1)
    model = build_fsdp1(Qwen2ForCausalLM(cfg) if role == "actor" else Qwen2ForTokenClassification(cfg), world,
                        use_orig_params)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, betas=(0.9, 0.95))
    return model, opt, torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (1 + s))


def _gathered(model, opt) -> dict:
    """Every parameter and optimizer moment by name, gathered (FSDP1's full optimizer state dict)."""
    from torch.distributed.fsdp import FullOptimStateDictConfig, FullStateDictConfig, StateDictType
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    out = {f"param/{k}": v for k, v in fsdp1_full_state(model).items()}
    with FSDP.state_dict_type(model, StateDictType.FULL_STATE_DICT, FullStateDictConfig(rank0_only=False),
                              FullOptimStateDictConfig(rank0_only=False)):
        osd = FSDP.optim_state_dict(model, opt)
    for name, st in osd["state"].items():
        for k in ("exp_avg", "exp_avg_sq"):
            out[f"optim/{name}/{k}"] = st[k].detach().clone()
    return out


def worker(rank: int, world: int, port: int, step_dir: str, out: str, save: bool, orig: bool = False) -> None:
    from verl.utils.checkpoint.fsdp_checkpoint_manager import FSDPCheckpointManager

    _init(rank, world, port)
    state = {}
    for role in ROLES:
        model, opt, sched = _model(role, 1 if save else 2, world, orig)
        manager = FSDPCheckpointManager(model, opt, sched)
        if save:
            torch.manual_seed(100 + rank)  # each rank trains on its own batch
            ids = torch.randint(0, 130, (2, 6))
            (model(input_ids=ids).logits.pow(2).mean()).backward()
            opt.step()
            sched.step()
            manager.save_checkpoint(os.path.join(step_dir, role), global_step=1)
        else:
            manager.load_checkpoint(os.path.join(step_dir, role))
        state.update({f"{role}/{k}": v for k, v in _gathered(model, opt).items()})
    if rank == 0:
        torch.save(state, Path(out) / ("expected.pt" if save else f"loaded_ws{world}.pt"))
    torch.distributed.destroy_process_group()


@pytest.fixture(scope="module")
def ckpt3(tmp_path_factory):
    root = tmp_path_factory.mktemp("fsdp1_ws3")
    spawn(worker, 3, str(root / "global_step_1"), str(root), True)
    (root / "latest_checkpointed_iteration.txt").write_text("1")
    return root


def _load_and_compare(step: Path, world: int, root: Path) -> None:
    spawn(worker, world, str(step), str(root), False)
    expected = torch.load(root / "expected.pt", weights_only=False)
    loaded = torch.load(root / f"loaded_ws{world}.pt", weights_only=False)
    assert set(expected) == set(loaded) and any("/exp_avg_sq" in k for k in expected)
    for k, v in expected.items():
        assert torch.equal(loaded[k], v), k


def test_3_to_2_loads_through_verls_manager_and_back_to_3_bit_for_bit(ckpt3, tmp_path):
    result = reshard(ckpt3, 2, out_dir=tmp_path / "ws2")
    assert result.plan.fsdp1 and any("FSDP1" in n for n in result.plan.notes)
    _load_and_compare(tmp_path / "ws2" / "global_step_1", 2, ckpt3)
    reshard(tmp_path / "ws2", 3, out_dir=tmp_path / "ws3")
    for role in ROLES:
        for r in range(3):
            for kind in ("model", "optim"):
                name = f"{kind}_world_size_3_rank_{r}.pt"
                a = torch.load(ckpt3 / "global_step_1" / role / name, weights_only=False)
                b = torch.load(tmp_path / "ws3" / "global_step_1" / role / name, weights_only=False)
                if kind == "model":
                    assert set(a) == set(b)
                    for k in a:
                        assert a[k].placements == b[k].placements and torch.equal(a[k].to_local(), b[k].to_local())
                else:
                    assert a["param_groups"] == b["param_groups"] and set(a["state"]) == set(b["state"])
                    for i, st in a["state"].items():
                        for k, v in st.items():
                            assert torch.equal(v, b["state"][i][k]), (role, r, i, k)


def test_3_to_1_loads_unsharded(ckpt3, tmp_path):
    """World size 1: FSDP1 runs unsharded, saves and loads plain full tensors and unpadded flat moments."""
    result = reshard(ckpt3, 1, out_dir=tmp_path / "ws1")
    step = tmp_path / "ws1" / "global_step_1"
    sd = torch.load(step / "actor" / "model_world_size_1_rank_0.pt", weights_only=False)
    assert sd and all(type(v) is torch.Tensor for v in sd.values()) and result.plan.from_world_size == 3
    _load_and_compare(step, 1, ckpt3)
    reshard(tmp_path / "ws1", 3, out_dir=tmp_path / "ws3")  # from plain tensors and unpadded moments, back
    for role in ROLES:
        for r in range(3):
            a = torch.load(ckpt3 / "global_step_1" / role / f"optim_world_size_3_rank_{r}.pt", weights_only=False)
            b = torch.load(tmp_path / "ws3" / "global_step_1" / role / f"optim_world_size_3_rank_{r}.pt",
                           weights_only=False)
            assert all(torch.equal(v, b["state"][i][k]) for i, st in a["state"].items() for k, v in st.items())


def test_other_wrap_policy_is_refused_naming_the_optimizer(ckpt3, tmp_path, capsys):
    """Flat chunks that no grouping of the model's parameters into transformer-layer units explains (here: the
    optimizer of a model with another layer count) are refused, and nothing is written."""
    import shutil

    bad = tmp_path / "bad"
    shutil.copytree(ckpt3, bad)
    actor = bad / "global_step_1" / "actor"
    for r in range(3):
        name = f"optim_world_size_3_rank_{r}.pt"
        opt = torch.load(actor / name, weights_only=False)
        opt["state"][3] = opt["state"][2]
        opt["param_groups"][0]["params"].append(3)
        torch.save(opt, actor / name)
    before = sorted(p.name for p in actor.iterdir())
    assert main(["reshard", str(bad), "--world-size", "2"]) == 2
    err = capsys.readouterr().err
    assert "optim_world_size_3_rank_0.pt" in err and "wrap policy" in err and "Traceback" not in err
    assert sorted(p.name for p in actor.iterdir()) == before


def test_use_orig_params_optimizer_is_refused(tmp_path, capsys):
    """FSDP1 with use_orig_params=True (not verl's default) keeps a state per original parameter, cut at rank
    boundaries: refused, naming it."""
    spawn(worker, 2, str(tmp_path / "global_step_1"), str(tmp_path), True, True)
    assert main(["reshard", str(tmp_path / "global_step_1"), "--world-size", "3", "--dry-run"]) == 0
    assert main(["reshard", str(tmp_path / "global_step_1"), "--world-size", "3"]) == 2
    err = capsys.readouterr().err
    assert "use_orig_params=True" in err and "Traceback" not in err
    assert not list((tmp_path / "global_step_1" / "actor").glob("*world_size_3*"))
