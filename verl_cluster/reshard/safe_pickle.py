"""The unpickler for rank files: a checkpoint folder is untrusted input (a job, or anyone able to write there, may
put a crafted file in it, and `watch` reshards it by itself), so reading one must run no code from it.

A pickle can name any importable object and call it. This reader only looks names up in an exact table of
(module, name) pairs — what torch.save writes for verl's FSDP1/FSDP2 rank files — built from the objects
themselves when first needed: nothing is imported while a file is read, a dotted name (which protocol 4 walks
attribute by attribute, e.g. from an allowed class to its functions' code type) is refused, and each entry is
checked to be the object its module defines. Calls are narrowed the same way: a pickle may call (REDUCE) only
the constructors and rebuild functions marked CALL; classes marked NEW are made with `cls.__new__` (NEWOBJ), so
none of their `__init__` runs (DeviceMesh's would join a process group over the network); BUILD sets state only
on objects of listed classes and never a dunder attribute; protocol 0/1 calls (INST, OBJ) are refused.
"""

from __future__ import annotations

import importlib
import io
import pickle
from typing import Any

CALL, NEW, REF = "call", "new", "ref"  # may be called / may be made by cls.__new__ and BUILD / a value only

# (module, name, kind): every global torch.save emits for verl's rank files, as listed from the data.pkl of FSDP2
# (1-D and HSDP), FSDP1, LoRA and world-size-1 files written by the suite's CPU torch 2.13 (torch 2.11 on the GPU
# machine emits the same); tests/unit/test_reshard_pickle_safety.py lists them again from files it writes
TORCH_GLOBALS: tuple[tuple[str, str, str], ...] = (
    ("collections", "OrderedDict", CALL),  # the state dicts
    ("torch", "Size", CALL),  # tensor and DTensor shapes
    ("torch", "device", CALL),  # a DTensor's device
    ("torch.serialization", "_get_layout", CALL),  # torch.strided, looked up by its name
    ("torch._utils", "_rebuild_tensor_v2", CALL),  # a tensor (read as a reference, see torchfile)
    ("torch._tensor", "_rebuild_from_type_v2", CALL),  # a tensor subclass: DTensor, or a tensor with attributes
    ("torch._utils", "_rebuild_wrapper_subclass", REF),  # DTensor's rebuild function: kept, written back, not called
    ("torch", "Tensor", REF),  # the type of a plain tensor saved with attributes (FSDP1's full state dict)
    ("torch.distributed.tensor", "DTensor", REF),  # the type passed to the two rebuild functions above
    ("torch.distributed.tensor._dtensor_spec", "DTensorSpec", NEW),  # DTensor._spec
    ("torch.distributed.tensor._dtensor_spec", "TensorMeta", NEW),  # DTensorSpec.tensor_meta (global shape)
    ("torch.distributed.tensor._dtensor_spec", "ShardOrderEntry", NEW),  # DTensorSpec.shard_order
    ("torch.distributed.device_mesh", "DeviceMesh", NEW),  # DTensorSpec.mesh
    ("torch.distributed._mesh_layout", "_MeshLayout", NEW),  # DeviceMesh._layout
    ("torch.distributed._mesh_layout", "_FlatLayout", NEW),  # the axes of a _MeshLayout
    ("torch.distributed.tensor.placement_types", "Shard", NEW),  # FSDP2's placement
    ("torch.distributed.tensor.placement_types", "Replicate", NEW),  # HSDP's replicated mesh dim
    # placements verl's FSDP does not save; loaded so that the reshard refuses them by name with its reason
    ("torch.distributed.tensor.placement_types", "Partial", NEW),
    ("torch.distributed.tensor.placement_types", "_StridedShard", NEW),
    # plain data in optimizer param_groups (protocol 2 names builtins `__builtin__`)
    *((m, n, CALL) for m in ("builtins", "__builtin__") for n in ("set", "frozenset", "complex")),
)
# dtypes (`torch float32`, in a DTensor's TensorMeta) and the storage classes of torch.save's storage records
# (`torch FloatStorage`), for the dtypes a reshard reads
DTYPES = ("float32", "float64", "float16", "bfloat16", "int8", "uint8", "int16", "int32", "int64", "bool",
          "complex64", "complex128")


class UnsupportedContent(Exception):
    """The file holds something this reader does not reshard (named in the message)."""


class RefusedPickle(UnsupportedContent):
    """A file whose pickle asks for a global outside the table, or a call this reader does not make; nothing
    from it was imported or run. `what` names the request (module.name, or the refused call)."""

    hint = ("verl's rank files pickle tensors, DTensors and plain data only: this file was not written by "
            "verl's checkpoint manager (or by a torch this tool does not know); nothing from it was run")

    def __init__(self, path: str, what: str):
        super().__init__(f"{path}: its pickle asks for {what}, which this reader does not load: it loads tensors, "
                         "DTensors and plain data only, and runs no other code from a checkpoint")
        self.path, self.what = path, what


def _show(text: str) -> str:
    return repr(text) if len(text) <= 80 else repr(text[:77]) + "..."


def _resolve(module: str, name: str) -> Any:
    """The object `module` defines as `name`, or None where it is not this torch's (entries that do not check
    out are left out, so refused)."""
    real = "builtins" if module == "__builtin__" else module
    try:
        obj = getattr(importlib.import_module(real), name)
    except (ImportError, AttributeError):
        return None
    if isinstance(obj, type) or callable(obj):
        return obj if getattr(obj, "__module__", None) == real else None
    return None


_TABLE: dict[tuple[str, str], tuple[Any, str]] = {}


def torch_globals() -> dict[tuple[str, str], tuple[Any, str]]:
    """{(module, name): (object, kind)}, built (and every listed module imported) on first use."""
    if not _TABLE:
        import torch

        table = {}
        for module, name, kind in TORCH_GLOBALS:
            obj = _resolve(module, name)
            if obj is not None:
                table[(module, name)] = (obj, kind)
        for name in DTYPES:
            dtype = getattr(torch, name)
            if isinstance(dtype, torch.dtype):
                table[("torch", name)] = (dtype, REF)
            storage = getattr(torch, torch.storage.TypedStorage(dtype=dtype, device="cpu",
                                                                _internal=True)._pickle_storage_type(), None)
            if isinstance(storage, type) and storage.__module__ == "torch":
                table[("torch", storage.__name__)] = (storage, REF)
        _TABLE.update(table)
    return _TABLE


class RestrictedUnpickler(pickle._Unpickler):
    """pickle's own (Python) unpickler with the table's rules on GLOBAL/STACK_GLOBAL, REDUCE, NEWOBJ and BUILD;
    `replace` maps a CALL entry to the callable used in its place."""

    dispatch = dict(pickle._Unpickler.dispatch)

    def __init__(self, data: bytes, path: str, replace: dict[tuple[str, str], Any] | None = None):
        super().__init__(io.BytesIO(data))
        self.path = path
        table = torch_globals()
        self._found = {key: (replace or {}).get(key, obj) for key, (obj, _) in table.items()}
        self._kinds = {key: kind for key, (_, kind) in table.items()}
        self._callable = {id(self._found[k]) for k, kind in self._kinds.items() if kind == CALL}
        self._classes = tuple({obj for obj, kind in table.values() if kind in (CALL, NEW) and isinstance(obj, type)})
        self._new = {id(self._found[k]) for k, kind in self._kinds.items() if kind == NEW}

    def refuse(self, what: str) -> RefusedPickle:
        return RefusedPickle(self.path, what)

    def find_class(self, module: str, name: str) -> Any:
        if "." in name:  # protocol 4 walks a dotted name attribute by attribute
            raise self.refuse(f"the dotted name {_show(module)} {_show(name)}")
        found = self._found.get((module, name))
        if found is None:
            self.unlisted(module, name)
            raise self.refuse(f"{_show(module)} {_show(name)}")
        return found

    def unlisted(self, module: str, name: str) -> None:
        """A hook to refuse an unlisted global with a more specific message (nothing is imported either way)."""

    def _called(self, func: Any) -> str:
        return getattr(func, "__qualname__", None) or type(func).__name__

    def load_reduce(self) -> None:
        args = self.stack.pop()
        func = self.stack[-1]
        if id(func) not in self._callable:
            raise self.refuse(f"a call of {_show(self._called(func))}")
        if type(args) is not tuple:
            raise self.refuse("a call with arguments that are not a tuple")
        self.stack[-1] = func(*args)

    def load_newobj(self) -> None:
        args = self.stack.pop()
        cls = self.stack[-1]
        if id(cls) not in self._new or type(args) is not tuple:
            raise self.refuse(f"a new {_show(self._called(cls))} object")
        self.stack[-1] = cls.__new__(cls, *args)

    def load_newobj_ex(self) -> None:
        kwargs = self.stack.pop()
        args = self.stack.pop()
        cls = self.stack.pop()
        if id(cls) not in self._new or type(args) is not tuple or type(kwargs) is not dict:
            raise self.refuse(f"a new {_show(self._called(cls))} object")
        self.append(cls.__new__(cls, *args, **kwargs))

    def load_build(self) -> None:
        state = self.stack[-1]
        inst = self.stack[-2]
        if not isinstance(inst, self._classes) or isinstance(inst, type):
            raise self.refuse(f"setting the state of a {_show(type(inst).__name__)} object")
        for part in (state if type(state) is tuple else (state,)):
            if part is not None and type(part) is not dict:
                raise self.refuse(f"a {type(inst).__name__} state that is not a dict")
            if part and any(type(k) is str and k.startswith("__") for k in part):
                raise self.refuse(f"setting a dunder attribute of a {type(inst).__name__} object")
        super().load_build()

    def load_inst(self) -> None:
        raise self.refuse("a protocol 0/1 instance (INST)")

    def load_obj(self) -> None:
        raise self.refuse("a protocol 0/1 instance (OBJ)")

    dispatch[pickle.REDUCE[0]] = load_reduce
    dispatch[pickle.NEWOBJ[0]] = load_newobj
    dispatch[pickle.NEWOBJ_EX[0]] = load_newobj_ex
    dispatch[pickle.BUILD[0]] = load_build
    dispatch[pickle.INST[0]] = load_inst
    dispatch[pickle.OBJ[0]] = load_obj
