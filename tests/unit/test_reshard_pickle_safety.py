"""A rank file is untrusted input (a job, or anyone able to write into trainer.default_local_dir, can plant one,
and `watch` reshards by itself): the reshard's unpickler loads only the globals torch.save writes for verl's
rank files, imports nothing and runs nothing else. Fuzzed pickles (GLOBAL / STACK_GLOBAL / REDUCE / NEWOBJ /
BUILD sequences, protocols 2 and 4) are refused with exit 2 and leave a canary file and `sys.modules` as they
were; FSDP2 rank files written here by torch itself, and the GPU-written fixture, still reshard."""

from __future__ import annotations

import json
import os
import pickle
import pickletools
import shutil
import socket
import struct
import sys
import zipfile
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from verl_cluster.cli import main  # noqa: E402
from verl_cluster.reshard import reshard  # noqa: E402
from verl_cluster.reshard.torchfile import UnsupportedContent, open_torch_file  # noqa: E402

FIXTURE = Path(__file__).resolve().parent.parent / "fixtures" / "verl_ckpt_ws1"
CANARY_MODULE = "vc_reshard_canary_module"  # written below; importing it appends to the canary file
DTENSOR = "torch.distributed.tensor"


@pytest.fixture(autouse=True)
def _own_home(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))


# ---------------------------------------------------------------- pickles written opcode by opcode


class _Pickle:
    def __init__(self, proto: int):
        self.proto = proto
        self.out = bytearray(pickle.PROTO + bytes([proto]))

    def op(self, code: bytes) -> "_Pickle":
        self.out += code
        return self

    def text(self, s: str) -> None:
        b = s.encode("utf-8", "surrogatepass")
        self.out += pickle.BINUNICODE + struct.pack("<I", len(b)) + b

    def value(self, v) -> None:
        if v is None:
            self.op(pickle.NONE)
        elif v is True or v is False:
            self.op(pickle.NEWTRUE if v else pickle.NEWFALSE)
        elif type(v) is int:
            self.op(pickle.BININT + struct.pack("<i", v) if -2**31 <= v < 2**31 else
                    pickle.LONG1 + bytes([len(pickle.encode_long(v))]) + pickle.encode_long(v))
        elif type(v) is float:
            self.op(pickle.BINFLOAT + struct.pack(">d", v))
        elif type(v) is str:
            self.text(v)
        elif type(v) is bytes:
            self.op(pickle.BINBYTES + struct.pack("<I", len(v)) + v)
        elif type(v) is tuple:
            self.op(pickle.MARK)
            for x in v:
                self.value(x)
            self.op(pickle.TUPLE)
        elif type(v) is list:
            self.op(pickle.EMPTY_LIST + pickle.MARK)
            for x in v:
                self.value(x)
            self.op(pickle.APPENDS)
        elif type(v) is dict:
            self.op(pickle.EMPTY_DICT + pickle.MARK)
            for k, x in v.items():
                self.value(k)
                self.value(x)
            self.op(pickle.SETITEMS)
        else:
            raise AssertionError(v)

    def glob(self, module: str, name: str) -> None:
        """STACK_GLOBAL under protocol 4 (which walks dotted names), GLOBAL under 2."""
        if self.proto >= 4:
            self.text(module)
            self.text(name)
            self.op(pickle.STACK_GLOBAL)
        else:
            self.op(pickle.GLOBAL + f"{module}\n{name}\n".encode("utf-8", "surrogatepass"))

    def statement(self, s: tuple) -> None:
        """Push one object: ("ref", g) | ("call", g, args) | ("new", g, args) | ("build", g, args, state)
        (a call, then BUILD) | ("newbuild", g, state) (NEWOBJ with no arguments, then BUILD)."""
        kind, (module, name) = s[0], s[1]
        self.glob(module, name)
        if kind == "call":
            self.value(s[2])
            self.op(pickle.REDUCE)
        elif kind == "new":
            self.value(s[2])
            self.op(pickle.NEWOBJ)
        elif kind == "build":
            self.value(s[2])
            self.op(pickle.REDUCE)
            self.value(s[3])
            self.op(pickle.BUILD)
        elif kind == "newbuild":
            self.op(pickle.EMPTY_TUPLE + pickle.NEWOBJ)
            self.value(s[2])
            self.op(pickle.BUILD)

    def program(self, statements: list) -> bytes:
        self.op(pickle.EMPTY_LIST)
        for s in statements:
            self.statement(s)
            self.op(pickle.APPEND)
        return bytes(self.out + pickle.STOP)


def _torch_file(path: Path, data: bytes) -> Path:
    """A torch.save zip holding `data` as its pickle (and no storage records)."""
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("archive/data.pkl", data)
        z.writestr("archive/version", "3\n")
        z.writestr("archive/byteorder", "little")
    return path


def _payload_code(canary: Path) -> tuple:
    """CodeType's arguments for `open(canary, 'w').write('ran')` on this Python."""
    c = compile(f"open({str(canary)!r}, 'w').write('ran')", "payload", "exec")
    names = ["co_argcount", "co_posonlyargcount", "co_kwonlyargcount", "co_nlocals", "co_stacksize", "co_flags",
             "co_code", "co_consts", "co_names", "co_varnames", "co_filename", "co_name", "co_qualname",
             "co_firstlineno", "co_linetable", "co_exceptiontable", "co_freevars", "co_cellvars"]
    if sys.version_info < (3, 11):
        names = [n for n in names if n not in ("co_qualname", "co_exceptiontable")]
    return tuple(getattr(c, n) for n in names)


def code_attack(canary: Path, then: bytes = b"") -> bytes:
    """The issue's attack: protocol 4 STACK_GLOBAL with dotted names walks from an allowed class (DTensor) to
    FunctionType and CodeType; a function is built from a code object and called while the file loads. `then`:
    the rest of a real rank file's pickle (without its PROTO), so the file otherwise loads as it was."""
    p = _Pickle(4)
    p.glob(DTENSOR, "DTensor.__init__.__class__")  # FunctionType
    p.glob(DTENSOR, "DTensor.__init__.__code__.__class__")  # CodeType
    p.value(_payload_code(canary))
    p.op(pickle.REDUCE)  # a code object
    p.value({})  # its globals
    p.op(pickle.TUPLE2 + pickle.REDUCE)  # a function
    p.op(pickle.EMPTY_TUPLE + pickle.REDUCE + pickle.POP)  # called, its result dropped
    if then:
        return bytes(p.out) + then
    p.value({"model.weight": None})
    return bytes(p.out + pickle.STOP)


def _craft(rank_file: Path, canary: Path) -> None:
    """Put the attack in front of a real rank file's own pickle, keeping its tensor records."""
    with zipfile.ZipFile(rank_file) as z:
        records = {n: z.read(n) for n in z.namelist()}
    name = next(n for n in records if n.endswith("/data.pkl"))
    records[name] = code_attack(canary, then=records[name][2:])
    with zipfile.ZipFile(rank_file, "w") as z:
        for n, data in records.items():
            z.writestr(n, data)


@pytest.fixture(scope="module")
def hostile_env(tmp_path_factory):
    """A canary file, a never-imported module that writes to it when imported, and every listed module
    imported (the reader's table is built on first use)."""
    from verl_cluster.reshard import safe_pickle

    safe_pickle.torch_globals()
    root = tmp_path_factory.mktemp("hostile")
    canary = root / "canary"
    canary.write_text("untouched")
    (root / f"{CANARY_MODULE}.py").write_text(
        f"open({str(canary)!r}, 'a').write(' imported')\ndef run(*a):\n    open({str(canary)!r}, 'a').write(' ran')\n")
    sys.path.insert(0, str(root))
    yield root, canary
    sys.path.remove(str(root))
    sys.modules.pop(CANARY_MODULE, None)


def _modules() -> set[str]:
    return set(sys.modules)


def _refused(path: Path, canary: Path):
    """open_torch_file(path) refuses it, having imported and run nothing."""
    before = _modules()
    with pytest.raises(UnsupportedContent) as info:
        open_torch_file(str(path))
    assert canary.read_text() == "untouched"
    assert _modules() == before
    from verl_cluster.reshard.safe_pickle import RefusedPickle

    assert isinstance(info.value, RefusedPickle) and str(path) in str(info.value)
    return info.value


# ---------------------------------------------------------------- the known attacks, one by one


@pytest.mark.parametrize("proto", [2, 4])
@pytest.mark.parametrize("module, name", [
    ("builtins", "eval"), ("__builtin__", "eval"), ("os", "system"), ("posix", "system"), ("subprocess", "call"),
    (CANARY_MODULE, "run"),  # never imported before: find_class must not import it to look
    ("torch.distributed.tensor._api", "DTensor"),  # the allowed class, under a name torch.save does not write
    ("torch.nn.parameter", "Parameter"), ("torch", "load"),
    ("torch.distributed", "init_process_group"),
    (DTENSOR, "DTensor.__init__.__code__.__class__"), (DTENSOR, "DTensor.__init__.__globals__"),
    ("collections", "OrderedDict.fromkeys"),
])
def test_globals_outside_the_list_are_refused_before_any_import(hostile_env, tmp_path, proto, module, name):
    root, canary = hostile_env
    arg = f"open({str(canary)!r}, 'w').write('ran')" if name == "eval" else f"echo ran > {canary}"
    f = _torch_file(tmp_path / "model_world_size_2_rank_0.pt",
                    _Pickle(proto).program([("call", (module, name), (arg,))]))
    e = _refused(f, canary)
    assert repr(module) in e.what and repr(name) in e.what and ("dotted" in e.what) == ("." in name)


def test_the_code_object_attack_is_refused(hostile_env, tmp_path):
    _, canary = hostile_env
    e = _refused(_torch_file(tmp_path / "model_world_size_2_rank_0.pt", code_attack(canary)), canary)
    assert "DTensor.__init__.__class__" in e.what


@pytest.mark.parametrize("statement, what", [
    # listed classes that may only be made with cls.__new__: calling one runs its __init__
    (("call", ("torch.distributed.device_mesh", "DeviceMesh"), ("cpu", [0])), "a call of 'DeviceMesh'"),
    (("call", (f"{DTENSOR}._dtensor_spec", "DTensorSpec"), ()), "a call of 'DTensorSpec'"),
    (("call", ("torch", "Tensor"), ((3,),)), "a call of 'Tensor'"),  # a value only
    (("call", ("torch._utils", "_rebuild_wrapper_subclass"), ()), "a call of '_rebuild_wrapper_subclass'"),
    (("new", ("collections", "OrderedDict"), ()), "a new 'OrderedDict' object"),
    (("newbuild", (f"{DTENSOR}.placement_types", "Shard"), {"__class__": None}), "dunder attribute"),
    (("build", ("collections", "OrderedDict"), (), {"__dict__": {}}), "dunder attribute"),
])
def test_listed_globals_are_only_used_as_torch_uses_them(hostile_env, tmp_path, statement, what):
    _, canary = hostile_env
    f = _torch_file(tmp_path / "f.pt", _Pickle(2).program([statement]))
    assert what in _refused(f, canary).what


def test_a_device_mesh_in_a_file_joins_no_process_group(hostile_env, tmp_path, monkeypatch):
    """DeviceMesh's __init__ would set up torch.distributed from the environment (a TCP rendezvous)."""
    _, canary = hostile_env
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(port))
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    f = _torch_file(tmp_path / "f.pt", _Pickle(2).program(
        [("call", ("torch.distributed.device_mesh", "DeviceMesh"), ("cpu", [0]))]))
    try:
        _refused(f, canary)
        assert not torch.distributed.is_initialized()
    finally:
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()


# ---------------------------------------------------------------- fuzzing

ARGS = st.recursive(
    st.none() | st.booleans() | st.integers(-2**40, 2**40) | st.sampled_from(["cpu", "torch.strided", "ran"])
    | st.text(max_size=12) | st.binary(max_size=8),
    lambda inner: st.tuples(inner, inner) | st.lists(inner, max_size=3)
    | st.dictionaries(st.sampled_from(["dim", "mesh", "_local_tensor", "__class__", "__dict__"]), inner, max_size=2),
    max_leaves=6)

LISTED = [("collections", "OrderedDict"), ("torch", "Size"), ("torch", "device"), ("torch", "float32"),
          ("torch", "BFloat16Storage"), ("torch", "FloatStorage"), ("torch", "Tensor"),
          ("torch.serialization", "_get_layout"), ("torch._utils", "_rebuild_tensor_v2"),
          ("torch._utils", "_rebuild_wrapper_subclass"), ("torch._tensor", "_rebuild_from_type_v2"),
          (DTENSOR, "DTensor"), (f"{DTENSOR}._dtensor_spec", "DTensorSpec"),
          (f"{DTENSOR}._dtensor_spec", "TensorMeta"), ("torch.distributed.device_mesh", "DeviceMesh"),
          ("torch.distributed._mesh_layout", "_MeshLayout"), (f"{DTENSOR}.placement_types", "Shard"),
          (f"{DTENSOR}.placement_types", "Replicate"), ("__builtin__", "set"), ("builtins", "frozenset")]
UNLISTED = [("builtins", "eval"), ("builtins", "exec"), ("builtins", "getattr"), ("builtins", "__import__"),
            ("__builtin__", "open"), ("os", "system"), ("posix", "system"), ("subprocess", "Popen"),
            (CANARY_MODULE, "run"), ("torch", "load"), ("torch.distributed", "init_process_group"),
            ("torch.distributed.device_mesh", "init_device_mesh"), (DTENSOR, "distribute_tensor"),
            (f"{DTENSOR}._api", "DTensor"), ("torch.nn.parameter", "Parameter"), ("shutil", "rmtree"),
            (DTENSOR, "DTensor.__init__.__code__.__class__"), (DTENSOR, "DTensor.__init__.__class__"),
            (DTENSOR, "DTensor.__init__.__globals__"), ("torch", "Size.__class__"),
            ("torch.distributed.device_mesh", "DeviceMesh.__init__"), ("collections", "OrderedDict.__class__")]
NAMES = st.from_regex(r"\A[A-Za-z_]{1,10}(\.[A-Za-z_]{1,10}){0,3}\Z")
# modules that do not exist, so a reader that imports to look does no harm here (the canary module covers that)
ANY_UNLISTED = st.sampled_from(UNLISTED) | st.tuples(NAMES.map(lambda n: f"vc_no_such_{n}"), NAMES)
VALID = [("call", ("collections", "OrderedDict"), ()), ("call", ("torch", "Size"), ((2, 3),)),
         ("call", ("torch", "device"), ("cpu",)), ("call", ("__builtin__", "set"), ((1, 2),)),
         ("call", ("torch.serialization", "_get_layout"), ("torch.strided",)),
         ("newbuild", (f"{DTENSOR}.placement_types", "Shard"), {"dim": 0}),
         ("newbuild", (f"{DTENSOR}.placement_types", "Replicate"), {}),
         ("ref", ("torch", "bfloat16")), ("ref", (DTENSOR, "DTensor"))]


@st.composite
def _hostile_statement(draw):
    kind = draw(st.sampled_from(["ref", "call", "new", "build", "newbuild"]))
    g = draw(ANY_UNLISTED)
    args = draw(st.tuples(ARGS) | st.just(()))
    rest = {"ref": (), "call": (args,), "new": (args,), "build": (args, draw(ARGS)), "newbuild": (draw(ARGS),)}
    return (kind, g, *rest[kind])


FUZZ = settings(max_examples=250, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


@FUZZ
@given(data=st.data())
def test_fuzz_any_global_outside_the_list_is_refused(hostile_env, tmp_path, data):
    """Valid statements and at least one naming a global outside the list, in any order, protocol 2 or 4:
    refused at the first unlisted global, which the error names, with nothing imported or run."""
    _, canary = hostile_env
    proto = data.draw(st.sampled_from([2, 4]))
    hostile = data.draw(st.lists(_hostile_statement(), min_size=1, max_size=3))
    program = data.draw(st.permutations(data.draw(st.lists(st.sampled_from(VALID), max_size=4)) + hostile))
    first = next(s for s in program if s in hostile)
    f = _torch_file(tmp_path / "model_world_size_2_rank_0.pt", _Pickle(proto).program(program))
    e = _refused(f, canary)
    module, name = first[1]
    assert repr(module)[:40] in e.what and repr(name)[:40] in e.what


_OPS = [pickle.REDUCE, pickle.BUILD, pickle.NEWOBJ, pickle.EMPTY_TUPLE, pickle.EMPTY_DICT, pickle.EMPTY_LIST,
        pickle.MARK, pickle.TUPLE, pickle.TUPLE1, pickle.TUPLE2, pickle.APPEND, pickle.SETITEM, pickle.SETITEMS,
        pickle.POP, pickle.DUP, pickle.NONE, pickle.BINPUT + b"\x01", pickle.BINGET + b"\x01"]


@FUZZ
@given(data=st.data())
def test_fuzz_opcode_sequences_never_run_or_import_anything(hostile_env, tmp_path, data):
    """Arbitrary sequences of GLOBAL / STACK_GLOBAL (listed or not), REDUCE, BUILD, NEWOBJ and stack opcodes:
    a file either loads (listed globals used as torch uses them) or is refused (UnsupportedContent, exit 2);
    it never loads with an unlisted global in it, and never imports or runs anything."""
    _, canary = hostile_env
    proto = data.draw(st.sampled_from([2, 4]))
    p = _Pickle(proto)
    unlisted = False
    for _ in range(data.draw(st.integers(1, 14))):
        step = data.draw(st.sampled_from(["listed", "unlisted", "op", "value"]))
        if step == "listed":
            p.glob(*data.draw(st.sampled_from(LISTED)))
        elif step == "unlisted":
            unlisted = True
            p.glob(*data.draw(ANY_UNLISTED))
        elif step == "op":
            p.op(data.draw(st.sampled_from(_OPS)))
        else:
            p.value(data.draw(ARGS))
    f = _torch_file(tmp_path / "f.pt", bytes(p.out + pickle.STOP))
    before = _modules()
    try:
        open_torch_file(str(f))
        loaded = True
    except UnsupportedContent:
        loaded = False
    assert canary.read_text() == "untouched" and _modules() == before
    assert not (loaded and unlisted)


# ---------------------------------------------------------------- real rank files still reshard


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def save_fsdp2_worker(rank: int, world: int, port: int, root: str) -> None:
    """torch's own FSDP2 (fully_shard on a 1-D CPU mesh, gloo) saves a model and its AdamW state per rank as
    verl's manager does; plus a bf16 DTensor on a 2-D (ddp, fsdp) mesh for the list of globals."""
    import warnings

    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    warnings.filterwarnings("ignore")
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.distributed.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(13, 6), torch.nn.Linear(6, 5))  # 13 rows: uneven pieces
    mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("fsdp",))
    for m in model:
        fully_shard(m, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model(torch.tensor([[1, 2, 3], [4, 5, 12]])).pow(2).mean().backward()
    opt.step()
    role = Path(root) / "global_step_1" / "actor"
    role.mkdir(parents=True, exist_ok=True)
    torch.save(model.state_dict(), role / f"model_world_size_{world}_rank_{rank}.pt")
    torch.save(opt.state_dict(), role / f"optim_world_size_{world}_rank_{rank}.pt")
    torch.save({"lr_scheduler": None, "rng": {"cpu": torch.get_rng_state()}},
               role / f"extra_state_world_size_{world}_rank_{rank}.pt")
    full = {k: v.full_tensor() for k, v in model.state_dict().items()}
    mesh2 = init_device_mesh("cpu", (1, world), mesh_dim_names=("ddp", "fsdp"))
    probe = distribute_tensor(torch.arange(10.0).to(torch.bfloat16), mesh2, [Replicate(), Shard(0)])
    torch.save({"bf16": probe}, Path(root) / f"probe_rank_{rank}.pt")
    if rank == 0:
        (role / "fsdp_config.json").write_text(json.dumps({"FSDP_version": 2, "world_size": world}))
        (Path(root) / "latest_checkpointed_iteration.txt").write_text("1")
        torch.save(full, Path(root) / "full.pt")
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()


@pytest.fixture(scope="module")
def fsdp2_ckpt(tmp_path_factory):
    import torch.multiprocessing as mp

    root = tmp_path_factory.mktemp("fsdp2")
    mp.start_processes(save_fsdp2_worker, args=(2, _free_port(), str(root)), nprocs=2, join=True,
                       start_method="spawn")
    return root


def _globals(path: Path) -> set[str]:
    with zipfile.ZipFile(path) as z:
        data = z.read(next(n for n in z.namelist() if n.endswith("/data.pkl")))
    ops = list(pickletools.genops(data))
    assert not any(op.name == "STACK_GLOBAL" for op, _, _ in ops)  # torch.save writes protocol 2
    return {arg for op, arg, _ in ops if op.name == "GLOBAL"}


# exactly what torch.save wrote for these files with the suite's torch 2.13 (model and AdamW state on a 1-D mesh)
FSDP2_GLOBALS = {
    "collections OrderedDict", "torch FloatStorage", "torch IntStorage", "torch Size", "torch device",
    "torch float32", "torch._tensor _rebuild_from_type_v2", "torch._utils _rebuild_tensor_v2",
    "torch._utils _rebuild_wrapper_subclass", "torch.distributed._mesh_layout _FlatLayout",
    "torch.distributed._mesh_layout _MeshLayout", "torch.distributed.device_mesh DeviceMesh",
    "torch.distributed.tensor DTensor", "torch.distributed.tensor._dtensor_spec DTensorSpec",
    "torch.distributed.tensor._dtensor_spec ShardOrderEntry", "torch.distributed.tensor._dtensor_spec TensorMeta",
    "torch.distributed.tensor.placement_types Shard", "torch.serialization _get_layout"}
# a bf16 DTensor on a 2-D (ddp, fsdp) mesh: other dtype and storage, and HSDP's Replicate
PROBE_GLOBALS = FSDP2_GLOBALS - {"torch FloatStorage", "torch float32"} | {
    "torch BFloat16Storage", "torch bfloat16", "torch.distributed.tensor.placement_types Replicate"}
# the fixture's model file, written by verl's FSDP1 at world size 1 with torch 2.11 on an H100
FIXTURE_GLOBALS = {"collections OrderedDict", "torch FloatStorage", "torch Tensor",
                   "torch._tensor _rebuild_from_type_v2", "torch._utils _rebuild_tensor_v2"}


def test_torch_save_writes_only_listed_globals(fsdp2_ckpt):
    from verl_cluster.reshard.safe_pickle import torch_globals

    table = torch_globals()
    role = fsdp2_ckpt / "global_step_1" / "actor"
    assert set().union(*(_globals(p) for p in role.glob("[mo]*_rank_*.pt"))) == FSDP2_GLOBALS
    assert _globals(fsdp2_ckpt / "probe_rank_0.pt") == PROBE_GLOBALS
    assert set().union(*(_globals(p) for p in FIXTURE.glob("global_step_*/*/model_*.pt"))) == FIXTURE_GLOBALS
    for g in FSDP2_GLOBALS | PROBE_GLOBALS | FIXTURE_GLOBALS:
        module, name = g.split(" ")
        assert (module, name) in table, g
        assert getattr(sys.modules[module], name) is table[(module, name)][0]  # the object that module defines
    tf = open_torch_file(str(fsdp2_ckpt / "probe_rank_0.pt"))
    assert tf.obj["bf16"].new_type.__name__ == "DTensor"
    tf.close()


def test_fsdp2_rank_files_reshard_2_to_3_to_1(fsdp2_ckpt, tmp_path, capsys):
    from torch.distributed.tensor import DTensor

    full = torch.load(fsdp2_ckpt / "full.pt", weights_only=True)
    assert main(["reshard", str(fsdp2_ckpt), "--world-size", "3", "--out", str(tmp_path / "ws3")]) == 0
    assert "done:" in capsys.readouterr().out
    assert main(["reshard", str(tmp_path / "ws3"), "--world-size", "1", "--out", str(tmp_path / "ws1")]) == 0
    for world, root in ((3, tmp_path / "ws3"), (1, tmp_path / "ws1")):
        role = root / "global_step_1" / "actor"
        states = [torch.load(role / f"model_world_size_{world}_rank_{r}.pt", weights_only=False)
                  for r in range(world)]
        for k, v in full.items():
            pieces = [s[k] for s in states]
            assert all(isinstance(p, DTensor) and p.device_mesh.size() == world for p in pieces)
            assert torch.equal(torch.cat([p._local_tensor for p in pieces]), v), k


def test_the_gpu_written_fixture_reshards_1_to_2_and_back(tmp_path):
    result = reshard(FIXTURE, 2, out_dir=tmp_path / "ws2", device="cpu")
    step = f"global_step_{result.plan.step}"
    reshard(tmp_path / "ws2", 1, out_dir=tmp_path / "ws1")
    for role in result.plan.roles:
        saved = torch.load(FIXTURE / step / role / "model_world_size_1_rank_0.pt", weights_only=False,
                           map_location="cpu")
        again = torch.load(tmp_path / "ws1" / step / role / "model_world_size_1_rank_0.pt", weights_only=False,
                           map_location="cpu")
        assert saved and set(saved) == set(again) and all(torch.equal(again[k], v) for k, v in saved.items())


# ---------------------------------------------------------------- through the CLI


def test_cli_refuses_the_crafted_rank_file_naming_it(fsdp2_ckpt, hostile_env, tmp_path, capsys):
    """The issue's case: `reshard` on a folder with a crafted model_world_size_2_rank_0.pt printed "done",
    exit 0, after its payload wrote a file."""
    _, canary = hostile_env
    ckpt = tmp_path / "ckpt"
    shutil.copytree(fsdp2_ckpt, ckpt)
    crafted = ckpt / "global_step_1" / "actor" / "model_world_size_2_rank_0.pt"
    _craft(crafted, canary)
    before = _modules()
    assert main(["reshard", str(ckpt), "--world-size", "1"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    errors = [s for s in lines if s.startswith("error:")]
    assert len(errors) == 1 and str(crafted) in errors[0] and "DTensor.__init__.__class__" in errors[0]
    assert any("nothing from it was run" in s for s in lines) and not any("Traceback" in s for s in lines)
    assert canary.read_text() == "untouched" and CANARY_MODULE not in sys.modules
    assert {m for m in _modules() - before if not m.startswith("verl_cluster.")} == set()  # the CLI's own, lazily
    assert not list(ckpt.rglob("*world_size_1*")) and not list(ckpt.rglob(".reshard-*"))


def test_a_symlinked_tracker_is_refused_without_echoing_its_target(tmp_path, capsys):
    secret = tmp_path / "secret"
    secret.write_text("hunter2-SECRET-TOKEN")
    role = tmp_path / "ckpt" / "global_step_1" / "actor"
    role.mkdir(parents=True)
    for k in ("model", "optim", "extra_state"):
        (role / f"{k}_world_size_1_rank_0.pt").write_bytes(b"x")
    (tmp_path / "ckpt" / "latest_checkpointed_iteration.txt").symlink_to(secret)
    assert main(["reshard", str(tmp_path / "ckpt"), "--world-size", "2", "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "latest_checkpointed_iteration.txt" in err and "symbolic link" in err and "hunter2" not in err


def test_a_planted_symlink_at_the_config_scratch_name_is_not_followed(fsdp2_ckpt, tmp_path, capsys):
    """In place, fsdp_config.json is switched through `.fsdp_config.json.tmp` in the (untrusted) role folder."""
    ckpt = tmp_path / "ckpt"
    shutil.copytree(fsdp2_ckpt, ckpt)
    target = tmp_path / "target"
    target.write_text("keep")
    role = ckpt / "global_step_1" / "actor"
    (role / ".fsdp_config.json.tmp").symlink_to(target)
    assert main(["reshard", str(ckpt), "--world-size", "3"]) == 0
    assert target.read_text() == "keep"
    cfg = role / "fsdp_config.json"
    assert not cfg.is_symlink() and json.loads(cfg.read_text())["world_size"] == 3
