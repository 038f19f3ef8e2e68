"""Where each rank's piece of a DTensor lies, and the DTensor metadata of a new world size.

FSDP2 (`fully_shard`) gives every parameter — and every optimizer moment, which has the parameter's placement —
the placement `Shard(0)` over the `fsdp` mesh dim (and `Replicate()` over `ddp` when verl's `fsdp_size` builds
a 2-D HSDP mesh). A rank's local piece is its `torch.chunk` of the dim: ceil(n / shards) rows each, the last
ranks shorter or empty. Resharding is therefore exact: the new pieces are row ranges of the same bytes.
"""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass
from typing import Any

import torch

from verl_cluster.reshard.torchfile import TensorRef, TorchFile, UnsupportedContent, WrapperRef


def chunk_bounds(n: int, parts: int) -> list[tuple[int, int]]:
    """Row ranges of `torch.chunk(n rows, parts)` as DTensor's Shard places them: empty ranges at the end."""
    size = -(-n // parts) if n else 0
    return [(min(i * size, n), min((i + 1) * size, n)) for i in range(parts)]


@dataclass(frozen=True)
class MeshShape:
    """The device mesh of a world size as verl builds it: 1-D `fsdp`, or 2-D (`ddp`, `fsdp`) with fsdp_size."""

    world_size: int
    fsdp_size: int  # ranks a tensor is sharded over

    @property
    def sizes(self) -> tuple[int, ...]:
        if self.fsdp_size >= self.world_size:
            return (self.world_size,)
        return (self.world_size // self.fsdp_size, self.fsdp_size)

    @property
    def dim_names(self) -> tuple[str, ...]:
        return ("fsdp",) if len(self.sizes) == 1 else ("ddp", "fsdp")

    def coordinate(self, rank: int) -> tuple[int, ...]:
        return (rank,) if len(self.sizes) == 1 else (rank // self.fsdp_size, rank % self.fsdp_size)


def _numel(shape: Any) -> int:
    n = 1
    for s in (shape if isinstance(shape, tuple) else (shape,)):
        if isinstance(s, tuple):
            s = _numel(s)
        if type(s) is not int or s < 0:
            raise UnsupportedContent(f"a device mesh layout with a size that is not a count ({s!r:.40})")
        n *= s
    return n


def _fields(o: Any) -> dict:
    d = getattr(o, "__dict__", None)
    if not isinstance(d, dict):
        raise UnsupportedContent(f"a DTensor mesh holding a {type(o).__name__} where torch pickles an object")
    return d


def mesh_sizes(mesh: Any) -> tuple[int, ...]:
    """The dim sizes of a pickled DeviceMesh, read from its saved fields, not through this torch's methods: the
    pickle changes between releases (torch 2.11 saves `_MeshLayout(shape, stride)`, 2.13 `axes` of
    `_FlatLayout`s, older ones a `mesh` tensor), and a mesh from another release is still read right."""
    state = _fields(mesh)
    if isinstance(state.get("mesh"), torch.Tensor):
        return tuple(state["mesh"].shape)
    layout = _fields(state.get("_layout"))
    if isinstance(layout.get("axes"), tuple):
        return tuple(_numel(_fields(axis).get("shape", ())) for axis in layout["axes"])
    if "shape" in layout:
        shape = layout["shape"]
        return tuple(_numel(s) for s in (shape if isinstance(shape, tuple) else (shape,)))
    raise UnsupportedContent("a device mesh whose layout this tool does not know (saved by another torch release?)")


def source_mesh_shape(world_size: int, ref: WrapperRef) -> MeshShape:
    sizes = mesh_sizes(ref.spec.mesh)
    total = 1
    for s in sizes:
        total *= s
    if total != world_size:
        raise UnsupportedContent(f"a DTensor on a {'x'.join(map(str, sizes))} mesh in a world of {world_size} ranks")
    if len(sizes) > 2:
        raise UnsupportedContent(f"a {len(sizes)}-D device mesh (only verl's fsdp and ddp x fsdp meshes)")
    return MeshShape(world_size, sizes[-1])


def shard_dim(ref: WrapperRef) -> tuple[int, int]:
    """(mesh dim, tensor dim) of the one Shard placement; every other mesh dim must be Replicate."""
    from torch.distributed.tensor import Replicate, Shard

    found = None
    for mesh_dim, p in enumerate(ref.spec.placements):
        if type(p) is Shard:
            if found is not None:
                raise UnsupportedContent("a tensor sharded over two mesh dims (tensor parallel?)")
            found = (mesh_dim, p.dim)
        elif type(p) is not Replicate:
            raise UnsupportedContent(f"placement {p} (only Shard and Replicate)")
    if found is None:
        raise UnsupportedContent("a DTensor with no Shard placement")
    return found


@dataclass
class Pieces:
    """The source pieces of one DTensor: for each shard index, the file and local ref that hold it."""

    shape: tuple[int, ...]
    dim: int  # tensor dim it is sharded along
    sources: list[tuple[TorchFile, TensorRef, tuple[int, int]]]  # (file, local ref, global range on `dim`)

    @property
    def nbytes(self) -> int:
        n = torch.empty(0, dtype=self.sources[0][1].dtype).element_size()
        for s in self.shape:
            n *= s
        return n


def gather_pieces(files: list[TorchFile], refs: list[WrapperRef]) -> Pieces:
    """Match each source rank's local piece of one DTensor to its range of the global tensor."""
    first = refs[0]
    mesh_dim, dim = shard_dim(first)
    mesh = source_mesh_shape(len(files), first)
    shape = tuple(first.spec.tensor_meta.shape)
    parts = mesh.sizes[mesh_dim]
    bounds = chunk_bounds(shape[dim], parts)
    chosen: dict[int, tuple[TorchFile, TensorRef, tuple[int, int]]] = {}
    for rank, (tf, ref) in enumerate(zip(files, refs)):
        coord = mesh.coordinate(rank)
        if any(c != 0 for d, c in enumerate(coord) if d != mesh_dim):
            continue  # a replica: the first replica's pieces are the tensor
        idx = coord[mesh_dim]
        local = ref.local
        if not local.is_contiguous():
            raise UnsupportedContent(f"rank {rank}'s piece is not contiguous (stride {local.stride})")
        a, b = bounds[idx]
        want = shape[:dim] + (b - a,) + shape[dim + 1:]
        if tuple(local.shape) != want:
            raise UnsupportedContent(f"rank {rank}'s piece has shape {tuple(local.shape)}, expected {want} "
                                     f"(an uneven sharding this tool does not know)")
        chosen[idx] = (tf, local, (a, b))
    if len(chosen) != parts:
        raise UnsupportedContent(f"pieces for {len(chosen)} of {parts} shards")
    return Pieces(shape, dim, [chosen[i] for i in range(parts)])


def segments(pieces: Pieces, a: int, b: int) -> list[tuple[TorchFile, int, int]]:
    """Rows [a, b) of a dim-0 sharded tensor as byte ranges of the source files: (file, offset, nbytes)."""
    out = []
    for tf, ref, (s, e) in pieces.sources:
        lo, hi = max(a, s), min(b, e)
        if lo < hi:
            out.append(tf.byte_range(ref, lo - s, hi - s))
    return out


def assemble(pieces: Pieces, a: int, b: int) -> torch.Tensor:
    """Range [a, b) along a sharded dim other than 0, read whole from the pieces that cover it."""
    dim = pieces.dim
    out_shape = pieces.shape[:dim] + (b - a,) + pieces.shape[dim + 1:]
    dtype = pieces.sources[0][1].dtype
    parts = []
    for tf, ref, (s, e) in pieces.sources:
        lo, hi = max(a, s), min(b, e)
        if lo < hi:
            parts.append(tf.read(ref).narrow(dim, lo - s, hi - lo))
    return torch.cat(parts, dim=dim).contiguous() if parts else torch.empty(out_shape, dtype=dtype)


def new_mesh(src_mesh: Any, target: MeshShape, rank: int, device: str | None) -> Any:
    """The source DeviceMesh's pickled state, changed to `rank` of a `target` mesh, so the loading run's mesh
    compares equal to it. Its fields are this torch's: reshard with the torch version that trains (the
    DeviceMesh pickle changes between torch releases)."""
    mesh = object.__new__(type(src_mesh))
    state = dict(vars(src_mesh))
    state.pop("_pg_registry", None)
    sizes = target.sizes
    strides = tuple(int(torch.tensor(sizes[i + 1:]).prod()) if i + 1 < len(sizes) else 1 for i in range(len(sizes)))
    src_sizes = mesh_sizes(src_mesh)
    state["_layout"] = _layout_like(src_mesh._layout, sizes, strides)
    state["_rank_map"] = torch.arange(target.world_size, dtype=src_mesh._rank_map.dtype)
    state["_flatten_rank_map"] = tuple(range(target.world_size))
    state["_mesh_dim_names"] = target.dim_names
    state["_rank"] = rank
    state["_coordinate_on_dim"] = target.coordinate(rank)
    state["_hash"] = None
    state["_flatten_mapping"] = {}
    # DTensors find their process groups by these names. A 1-D mesh over every rank uses the default group
    # (torch names it "0"); a 2-D mesh of the same fsdp size keeps the saving run's names (verl creates its
    # groups in the same order); any other 2-D target gets names that resolve to no group, so a collective on
    # a loaded tensor fails loudly instead of running over the wrong ranks (an optimizer step runs none)
    names = list(state.get("_dim_group_names") or [])
    if names and len(sizes) == 1:
        state["_dim_group_names"] = names if len(src_sizes) == 1 else ["0"]
    elif names and (len(src_sizes) != len(sizes) or src_sizes[-1] != sizes[-1]):
        state["_dim_group_names"] = [f"unknown-after-reshard-{d}" for d in range(len(sizes))]
    if device:
        state["_device_type"] = device
    mesh.__dict__.update(state)
    mesh._pg_registry = {}
    return mesh


def _layout_like(src: Any, sizes: tuple[int, ...], strides: tuple[int, ...]) -> Any:
    """A mesh layout of `sizes` in the form the source's torch pickled it: torch 2.11's (shape, stride) fields
    are kept as such, so the new files load in the torch that wrote the old ones; else this torch's."""
    layout = vars(src)
    if "axes" not in layout and "shape" in layout and "stride" in layout:
        new = object.__new__(type(src))
        new.__dict__.update(shape=tuple(sizes), stride=tuple(strides))
        return new
    return type(src).from_sizes_strides(sizes, strides)


def new_spec(src_spec: Any, mesh: Any, target: MeshShape, dim: int) -> Any:
    from torch.distributed.tensor import Replicate, Shard

    placements = (Shard(dim),) if len(target.sizes) == 1 else (Replicate(), Shard(dim))
    spec = copy.copy(src_spec)
    fields = {f.name for f in dataclasses.fields(spec)} if dataclasses.is_dataclass(spec) else set()
    object.__setattr__(spec, "mesh", mesh)
    object.__setattr__(spec, "placements", placements)
    if "shard_order" in fields:
        object.__setattr__(spec, "shard_order", type(src_spec).compute_default_shard_order(placements)
                           if hasattr(type(src_spec), "compute_default_shard_order") else src_spec.shard_order)
    for cached in ("_hash",):
        if cached in vars(spec):
            object.__setattr__(spec, cached, None)
    return spec


def fresh_mesh(target: MeshShape, rank: int, device_type: str) -> Any:
    """A DeviceMesh for `rank` of `target`, as verl's 1-D `init_device_mesh` pickles it, for a source that had
    none (FSDP1 at world size 1 saves plain tensors). The 1-D mesh over every rank names the default group."""
    from torch.distributed.device_mesh import DeviceMesh

    if len(target.sizes) != 1:
        raise UnsupportedContent("a 2-D (HSDP) mesh for a checkpoint saved without one")
    mesh = DeviceMesh(device_type, torch.arange(target.world_size), mesh_dim_names=target.dim_names,
                      _init_backend=False, _rank=rank)
    mesh._dim_group_names = ["0"]
    return mesh


def fresh_dtensor(ref: TensorRef, mesh: Any, target: MeshShape) -> WrapperRef:
    """A DTensor placeholder of `ref`'s global shape, Shard(0) on `mesh`; its local tensor is set by the caller."""
    from torch.distributed.tensor import DTensor, Shard
    from torch.distributed.tensor._dtensor_spec import DTensorSpec, TensorMeta

    spec = DTensorSpec(mesh, (Shard(0),), TensorMeta(torch.Size(ref.shape), tuple(ref.stride), ref.dtype))
    _, (func, new_type, args, state) = DTensor(torch.empty(0, dtype=ref.dtype), spec,
                                               requires_grad=False).__reduce_ex__(2)
    return WrapperRef(func, new_type, args, state)
