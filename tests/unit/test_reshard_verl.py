"""Reshard checkpoints written by verl 0.9.1's own FSDPCheckpointManager (FSDP2, gloo CPU ranks), load them
through the same manager on the new world size, and compare every tensor with the state gathered at save time.

The ranks are torch.multiprocessing processes running verl's `apply_fsdp2` on a tiny Qwen2 (actor: causal LM
with tied embeddings; critic: token-classification value head), one AdamW step each, then
`FSDPCheckpointManager.save_checkpoint` into `global_step_1/{actor,critic}` as verl's PPO trainer lays it out.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import tempfile
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("verl")

import torch.multiprocessing as mp  # noqa: E402

from verl_cluster.reshard import plan_reshard, reshard, resume_world_size_problem  # noqa: E402

ROLES = ("actor", "critic")
FIXTURE = Path(__file__).resolve().parent.parent / "fixtures" / "verl_ckpt_ws1"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _init(rank: int, world: int, port: int) -> None:
    import warnings

    warnings.filterwarnings("ignore")
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.distributed.init_process_group("gloo", rank=rank, world_size=world)


def _build(role: str, world: int, seed: int, fsdp_size: int = -1):
    """verl's FSDP2 wrapping (apply_fsdp2) of a tiny model, its AdamW and lr scheduler; with fsdp_size < world,
    verl's 2-D (ddp, fsdp) mesh (HSDP)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy
    from transformers import Qwen2Config, Qwen2ForCausalLM, Qwen2ForTokenClassification
    from verl.utils.fsdp_utils import apply_fsdp2

    torch.manual_seed(seed)
    # 130 rows: not divisible by 3 or 4, so some ranks hold shorter pieces
    cfg = Qwen2Config(hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, vocab_size=130, tie_word_embeddings=(role == "actor"), num_labels=1)
    model = Qwen2ForCausalLM(cfg) if role == "actor" else Qwen2ForTokenClassification(cfg)
    # verl's create_device_mesh (verl/workers/engine/fsdp/utils.py), on the CPU device type
    if fsdp_size < 0 or fsdp_size >= world:
        mesh = init_device_mesh("cpu", (world,), mesh_dim_names=["fsdp"])
    else:
        mesh = init_device_mesh("cpu", (world // fsdp_size, fsdp_size), mesh_dim_names=["ddp", "fsdp"])
    apply_fsdp2(model, {"mesh": mesh, "mp_policy": MixedPrecisionPolicy(param_dtype=torch.float32),
                        "reshard_after_forward": True}, {})
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, betas=(0.9, 0.95))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (1 + s))
    return model, opt, sched


def _full_state(model, opt, rebind: bool = False) -> dict:
    """Every parameter and optimizer moment, gathered, by parameter name (a collective: all ranks call it).
    `rebind`: gather the moments over their parameter's live mesh rather than the mesh they were loaded with."""
    from torch.distributed.tensor import DTensor

    out = {}
    names = {id(p): n for n, p in model.named_parameters()}
    for n, p in model.named_parameters():
        out[f"param/{n}"] = p.detach().full_tensor().clone()
    for p, st in opt.state.items():
        for k, v in st.items():
            if isinstance(v, DTensor) and rebind:
                v = DTensor.from_local(v.to_local(), p.device_mesh, v.placements, shape=v.shape, stride=v.stride())
            v = v.full_tensor() if hasattr(v, "full_tensor") else v
            out[f"optim/{names[id(p)]}/{k}"] = v.detach().clone()
    return out


def _manager(model, opt, sched):
    from verl.utils.checkpoint.fsdp_checkpoint_manager import FSDPCheckpointManager

    return FSDPCheckpointManager(model, opt, sched)


def save_worker(rank: int, world: int, port: int, root: str, fsdp_size: int = -1) -> None:
    _init(rank, world, port)
    step_dir = Path(root) / "global_step_1"
    expected = {}
    for role in ROLES:
        model, opt, sched = _build(role, world, seed=1, fsdp_size=fsdp_size)
        torch.manual_seed(100 + rank)  # each rank trains on its own batch
        ids = torch.randint(0, 130, (2, 6))
        out = model(input_ids=ids)
        loss = out.logits.float().pow(2).mean()
        loss.backward()
        opt.step()
        sched.step()
        torch.manual_seed(1000 + rank)  # a distinct RNG state per rank, to see what extra_state carries
        _manager(model, opt, sched).save_checkpoint(str(step_dir / role), global_step=1)
        expected.update({f"{role}/{k}": v for k, v in _full_state(model, opt).items()})
    if rank == 0:
        torch.save({"dataloader_position": 7}, step_dir / "data.pt")  # as the PPO trainer's driver does
        (Path(root) / "latest_checkpointed_iteration.txt").write_text("1")
        torch.save(expected, Path(root) / "expected.pt")
    torch.distributed.destroy_process_group()


def load_worker(rank: int, world: int, port: int, step_dir: str, out: str, fsdp_size: int = -1) -> None:
    _init(rank, world, port)
    loaded = {}
    rng = {}
    for role in ROLES:
        model, opt, sched = _build(role, world, seed=2, fsdp_size=fsdp_size)  # other weights: the load replaces them
        _manager(model, opt, sched).load_checkpoint(os.path.join(step_dir, role))
        rng[role] = torch.get_rng_state()
        loaded.update({f"{role}/{k}": v for k, v in _full_state(model, opt, rebind=fsdp_size > 0).items()})
        loaded[f"{role}/lr_scheduler_epoch"] = torch.tensor(sched.last_epoch)
    if rank == 0:
        torch.save(loaded, Path(out) / "loaded.pt")
    torch.save(rng, Path(out) / f"rng_{rank}.pt")
    torch.distributed.destroy_process_group()


# ranks fork from one server that imported verl once (a fresh interpreter per rank spends seconds importing)
PRELOAD = ["torch", "transformers", "peft", "verl.utils.fsdp_utils", "verl.utils.checkpoint.fsdp_checkpoint_manager"]


def _in_test_tmp(rank: int, fn, tmp: str, world: int, port: int, *args) -> None:
    tempfile.tempdir = tmp  # verl's checkpoint mkdir leaves a ckpt_*.lock in the temp dir: the test's, not /tmp
    fn(rank, world, port, *args)


def spawn(fn, world: int, *args) -> None:
    """FN(rank, world, port, *ARGS) on WORLD ranks; ARGS[0] is a path in the test's folder (the locks go beside its
    nearest existing folder)."""
    import multiprocessing

    multiprocessing.set_forkserver_preload(PRELOAD)
    locks = next(p for p in Path(args[0]).parents if p.is_dir()) / "locks"
    locks.mkdir(exist_ok=True)
    mp.start_processes(_in_test_tmp, args=(fn, str(locks), world, _free_port(), *args), nprocs=world, join=True,
                       start_method="forkserver")


def _make(tmp_path_factory, world: int) -> Path:
    root = tmp_path_factory.mktemp(f"ckpt_ws{world}")
    spawn(save_worker, world, str(root))
    return root


@pytest.fixture(scope="module")
def ckpt4(tmp_path_factory):
    return _make(tmp_path_factory, 4)


@pytest.fixture(scope="module")
def ckpt2(tmp_path_factory):
    return _make(tmp_path_factory, 2)


@pytest.fixture(autouse=True)
def _own_home(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))


def _digest(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def _assert_loaded_equal(root: Path, out: Path) -> None:
    expected = torch.load(root / "expected.pt", weights_only=False)
    loaded = torch.load(out / "loaded.pt", weights_only=False)
    params = [k for k in expected if "/param/" in k]
    moments = [k for k in expected if k.endswith("/exp_avg") or k.endswith("/exp_avg_sq")]
    assert params and moments
    for k, v in expected.items():
        assert k in loaded, k
        assert loaded[k].dtype == v.dtype and loaded[k].shape == v.shape, k
        assert torch.equal(loaded[k], v), f"{k} differs after the reshard"
    for role in ROLES:
        assert int(loaded[f"{role}/lr_scheduler_epoch"]) == 1  # the scheduler's position came along


def test_layout_is_the_one_verl_writes(ckpt4):
    """The files verl's manager wrote, and the tensor types in them, are the layout the reshard reads."""
    from torch.distributed.tensor import DTensor, Shard

    step = ckpt4 / "global_step_1"
    for role in ROLES:
        names = {p.name for p in (step / role).iterdir()}
        assert {f"{k}_world_size_4_rank_{r}.pt" for k in ("model", "optim", "extra_state") for r in range(4)} <= names
        assert json.loads((step / role / "fsdp_config.json").read_text()) == {"FSDP_version": 2, "world_size": 4}
        assert (step / role / "huggingface" / "config.json").is_file()
        model = torch.load(step / role / "model_world_size_4_rank_3.pt", weights_only=False, map_location="cpu")
        assert model and all(isinstance(v, DTensor) and v.placements == (Shard(0),) for v in model.values())
        optim = torch.load(step / role / "optim_world_size_4_rank_3.pt", weights_only=False, map_location="cpu")
        assert set(optim) == {"state", "param_groups"}
        st = optim["state"][0]
        assert isinstance(st["exp_avg"], DTensor) and isinstance(st["exp_avg_sq"], DTensor)
        assert not isinstance(st["step"], DTensor)
        extra = torch.load(step / role / "extra_state_world_size_4_rank_3.pt", weights_only=False)
        assert set(extra) == {"lr_scheduler", "rng"} and {"cpu", "numpy", "random"} <= set(extra["rng"])
    # tied embeddings: verl saves both keys, one DTensor
    model = torch.load(step / "actor" / "model_world_size_4_rank_0.pt", weights_only=False, map_location="cpu")
    tied = model["lm_head.weight"]._local_tensor, model["model.embed_tokens.weight"]._local_tensor
    assert tied[0].data_ptr() == tied[1].data_ptr()


def test_4_to_2_to_4_is_bit_identical_and_loads(ckpt4, tmp_path, monkeypatch):
    from verl_cluster.reshard import torchfile

    monkeypatch.setattr(torchfile, "BLOCK", 1000)  # records stream in many odd-sized blocks across piece boundaries
    src = _digest(ckpt4 / "global_step_1")
    two = reshard(ckpt4, 2, out_dir=tmp_path / "ws2")
    assert two.plan.from_world_size == 4 and (tmp_path / "ws2" / "latest_checkpointed_iteration.txt").read_text() == "1"
    assert two.peak_anon_bytes > 0 and two.largest_tensor_bytes == 130 * 32 * 4
    four = reshard(tmp_path / "ws2", 4, out_dir=tmp_path / "ws4")
    assert four.plan.from_world_size == 2
    assert _digest(ckpt4 / "global_step_1") == src  # the source is untouched
    back = tmp_path / "ws4" / "global_step_1"
    for role in ROLES:
        for kind in ("model", "optim"):
            for r in range(4):
                a = torch.load(ckpt4 / "global_step_1" / role / f"{kind}_world_size_4_rank_{r}.pt",
                               weights_only=False, map_location="cpu")
                b = torch.load(back / role / f"{kind}_world_size_4_rank_{r}.pt", weights_only=False,
                               map_location="cpu")
                _assert_same_tree(a, b, f"{role}/{kind}/{r}")
        for r in range(4):  # the RNG of ranks that existed on both sides is carried byte for byte
            a = torch.load(ckpt4 / "global_step_1" / role / f"extra_state_world_size_4_rank_{r}.pt", weights_only=False)
            b = torch.load(back / role / f"extra_state_world_size_4_rank_{r}.pt", weights_only=False)
            assert a["lr_scheduler"] == b["lr_scheduler"]
            if r < 2:
                assert torch.equal(a["rng"]["cpu"], b["rng"]["cpu"])
            else:  # ranks 2, 3 did not exist at world size 2: re-seeded, not copies of another rank
                assert not torch.equal(a["rng"]["cpu"], b["rng"]["cpu"])
    assert (back / "data.pt").read_bytes() == (ckpt4 / "global_step_1" / "data.pt").read_bytes()
    out = tmp_path / "loaded2"
    out.mkdir()
    spawn(load_worker, 2, str(tmp_path / "ws2" / "global_step_1"), str(out))
    _assert_loaded_equal(ckpt4, out)


def _assert_same_tree(a, b, where: str) -> None:
    from torch.distributed.tensor import DTensor

    if isinstance(a, DTensor):
        assert isinstance(b, DTensor), where
        assert a.placements == b.placements and a.shape == b.shape and a.dtype == b.dtype, where
        assert a.device_mesh == b.device_mesh, where
        assert torch.equal(a._local_tensor, b._local_tensor), where
    elif isinstance(a, torch.Tensor):
        assert torch.equal(a, b), where
    elif isinstance(a, dict):
        assert list(a) == list(b), where
        for k in a:
            _assert_same_tree(a[k], b[k], f"{where}/{k}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            _assert_same_tree(x, y, f"{where}/{i}")
    else:
        assert a == b, where


def test_2_to_3_in_place_loads_on_3_ranks(ckpt2, tmp_path):
    step = ckpt2 / "global_step_1"
    before = _digest(step)
    assert "has no files for world size 3" in resume_world_size_problem(ckpt2, 3)
    assert resume_world_size_problem(ckpt2, 2) is None
    result = reshard(ckpt2, 3)
    assert [r.split(":")[1].strip().split(" ")[0] for r in result.rng[:3]] == ["carried", "carried", "re-seeded"]
    after = _digest(step)
    assert {k: v for k, v in after.items() if k in before and "fsdp_config" not in k} == \
        {k: v for k, v in before.items() if "fsdp_config" not in k}  # every W file is kept as it was
    for role in ROLES:
        assert json.loads((step / role / "fsdp_config.json").read_text())["world_size"] == 3
        assert {f"model_world_size_3_rank_{r}.pt" for r in range(3)} <= {p.name for p in (step / role).iterdir()}
    assert not any(p.name.startswith(".reshard") for p in step.iterdir())
    assert resume_world_size_problem(ckpt2, 3) is None and resume_world_size_problem(ckpt2, 2) is None
    assert plan_reshard(ckpt2, 3).nothing_to_do
    # both sets are complete now: fsdp_config.json names the one read, unless told
    assert plan_reshard(ckpt2, 4).from_world_size == 3
    assert plan_reshard(ckpt2, 4, from_world_size=2).from_world_size == 2
    out = tmp_path / "loaded3"
    out.mkdir()
    spawn(load_worker, 3, str(step), str(out))
    _assert_loaded_equal(ckpt2, out)
    rngs = [torch.load(out / f"rng_{r}.pt", weights_only=False)["actor"] for r in range(3)]
    assert not torch.equal(rngs[0], rngs[2]) and not torch.equal(rngs[1], rngs[2])


def test_hsdp_2x2_to_3_loads(tmp_path_factory, tmp_path):
    """verl's fsdp_size=2 on 4 ranks: a (ddp=2, fsdp=2) mesh, each shard saved twice; resharded to 3 ranks."""
    from torch.distributed.tensor import Replicate, Shard

    root = tmp_path_factory.mktemp("ckpt_hsdp")
    spawn(save_worker, 4, str(root), 2)
    sd = torch.load(root / "global_step_1" / "actor" / "model_world_size_4_rank_3.pt", weights_only=False)
    assert next(iter(sd.values())).placements == (Replicate(), Shard(0))
    reshard(root, 3, out_dir=tmp_path / "ws3")
    out = tmp_path / "loaded"
    out.mkdir()
    spawn(load_worker, 3, str(tmp_path / "ws3" / "global_step_1"), str(out))
    _assert_loaded_equal(root, out)


def test_1d_to_hsdp_target_loads(ckpt2, tmp_path):
    """--fsdp-size: 2 ranks -> 4 ranks on verl's (ddp=2, fsdp=2) mesh."""
    from torch.distributed.tensor import Replicate, Shard

    reshard(ckpt2, 4, out_dir=tmp_path / "hsdp", fsdp_size=2)
    step = tmp_path / "hsdp" / "global_step_1"
    sd = torch.load(step / "actor" / "model_world_size_4_rank_3.pt", weights_only=False)
    assert next(iter(sd.values())).placements == (Replicate(), Shard(0))
    out = tmp_path / "loaded"
    out.mkdir()
    spawn(load_worker, 4, str(step), str(out), 2)
    _assert_loaded_equal(ckpt2, out)


def save_fsdp1_worker(rank: int, world: int, port: int, step_dir: str) -> None:
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from transformers import Qwen2Config, Qwen2ForCausalLM

    _init(rank, world, port)
    cfg = Qwen2Config(hidden_size=32, intermediate_size=48, num_hidden_layers=1, num_attention_heads=4,
                      num_key_value_heads=2, vocab_size=130)
    model = FSDP(Qwen2ForCausalLM(cfg), device_id=torch.device("cpu"))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(input_ids=torch.randint(0, 130, (2, 4))).logits.pow(2).mean().backward()
    opt.step()
    _manager(model, opt, None).save_checkpoint(os.path.join(step_dir, "actor"), global_step=1)
    torch.distributed.destroy_process_group()


def test_fsdp1_without_a_device_mesh_is_refused(tmp_path, capsys):
    """FSDP1 wrapped without a device mesh (not how verl wraps it: see test_reshard_fsdp1) saves ShardedTensor
    model shards, which are refused."""
    from verl_cluster.cli import main

    step = tmp_path / "global_step_1"
    spawn(save_fsdp1_worker, 2, str(step))
    optim = torch.load(step / "actor" / "optim_world_size_2_rank_0.pt", weights_only=False)
    assert all(v["exp_avg"].dim() == 1 for v in optim["state"].values())  # flat parameters
    assert main(["reshard", str(tmp_path), "--world-size", "3"]) == 2
    assert "FSDP1" in capsys.readouterr().err
    (step / "actor" / "fsdp_config.json").unlink()  # without the config the tensors themselves tell
    assert main(["reshard", str(tmp_path), "--world-size", "3"]) == 2
    msg = capsys.readouterr().err
    assert "ShardedTensor" in msg and "strategy=fsdp2" in msg
    assert not any(p.name.startswith(".reshard") for p in step.iterdir())


def _lora_model(world: int, seed: int):
    from peft import LoraConfig, get_peft_model
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy
    from transformers import Qwen2Config, Qwen2ForCausalLM
    from verl.utils.fsdp_utils import apply_fsdp2

    torch.manual_seed(seed)
    cfg = Qwen2Config(hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, vocab_size=130)
    model = get_peft_model(Qwen2ForCausalLM(cfg), LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    apply_fsdp2(model, {"mesh": init_device_mesh("cpu", (world,), mesh_dim_names=["fsdp"]),
                        "mp_policy": MixedPrecisionPolicy(param_dtype=torch.float32)}, {})
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    return model, opt


def _lora_state(model, opt) -> dict:
    return {k: v for k, v in _full_state(model, opt).items() if "lora_" in k}


def lora_worker(rank: int, world: int, port: int, step_dir: str, out: str, save: bool) -> None:
    """verl's LoRA-only save (checkpoint.save_lora_only) of a peft model under FSDP2, or its load."""
    from omegaconf import OmegaConf
    from verl.utils.checkpoint.fsdp_checkpoint_manager import FSDPCheckpointManager

    _init(rank, world, port)
    model, opt = _lora_model(world, seed=1 if save else 2)
    manager = FSDPCheckpointManager(model, opt, None, checkpoint_config=OmegaConf.create({"save_lora_only": True}))
    if save:
        torch.manual_seed(100 + rank)
        model(input_ids=torch.randint(0, 130, (2, 6))).logits.pow(2).mean().backward()
        opt.step()
        manager.save_checkpoint(os.path.join(step_dir, "actor"), global_step=1)
    else:
        manager.load_checkpoint(os.path.join(step_dir, "actor"))
    state = _lora_state(model, opt)
    if rank == 0:
        torch.save(state, Path(out) / ("expected.pt" if save else "loaded.pt"))
    torch.distributed.destroy_process_group()


def test_lora_only_checkpoint_2_to_3(tmp_path):
    """A LoRA run's adapter-only checkpoint has the same DTensor layout: resharded and loaded like the rest."""
    pytest.importorskip("peft")
    root = tmp_path / "ckpt"
    step = root / "global_step_1"
    spawn(lora_worker, 2, str(step), str(tmp_path), True)
    saved = torch.load(step / "actor" / "model_world_size_2_rank_0.pt", weights_only=False)
    assert saved and all("lora_" in k for k in saved)  # adapters only
    result = reshard(step, 3, out_dir=tmp_path / "ws3")
    assert any("LoRA" in n for n in result.plan.notes)
    spawn(lora_worker, 3, str(tmp_path / "ws3" / "global_step_1"), str(tmp_path), False)
    expected = torch.load(tmp_path / "expected.pt", weights_only=False)
    loaded = torch.load(tmp_path / "loaded.pt", weights_only=False)
    assert any("/exp_avg_sq" in k for k in expected) and set(expected) == set(loaded)
    for k, v in expected.items():
        assert torch.equal(loaded[k], v), k


def _fixture_dir() -> Path | None:
    env = os.environ.get("VERL_CLUSTER_WS1_CKPT")
    path = Path(env) if env else FIXTURE
    return path if path.is_dir() else None


def build_fsdp1(model, world: int, use_orig_params: bool = False):
    """verl's FSDP1 wrapping (verl/workers/engine/fsdp/transformer_impl.py, strategy=fsdp) on the CPU: its wrap
    policy, sharding strategy and 1-D device mesh, flat parameters (verl's default use_orig_params=False), fp32."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp import MixedPrecision
    from verl.utils.fsdp_utils import get_fsdp_wrap_policy
    from verl.workers.engine.fsdp.utils import get_sharding_strategy

    mesh = init_device_mesh("cpu", (world,), mesh_dim_names=["fsdp"])
    fp32 = MixedPrecision(param_dtype=torch.float32, reduce_dtype=torch.float32, buffer_dtype=torch.float32)
    return FSDP(model, auto_wrap_policy=get_fsdp_wrap_policy(model, {}), device_id=torch.device("cpu"),
                sharding_strategy=get_sharding_strategy(mesh), mixed_precision=fp32, device_mesh=mesh,
                use_orig_params=use_orig_params)


def fsdp1_full_state(model) -> dict:
    """Every parameter of an FSDP1 model, gathered (a collective: all ranks call it)."""
    from torch.distributed.fsdp import FullStateDictConfig, StateDictType
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    with FSDP.state_dict_type(model, StateDictType.FULL_STATE_DICT, FullStateDictConfig(rank0_only=False)):
        return {k: v.detach().clone() for k, v in model.state_dict().items()}


@pytest.mark.skipif(_fixture_dir() is None, reason="no world-size-1 verl checkpoint (tests/fixtures/verl_ckpt_ws1 "
                                                   "or VERL_CLUSTER_WS1_CKPT)")
def test_real_gpu_checkpoint_ws1_to_2(tmp_path):
    """A checkpoint a real verl 0.9.1 run wrote on an H100 (FSDP1, verl's default; world size 1, where FSDP1 saves
    plain full tensors; model and extra state): resharded 1 -> 2 for CPU and loaded by 2 gloo ranks through
    verl's manager into verl's FSDP1 wrapping; then 2 -> 1 gives back the original tensors bit for bit."""
    src = _fixture_dir()
    result = reshard(src, 2, out_dir=tmp_path / "ws2", device="cpu")
    assert result.plan.from_world_size == 1 and result.plan.fsdp1
    step = tmp_path / "ws2" / f"global_step_{result.plan.step}"
    out = tmp_path / "loaded"
    out.mkdir()
    spawn(fixture_load_worker, 2, str(step), str(out))
    full = torch.load(out / "loaded.pt", weights_only=False)
    back = reshard(tmp_path / "ws2", 1, out_dir=tmp_path / "ws1")
    for role in result.plan.roles:
        saved = Path(result.plan.step_dir) / role
        original = torch.load(saved / "model_world_size_1_rank_0.pt", weights_only=False, map_location="cpu")
        again = torch.load(tmp_path / "ws1" / step.name / role / "model_world_size_1_rank_0.pt",
                           weights_only=False, map_location="cpu")
        assert original and set(original) == set(again) and all(type(v) is torch.Tensor for v in again.values())
        for k, v in original.items():
            assert torch.equal(full[f"{role}/{k}"], v), k
            assert torch.equal(again[k], v) and again[k].dtype == v.dtype, k
        assert json.loads((step / role / "fsdp_config.json").read_text()) == {"FSDP_version": 1, "world_size": 2}
        for r in range(2):  # rank 0's RNG carried; rank 1's re-seeded; the lr scheduler on both
            extra = torch.load(step / role / f"extra_state_world_size_2_rank_{r}.pt", weights_only=False)
            assert full[f"{role}/lr_scheduler/{r}"] == extra["lr_scheduler"]
    assert (step / "data.pt").read_bytes() == (src / step.name / "data.pt").read_bytes()
    assert back.plan.from_world_size == 2


def fixture_load_worker(rank: int, world: int, port: int, step_dir: str, out: str) -> None:
    """Load the resharded fixture through verl's manager (model and extra state, as saved) into verl's FSDP1
    wrapping of a model built from its saved HF config."""
    from omegaconf import OmegaConf
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForTokenClassification
    from verl.utils.checkpoint.fsdp_checkpoint_manager import FSDPCheckpointManager

    _init(rank, world, port)
    full = {}
    for role in sorted(p.name for p in Path(step_dir).iterdir() if p.is_dir()):
        cfg = AutoConfig.from_pretrained(os.path.join(step_dir, role, "huggingface"))
        cls = AutoModelForTokenClassification if role == "critic" else AutoModelForCausalLM
        torch.manual_seed(1234)  # not the checkpoint's weights: loading must replace every one
        model = build_fsdp1(cls.from_config(cfg, torch_dtype=torch.float32), world)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-5)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
        contents = OmegaConf.create({"load_contents": ["model", "extra"], "save_contents": ["model", "extra"]})
        FSDPCheckpointManager(model, opt, sched, checkpoint_config=contents).load_checkpoint(
            os.path.join(step_dir, role))
        full.update({f"{role}/{k}": v for k, v in fsdp1_full_state(model).items()})
        states = [None] * world
        torch.distributed.all_gather_object(states, sched.state_dict())
        full.update({f"{role}/lr_scheduler/{r}": st for r, st in enumerate(states)})
    if rank == 0:
        torch.save(full, Path(out) / "loaded.pt")
    torch.distributed.destroy_process_group()
