"""Reshard one kind of rank file (model or optimizer) from W source files to M new ones.

Each source file is opened as a tree with its DTensors as references (`torchfile`). The trees of all ranks are
walked together; every DTensor becomes, for new rank j, a DTensor with the same global shape, dtype and stride,
the new mesh and placement, and a local tensor that is read from the source pieces covering rank j's rows only
when the writer reaches it. Everything else (optimizer steps, param_groups, buffers) is rank 0's, unchanged.

FSDP1 model files hold the same DTensors (verl gives FSDP1 a device mesh), except at world size 1, where FSDP1
runs unsharded (NO_SHARD) and saves plain full tensors and loads plain ones: with `fsdp1`, a world-size-1 file's
tensors are the pieces, and a world-size-1 target is written as plain full tensors.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

import torch

from verl_cluster.reshard.layout import expect_state_dict
from verl_cluster.reshard.shards import (MeshShape, Pieces, assemble, chunk_bounds, fresh_dtensor, fresh_mesh,
                                         gather_pieces, new_mesh, new_spec, segments)
from verl_cluster.reshard.torchfile import (OutStorage, OutTensor, RefusedPickle, TensorRef, TorchFile,
                                            UnsupportedContent, WrapperRef, normalize_location, open_torch_file,
                                            write_torch_file)


@dataclass
class FileSetStats:
    dtensors: int = 0
    bytes_written: int = 0
    largest_tensor_bytes: int = 0
    largest_tensor: str = ""
    notes: list[str] = field(default_factory=list)


def _pair_dtensors(trees: list[Any], path: str, out: dict[int, tuple[str, list[WrapperRef]]]) -> None:
    """Find each DTensor of rank 0's tree and the same one in every other rank's tree."""
    first = trees[0]
    if isinstance(first, WrapperRef):
        if id(first) not in out:
            if not all(isinstance(t, WrapperRef) for t in trees):
                raise UnsupportedContent(f"{path} is a DTensor on some ranks only")
            out[id(first)] = (path, list(trees))
        return
    if isinstance(first, dict):
        for k in first:
            if not all(isinstance(t, dict) and k in t for t in trees):
                raise UnsupportedContent(f"rank files differ in structure at {path}/{k}")
            _pair_dtensors([t[k] for t in trees], f"{path}/{k}", out)
    elif isinstance(first, (list, tuple)) and not hasattr(first, "_fields"):
        if not all(isinstance(t, (list, tuple)) and len(t) == len(first) for t in trees):
            raise UnsupportedContent(f"rank files differ in structure at {path}")
        for i in range(len(first)):
            _pair_dtensors([t[i] for t in trees], f"{path}/{i}", out)


def _has_sharded_looking_tensor(o: Any) -> bool:
    """A tensor of at least one dimension anywhere in the tree (an optimizer's `step` is 0-d)."""
    if isinstance(o, torch.Tensor):
        return o.dim() > 0
    if isinstance(o, dict):
        return any(_has_sharded_looking_tensor(v) for v in o.values())
    if isinstance(o, (list, tuple)):
        return any(_has_sharded_looking_tensor(v) for v in o)
    return False


def _rebuild(o: Any, replace: dict[int, Any]) -> Any:
    if id(o) in replace:
        return replace[id(o)]
    if isinstance(o, dict):
        new = type(o)() if type(o) is not dict else {}
        for k, v in o.items():
            new[k] = _rebuild(v, replace)
        return new
    if isinstance(o, list):
        return [_rebuild(v, replace) for v in o]
    if isinstance(o, tuple) and not hasattr(o, "_fields"):
        return tuple(_rebuild(v, replace) for v in o)
    return o


def _wrapper_args(args: tuple, location: str) -> tuple:
    """The wrapper's own device follows its local tensor's written location."""
    dev = torch.device(location)
    return tuple(dev if isinstance(a, torch.device) else a for a in args)


@dataclass
class _Planned:
    path: str
    source: WrapperRef | TensorRef  # a DTensor, or an FSDP1 world-size-1 file's plain full tensor
    pieces: Pieces


def _plain_pieces(tf: TorchFile) -> dict[int, _Planned]:
    """The full tensors of a world-size-1 FSDP1 model file (a flat dict of them)."""
    out = {}
    for k, v in tf.obj.items() if isinstance(tf.obj, dict) else ():
        if isinstance(v, TensorRef) and v.shape:
            if not v.is_contiguous():
                raise UnsupportedContent(f"{tf.path}: {k} is not contiguous (stride {v.stride})")
            out[id(v)] = _Planned(f"/{k}", v, Pieces(tuple(v.shape), 0, [(tf, v, (0, v.shape[0]))]))
    return out


def reshard_file_set(sources: list[Path], dests: list[Path], target: MeshShape, device: Optional[str] = None,
                     progress: Optional[Callable[[str], None]] = None, fsdp1: bool = False) -> FileSetStats:
    """Write `dests` (one per new rank) from `sources` (one per old rank, in rank order); `fsdp1`: model files
    of an FSDP1 run (plain full tensors at world size 1)."""
    files: list[TorchFile] = []
    stats = FileSetStats()
    plain_source = fsdp1 and len(sources) == 1
    try:
        for p in sources:
            try:
                files.append(open_torch_file(str(p), keep_plain=plain_source))
            except RefusedPickle:
                raise  # names the file already, and carries its own hint
            except UnsupportedContent as e:
                raise UnsupportedContent(f"{p}: {e}") from None
            expect_state_dict(Path(p), files[-1].obj)
        pairs: dict[int, tuple[str, list[WrapperRef]]] = {}
        _pair_dtensors([f.obj for f in files], "", pairs)
        plain = _plain_pieces(files[0]) if plain_source else {}
        if not pairs and not plain and _has_sharded_looking_tensor(files[0].obj):
            raise UnsupportedContent(f"{sources[0]}: plain tensors, no DTensor shards (not a verl FSDP2 checkpoint); "
                                     "copying rank 0's would be wrong on every other rank")
        planned: dict[int, _Planned] = {}
        for key, (path, refs) in pairs.items():
            try:
                pieces = gather_pieces(files, refs)
            except UnsupportedContent as e:
                raise UnsupportedContent(f"{sources[0].name}{path}: {e}") from None
            planned[key] = _Planned(path, refs[0], pieces)
            if pieces.nbytes > stats.largest_tensor_bytes:
                stats.largest_tensor_bytes, stats.largest_tensor = pieces.nbytes, path.lstrip("/")
        planned.update(plain)
        for item in plain.values():
            if item.pieces.nbytes > stats.largest_tensor_bytes:
                stats.largest_tensor_bytes, stats.largest_tensor = item.pieces.nbytes, item.path.lstrip("/")
        stats.dtensors = len(planned)
        for j, dest in enumerate(dests):
            out_obj = _rank_tree(files[0].obj, planned, target, j, device, plain_target=fsdp1 and len(dests) == 1)
            stats.bytes_written += write_torch_file(str(dest), out_obj, device)
            if progress:
                progress(f"wrote {dest.name}")
    finally:
        for f in files:
            f.close()
    return stats


def _rank_tree(tree: Any, planned: dict[int, _Planned], target: MeshShape, rank: int,
               device: Optional[str], plain_target: bool = False) -> Any:
    """Rank `rank`'s tree: DTensors with its pieces, or (`plain_target`: FSDP1 at world size 1) full tensors."""
    meshes: dict[Any, Any] = {}
    storages: dict[tuple, OutStorage] = {}
    replace: dict[int, Any] = {}
    for key, item in planned.items():
        src, pieces = item.source, item.pieces
        local = src if isinstance(src, TensorRef) else src.local
        loc = normalize_location(local.storage.location, device)
        if plain_target:
            n = pieces.shape[pieces.dim]
            replace[key] = _out_tensor(local, pieces, 0, n, loc, storages)
            continue
        if isinstance(src, TensorRef):
            if "fresh" not in meshes:
                meshes["fresh"] = fresh_mesh(target, rank, loc.split(":", 1)[0])
            src = fresh_dtensor(src, meshes["fresh"], target)
            spec = src.spec
        else:
            if id(src.spec.mesh) not in meshes:
                meshes[id(src.spec.mesh)] = new_mesh(src.spec.mesh, target, rank, device)
            spec = new_spec(src.spec, meshes[id(src.spec.mesh)], target, pieces.dim)
        idx = target.coordinate(rank)[-1]
        a, b = chunk_bounds(pieces.shape[pieces.dim], target.fsdp_size)[idx]
        slots = dict(src.slots)
        slots["_local_tensor"] = _out_tensor(local, pieces, a, b, loc, storages)
        slots["_spec"] = spec
        state = tuple(slots if isinstance(p, dict) and "_local_tensor" in p else p for p in src.state) \
            if isinstance(src.state, tuple) else slots
        replace[key] = WrapperRef(src.func, src.new_type, _wrapper_args(src.args, loc), state)
    return _rebuild(tree, replace)


def _out_tensor(local: TensorRef, pieces: Pieces, a: int, b: int, loc: str,
                storages: dict[tuple, OutStorage]) -> OutTensor:
    """Rows [a, b) of the sharded dim, contiguous; one storage for tensors that shared one (tied weights)."""
    local_shape = pieces.shape[:pieces.dim] + (b - a,) + pieces.shape[pieces.dim + 1:]
    stride, acc = [], 1
    for s in reversed(local_shape):
        stride.append(acc)
        acc *= s
    skey = (local.storage.key, local.offset, tuple(local.shape))
    st = storages.get(skey)
    if st is None:
        numel = 1
        for s in local_shape:
            numel *= s
        st = storages[skey] = OutStorage(local.dtype, numel, loc, **_source_of(pieces, a, b))
    return OutTensor(st, 0, local_shape, tuple(reversed(stride)), local.requires_grad, local.extra)


def _source_of(pieces: Pieces, a: int, b: int) -> dict[str, Callable]:
    """How the writer gets rows [a, b): streamed from the source files' byte ranges (dim 0, FSDP2's), or
    assembled whole (another dim)."""
    if pieces.dim == 0:
        return {"segments": lambda: segments(pieces, a, b)}
    return {"produce": lambda: assemble(pieces, a, b)}
