"""Read and write `torch.save` files a block at a time.

`torch.load` reads every storage of a file; a 7B optimizer shard does not fit that way next to its neighbours.
Here a file's pickle is read alone: plain (small) tensors are materialised, while each DTensor's local tensor
stays a `TensorRef` (storage key, dtype, shape, stride) whose bytes are read later with `pread` from the
record's offset in the (uncompressed) zip. Writing mirrors `torch.save`: the pickle goes first — it needs
only shapes — then each storage record is streamed in when its turn comes (a sharded tensor in blocks read from
the source files, a small plain tensor whole).
"""

from __future__ import annotations

import io
import itertools
import logging
import os
import pickle
import random
import struct
import sys
import zipfile
from collections import OrderedDict
from dataclasses import dataclass, field
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable, Iterable, Iterator

import torch

from verl_cluster.reshard.safe_pickle import RefusedPickle, RestrictedUnpickler, UnsupportedContent  # noqa: F401

DTENSOR_CLASS = ("torch.distributed.tensor", "DTensor")
SHARD_MODULE = "torch.distributed._shard"  # ShardedTensor and its metadata


@dataclass
class StorageRef:
    """A storage record of a source file (`data/<key>`)."""

    path: str
    key: str
    dtype: torch.dtype
    numel: int  # elements of `dtype`
    location: str  # as saved: "cpu", "cuda:0", ...

    @property
    def nbytes(self) -> int:
        return self.numel * _itemsize(self.dtype)


@dataclass
class TensorRef:
    """A tensor of a source file whose bytes have not been read."""

    storage: StorageRef
    offset: int  # in elements
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    requires_grad: bool = False
    extra: tuple = ()  # further `_rebuild_tensor_v2` arguments (backward hooks, metadata)

    @property
    def dtype(self) -> torch.dtype:
        return self.storage.dtype

    def is_contiguous(self) -> bool:
        expect = 1
        for size, stride in zip(reversed(self.shape), reversed(self.stride)):
            if size != 1 and stride != expect:
                return False
            expect *= size
        return True


@dataclass
class WrapperRef:
    """A tensor subclass as `_rebuild_from_type_v2(func, type, args, state)` rebuilds it (DTensor)."""

    func: Any
    new_type: type
    args: tuple
    state: Any

    @property
    def slots(self) -> dict:
        """The dict holding `_local_tensor` and `_spec` (DTensor pickles them as slot state)."""
        for part in (self.state if isinstance(self.state, tuple) else (self.state,)):
            if isinstance(part, dict) and "_local_tensor" in part:
                return part
        raise UnsupportedContent(f"a {self.new_type.__name__} without a local tensor")

    @property
    def local(self) -> TensorRef:
        return self.slots["_local_tensor"]

    @property
    def spec(self) -> Any:
        return self.slots["_spec"]


def _itemsize(dtype: torch.dtype) -> int:
    return torch.empty(0, dtype=dtype).element_size()


_STORAGE_DTYPES: dict[str, torch.dtype] = {}


def _storage_type_name(dtype: torch.dtype) -> str:
    return torch.storage.TypedStorage(dtype=dtype, device="cpu", _internal=True)._pickle_storage_type()


def _storage_dtype(storage_type: Any) -> torch.dtype:
    if not _STORAGE_DTYPES:
        for dt in (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8, torch.uint8, torch.int16,
                   torch.int32, torch.int64, torch.bool, torch.complex64, torch.complex128):
            _STORAGE_DTYPES[_storage_type_name(dt)] = dt
    name = storage_type.__name__ if isinstance(storage_type, type) else type(storage_type).__name__
    if name not in _STORAGE_DTYPES:
        raise UnsupportedContent(f"storage type {name}")
    return _STORAGE_DTYPES[name]


class _MetaUnpickler(RestrictedUnpickler):
    """Unpickles a torch.save pickle with tensors as references, under `safe_pickle`'s table of globals."""

    def __init__(self, data: bytes, path: str):
        super().__init__(data, path, {("torch._utils", "_rebuild_tensor_v2"): _rebuild_ref,
                                      ("torch._tensor", "_rebuild_from_type_v2"): _rebuild_wrapper_ref})
        self.storages: dict[str, StorageRef] = {}

    def persistent_load(self, pid):
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage"):
            raise UnsupportedContent(f"an unknown persistent record {pid!r:.80}")
        _, storage_type, key, location, numel = pid
        dtype = _storage_dtype(storage_type)
        ref = self.storages.get(str(key))
        if ref is None:
            ref = self.storages[str(key)] = StorageRef(self.path, str(key), dtype, int(numel), str(location))
        return ref

    def unlisted(self, module: str, name: str) -> None:
        if module.startswith(SHARD_MODULE):
            raise UnsupportedContent("ShardedTensor values (FSDP1's sharded state dict without a device mesh; "
                                     "verl gives FSDP1 one and saves DTensors)")
        if module == "torch._utils" and name.startswith("_rebuild_"):
            raise UnsupportedContent(f"a tensor kind this tool does not read ({name[:60]})")


def plain_ref(o: Any) -> "TensorRef | None":
    """`o` as a plain tensor's ref: a TensorRef, or a plain tensor pickled with attributes (FSDP1's full state
    dict marks each tensor `_has_been_cloned`), whose attributes are dropped; None for anything else."""
    if isinstance(o, TensorRef):
        return o
    if isinstance(o, WrapperRef) and o.new_type is torch.Tensor and o.func is _rebuild_ref:
        return o.func(*o.args)
    return None


def _rebuild_ref(storage: StorageRef, offset, shape, stride, requires_grad=False, *extra) -> TensorRef:
    if not (isinstance(storage, StorageRef) and type(offset) is int and _ints(shape) and _ints(stride)
            and len(shape) == len(stride)):
        raise UnsupportedContent("a tensor record unlike torch's (storage, offset, shape, stride)")
    return TensorRef(storage, offset, tuple(shape), tuple(stride), bool(requires_grad), tuple(extra))


def _ints(v: Any) -> bool:
    return isinstance(v, tuple) and all(type(x) is int and x >= 0 for x in v)


def _rebuild_wrapper_ref(func, new_type, args, state) -> WrapperRef:
    """`torch._tensor._rebuild_from_type_v2`, kept as a reference: a DTensor (rebuilt by
    `_rebuild_wrapper_subclass`) or a plain tensor with attributes; nothing of it is called here."""
    from torch.distributed.tensor import DTensor

    if not (new_type in (torch.Tensor, DTensor) and type(args) is tuple
            and (func is _rebuild_ref or func is torch._utils._rebuild_wrapper_subclass)):
        raise UnsupportedContent("a tensor subclass record unlike torch's for a tensor or DTensor")
    return WrapperRef(func, new_type, args, state)


@dataclass
class TorchFile:
    """One `torch.save` file opened for reading: its object tree (tensors as refs) and record offsets."""

    path: str
    obj: Any
    storages: dict[str, StorageRef]
    offsets: dict[str, int] = field(default_factory=dict)
    _fd: int | None = None

    def read(self, ref: TensorRef, index: tuple[int, int] | None = None) -> torch.Tensor:
        """The tensor `ref` (or rows [a, b) of its first dim), read from disk into a new CPU tensor."""
        if not ref.is_contiguous():
            raise UnsupportedContent(f"{self.path}: a non-contiguous sharded tensor")
        a, b = index if index is not None else (0, ref.shape[0] if ref.shape else 1)
        out = torch.empty((b - a,) + tuple(ref.shape[1:]), dtype=ref.dtype)
        self.read_into(ref, a, b, out)
        return out

    def read_into(self, ref: TensorRef, a: int, b: int, out: torch.Tensor) -> None:
        """Rows [a, b) of `ref` (contiguous) straight into `out` (contiguous, same dtype)."""
        _, start, nbytes = self.byte_range(ref, a, b)
        if nbytes:
            self.pread_into(memoryview(out.reshape(-1).view(torch.uint8).numpy()), start)

    def byte_range(self, ref: TensorRef, a: int, b: int) -> tuple["TorchFile", int, int]:
        """(this file, offset, length) of rows [a, b) of `ref`, a contiguous tensor."""
        item = _itemsize(ref.dtype)
        row = item
        for s in ref.shape[1:]:
            row *= s
        return self, self.offsets[ref.storage.key] + ref.offset * item + a * row, (b - a) * row

    def pread_into(self, view: memoryview, offset: int) -> None:
        if self._fd is None:
            self._fd = os.open(self.path, os.O_RDONLY)
        done = 0
        while done < len(view):
            n = os.preadv(self._fd, [view[done:]], offset + done)
            if n <= 0:
                raise UnsupportedContent(f"{self.path}: cut short at byte {offset + done}")
            done += n

    def read_storage(self, ref: StorageRef) -> bytes:
        if self._fd is None:
            self._fd = os.open(self.path, os.O_RDONLY)
        return os.pread(self._fd, ref.nbytes, self.offsets[ref.key])

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def open_torch_file(path: str, keep_plain: bool = False) -> TorchFile:
    """Read `path`'s pickle (tensors as refs) and the offsets of its storage records; `keep_plain`: plain tensors
    of at least one dimension stay refs too (FSDP1's full tensors at world size 1, its flat optimizer shards)."""
    try:
        reader = torch._C.PyTorchFileReader(path)
    except RuntimeError as e:
        raise UnsupportedContent(f"not a torch.save zip file ({str(e).splitlines()[0]})") from None
    mesh_log = logging.getLogger("torch.distributed.device_mesh")
    level = mesh_log.level
    mesh_log.setLevel(logging.ERROR)  # "unpickling of the DeviceMesh occurred before the PGs were created": expected
    try:
        unpickler = _MetaUnpickler(reader.get_record("data.pkl"), path)
        obj = unpickler.load()
        offsets = {key: reader.get_record_offset(f"data/{key}") for key in unpickler.storages}
        size = os.path.getsize(path)
        for key, ref in unpickler.storages.items():
            if ref.numel < 0 or offsets[key] + ref.nbytes > size:
                raise UnsupportedContent(f"storage record {key[:40]!r} runs past the end of the file")
        return _materialize_plain(TorchFile(path, obj, unpickler.storages, offsets), keep_plain)
    except UnsupportedContent:
        raise
    except Exception as e:  # noqa: BLE001 - whatever a malformed file makes the reader raise, it is the file's
        first = next((ln for ln in str(e).splitlines() if ln.strip()), "")
        raise UnsupportedContent(f"its pickle does not load here ({type(e).__name__}: {first[:200]})") from None
    finally:
        mesh_log.setLevel(level)


def _materialize_plain(tf: TorchFile, keep_plain: bool = False) -> TorchFile:
    """Turn every tensor that is not a DTensor's local shard into a real CPU tensor (steps, buffers, meshes);
    `keep_plain`: only the 0-d ones (optimizer steps) and those inside DTensor specs."""
    cache: dict[int, Any] = {}
    storage_cache: dict[str, torch.UntypedStorage] = {}

    def real(ref: TensorRef) -> torch.Tensor:
        st = storage_cache.get(ref.storage.key)
        if st is None:
            buf = bytearray(tf.read_storage(ref.storage))
            st = torch.frombuffer(buf, dtype=torch.uint8).untyped_storage() if buf else torch.UntypedStorage(0)
            storage_cache[ref.storage.key] = st
            if st.nbytes():
                LOCATIONS[st.data_ptr()] = (st, ref.storage.location)
        t = torch.empty(0, dtype=ref.dtype)
        t.set_(st, ref.offset, ref.shape, ref.stride)
        return t

    def walk(o: Any) -> Any:
        if id(o) in cache:
            return cache[id(o)]
        if plain_ref(o) is not None:
            r = plain_ref(o) if keep_plain and plain_ref(o).shape else real(plain_ref(o))
        elif isinstance(o, WrapperRef):
            slots = o.slots
            slots["_spec"] = walk(slots["_spec"])
            r = o
        elif isinstance(o, dict):
            for k in list(o):
                o[k] = walk(o[k])
            r = o
        elif isinstance(o, list):
            o[:] = [walk(v) for v in o]
            r = o
        elif isinstance(o, tuple) and not hasattr(o, "_fields"):
            r = tuple(walk(v) for v in o)
        elif hasattr(o, "__dict__") and not isinstance(o, type) and type(o).__module__.startswith("torch.distributed"):
            for k, v in list(vars(o).items()):
                nv = walk(v)
                if nv is not v:
                    object.__setattr__(o, k, nv)
            r = o
        else:
            r = o
        cache[id(o)] = r
        return r

    tf.obj = walk(tf.obj)
    return tf


# where each materialised storage came from ("cuda:0", "cpu"), so it is written back to the same kind of device;
# keyed by data pointer; the storage is held so the pointer stays its own until forget_locations()
LOCATIONS: dict[int, tuple[torch.UntypedStorage, str]] = {}


def forget_locations() -> None:
    LOCATIONS.clear()


def _location(st: torch.UntypedStorage) -> str:
    held = LOCATIONS.get(st.data_ptr()) if st.nbytes() else None
    return held[1] if held is not None else "cpu"


@dataclass
class OutStorage:
    """A storage of an output file whose bytes are produced when the writer reaches it."""

    dtype: torch.dtype
    numel: int
    location: str
    produce: Callable[[], torch.Tensor] | None = None  # a contiguous tensor of exactly these bytes, or
    segments: Callable[[], list[tuple["TorchFile", int, int]]] | None = None  # where they lie in source files


@dataclass
class OutTensor:
    storage: OutStorage
    offset: int
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    requires_grad: bool = False
    extra: tuple = ()


def normalize_location(location: str, device: str | None) -> str:
    """The location to write: `device` when asked, else the saved kind without an index — `cuda` loads onto
    the loading process's current GPU, whatever index the saving process had."""
    if device:
        return device
    return location.split(":", 1)[0]


class _OutPickler(pickle.Pickler):
    def __init__(self, buf, device: str | None):
        super().__init__(buf, protocol=2)
        self.device = device
        self.keys: dict[int, str] = {}
        self.order: list[OutStorage | torch.UntypedStorage] = []
        self.locations: list[str] = []

    def _key(self, st: Any, location: str) -> str:
        ident = id(st) if isinstance(st, OutStorage) else st._cdata  # torch makes a new wrapper per access
        k = self.keys.get(ident)
        if k is None:
            k = self.keys[ident] = str(len(self.keys))
            self.order.append(st)
            self.locations.append(location)
        return k

    def persistent_id(self, obj):
        if isinstance(obj, OutStorage):
            key = self._key(obj, obj.location)
            return ("storage", getattr(torch, _storage_type_name(obj.dtype)), key, obj.location, obj.numel)
        if isinstance(obj, torch.storage.TypedStorage):
            untyped = obj._untyped_storage
            loc = normalize_location(_location(untyped), self.device)
            key = self._key(untyped, loc)
            return ("storage", getattr(torch, obj._pickle_storage_type()), key, loc, obj._size())
        if isinstance(obj, torch.UntypedStorage):
            loc = normalize_location(_location(obj), self.device)
            return ("storage", torch.UntypedStorage, self._key(obj, loc), loc, obj.nbytes())
        return None

    def reducer_override(self, obj):
        if isinstance(obj, OutTensor):
            return (torch._utils._rebuild_tensor_v2,
                    (obj.storage, obj.offset, obj.shape, obj.stride, obj.requires_grad, *obj.extra)
                    if obj.extra else
                    (obj.storage, obj.offset, obj.shape, obj.stride, obj.requires_grad, OrderedDict()))
        if isinstance(obj, WrapperRef):
            return (torch._tensor._rebuild_from_type_v2, (obj.func, obj.new_type, obj.args, obj.state))
        return NotImplemented


def _materialize(st: "OutStorage | torch.UntypedStorage") -> tuple[torch.UntypedStorage, int]:
    """The bytes of one record: a storage, and how many of its bytes to write."""
    if not isinstance(st, OutStorage):
        return st, st.nbytes()
    nbytes = st.numel * _itemsize(st.dtype)
    t = st.produce()
    if not t.is_contiguous() or t.numel() != st.numel:
        raise AssertionError("a produced tensor does not match its record")
    if t.storage_offset() != 0:
        t = t.clone()
    return t.untyped_storage(), nbytes


BLOCK = 64 << 20  # bytes per read; two blocks are in memory while records stream


def _split(segs: list[tuple["TorchFile", int, int]], block: int) -> list[tuple["TorchFile", int, int]]:
    return [(tf, off + i, min(block, n - i)) for tf, off, n in segs for i in range(0, n, block)]


def _block_count(segs: list[tuple["TorchFile", int, int]], block: int | None = None) -> int:
    block = block or BLOCK
    return sum(-(-n // block) for _, _, n in segs)


class _BlockReader:
    """Two reused block buffers and one reading thread for a whole reshard: fresh buffers per record would be
    zeroed and faulted in again, and a thread per record costs more than a small record's read."""

    def __init__(self):
        self.bufs: list[bytearray] = []
        self.pool: ThreadPoolExecutor | None = None
        self.pending: Future | None = None

    def blocks(self, segs: list[tuple["TorchFile", int, int]], block: int) -> Iterator[memoryview]:
        jobs = _split(segs, block)
        self._settle()
        if not jobs:
            return
        if len(self.bufs) != 2 or len(self.bufs[0]) != block:
            self.bufs = [bytearray(block), bytearray(block)]
        if self.pool is None:
            self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="reshard-read")
        try:
            self.pending = self.pool.submit(_read_block, jobs[0], self.bufs[0])
            for k in range(len(jobs)):
                view = self.pending.result()
                # the caller is done with the other buffer: it asked for this block
                self.pending = self.pool.submit(_read_block, jobs[k + 1], self.bufs[(k + 1) % 2]) \
                    if k + 1 < len(jobs) else None
                yield view
        finally:
            self._settle()

    def _settle(self) -> None:
        if self.pending is not None:
            self.pending.exception()  # wait: its buffer is about to be reused
            self.pending = None

    def close(self) -> None:
        self._settle()
        if self.pool is not None:
            self.pool.shutdown()
        self.__init__()


def _read_block(job: tuple["TorchFile | None", int, int], buf: bytearray) -> memoryview:
    tf, offset, n = job
    view = memoryview(buf)[:n]
    if tf is None:  # padding: zeros
        view[:] = bytes(n)
    else:
        tf.pread_into(view, offset)
    return view


_READER = _BlockReader()


def read_blocks(segs: list[tuple["TorchFile", int, int]], block: int | None = None) -> Iterator[memoryview]:
    """The bytes of `segs` (file, offset, length) in blocks; the next block is read while the caller uses
    this one (valid until the caller asks for the one after next)."""
    return _READER.blocks(segs, block or BLOCK)


def release_reader() -> None:
    _READER.close()


class _ZipOut:
    """The zip layout torch.save writes (stored records, each record's data 64-byte aligned through an "FB"
    extra field, zip64 where needed), with zlib's CRC-32: torch's own writer computes CRCs several times slower
    than the disk takes the bytes."""

    ALIGN = 64

    def __init__(self, path: str):
        self.archive = os.path.splitext(os.path.basename(path))[0] or "archive"
        self.zf = zipfile.ZipFile(path, "w", compression=zipfile.ZIP_STORED, allowZip64=True)

    def write(self, name: str, data: bytes | memoryview) -> None:
        view = memoryview(data).cast("B")
        self.write_stream(name, len(view), [view])

    def write_stream(self, name: str, nbytes: int, chunks: Iterable[memoryview]) -> None:
        info = zipfile.ZipInfo(f"{self.archive}/{name}", date_time=(1980, 1, 1, 0, 0, 0))
        info.compress_type = zipfile.ZIP_STORED
        info.file_size = nbytes
        start = self.zf.fp.tell() + 30 + len(info.filename.encode()) + 4 + 20  # header, FB field, zip64 field
        pad = -start % self.ALIGN
        info.extra = struct.pack("<HH", 0x4246, pad) + b"Z" * pad
        written = 0
        with self.zf.open(info, "w", force_zip64=True) as f:
            for chunk in chunks:
                f.write(chunk)
                written += len(chunk)
        if written != nbytes:
            raise AssertionError(f"record {name}: {written} bytes produced for {nbytes}")

    def close(self) -> None:
        self.write("version", b"3\n")
        self.write(".data/serialization_id", str(random.getrandbits(128)).zfill(40)[:40].encode())
        self.zf.close()


def _bytes_of(st: torch.UntypedStorage, nbytes: int) -> memoryview:
    if nbytes == 0:
        return memoryview(b"")
    return memoryview(torch.empty(0, dtype=torch.uint8).set_(st, 0, (nbytes,), (1,)).numpy())


def write_torch_file(path: str, obj: Any, device: str | None = None) -> int:
    """`torch.save(obj, path)` where `obj` may hold OutTensor/WrapperRef placeholders; storages are produced
    and written one at a time. Returns the bytes of tensor data written."""
    buf = io.BytesIO()
    pickler = _OutPickler(buf, device)
    pickler.dump(obj)
    writer = _ZipOut(path)
    try:
        writer.write("data.pkl", buf.getvalue())
        writer.write(".format_version", b"1")
        writer.write(".storage_alignment", str(torch.serialization._get_storage_alignment()).encode())
        writer.write("byteorder", sys.byteorder.encode())
        total = 0
        segs = {i: st.segments() for i, st in enumerate(pickler.order)
                if isinstance(st, OutStorage) and st.segments is not None}
        # one read-ahead across all records: the next block (of this record or the next) is read while this
        # one is written, small records included
        blocks = read_blocks([seg for i in segs for seg in segs[i]])
        try:
            for i, st in enumerate(pickler.order):
                if i in segs:
                    nbytes = st.numel * _itemsize(st.dtype)
                    writer.write_stream(f"data/{i}", nbytes, itertools.islice(blocks, _block_count(segs[i])))
                else:
                    raw, nbytes = _materialize(st)  # a plain tensor, or one assembled whole
                    writer.write(f"data/{i}", _bytes_of(raw, nbytes))
                    del raw
                total += nbytes
        finally:
            blocks.close()
    finally:
        writer.close()
    return total
