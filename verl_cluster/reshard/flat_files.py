"""Reshard FSDP1's optimizer files: torch's plain `optimizer.state_dict()` over FSDP1's flat parameters.

verl wraps FSDP1 with use_orig_params=False, so the optimizer holds one FlatParameter per FSDP unit: the unit's
parameters flattened and joined in module order (N elements), cut into W chunks of ceil(N/W) elements, the last
ones zero-padded; at world size 1 FSDP1 runs unsharded and the chunk is the N elements. Each rank's file holds its
chunk of every moment. Which parameters a unit holds is set by the wrap policy and recorded nowhere, so it is
inferred from the model file under verl's default policy (a unit per transformer layer — a module at a
`<name>.<index>` path — and the root unit for the rest, a tied weight once) and used only when it reproduces the
saved chunk size of every unit; anything else is refused. New chunks are byte ranges of the same moments, padded
with zeros as FSDP1 pads them.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any, Callable, Optional

from verl_cluster.reshard.layout import expect_state_dict
from verl_cluster.reshard.shards import mesh_sizes
from verl_cluster.reshard.torchfile import (OutStorage, OutTensor, RefusedPickle, TensorRef, TorchFile,
                                            UnsupportedContent, WrapperRef, _itemsize, normalize_location,
                                            open_torch_file, write_torch_file)


def model_params(tf: TorchFile) -> list[tuple[str, int]]:
    """(name, numel) of each parameter of a model file, in its order: its DTensors (FSDP1 leaves buffers plain),
    or every tensor when there is none (world size 1, where FSDP1 saves plain full tensors)."""
    items = list(tf.obj.items()) if isinstance(tf.obj, dict) else []
    dtensors = [(k, v) for k, v in items if isinstance(v, WrapperRef) and hasattr(v.spec, "tensor_meta")]
    for _, v in dtensors:
        if len(mesh_sizes(v.spec.mesh)) != 1:
            raise UnsupportedContent("an FSDP1 optimizer of an HSDP (2-D mesh) run")
    chosen = dtensors or [(k, v) for k, v in items if isinstance(v, TensorRef) and v.shape]
    out = []
    for k, v in chosen:
        shape = tuple(v.spec.tensor_meta.shape) if isinstance(v, WrapperRef) else v.shape
        n = 1
        for s in shape:
            n *= s
        out.append((k, n))
    return out


def _unit(name: str) -> str:
    """The module a parameter's FSDP unit wraps under verl's default policy: up to its first numeric part."""
    parts = name.split(".")
    for i, p in enumerate(parts[:-1]):
        if p.isdigit():
            return ".".join(parts[:i + 1])
    return ""


def _sizes(params: list[tuple[str, int]], tied: frozenset) -> list[int]:
    units: dict[str, int] = {"": 0}
    for name, n in params:
        if name not in tied:
            u = _unit(name)
            units[u] = units.get(u, 0) + n
    return list(units.values()) if units[""] else list(units.values())[1:]


def flat_sizes(params: list[tuple[str, int]], chunks: list[Optional[int]], world: int) -> list[int]:
    """N of each flat parameter, checked against the saved chunk sizes (None: a unit without optimizer state)."""
    numel = dict(params)
    seen: set[int] = set()
    candidates = []  # root-unit parameters that may be another's tied copy (lm_head of the embedding)
    for name, n in params:
        if _unit(name) == "" and n in seen:
            candidates.append(name)
        seen.add(n)
    fits = []
    for k in range(len(candidates) + 1):
        for tied in itertools.combinations(candidates[:4], k):
            sizes = _sizes(params, frozenset(tied))
            if len(sizes) == len(chunks) and all(c is None or c == (n if world == 1 else -(-n // world))
                                                 for n, c in zip(sizes, chunks)):
                fits.append(sizes)
    if len({tuple(f) for f in fits}) != 1:
        raise UnsupportedContent(
            f"{'no' if not fits else 'more than one'} grouping of the model's {len(numel)} parameters into FSDP "
            f"units under verl's default wrap policy (one per transformer layer) gives the {len(chunks)} "
            f"flat-parameter chunk sizes saved ({[c for c in chunks][:6]}...): the run used another wrap policy "
            "(or use_orig_params), whose unit layout the checkpoint does not record")
    return fits[0]


def _moments(tree: Any) -> tuple[list[Any], list[Optional[int]]]:
    state, groups = tree.get("state"), tree.get("param_groups")
    if not isinstance(state, dict) or not isinstance(groups, list):
        raise UnsupportedContent("not an optimizer state_dict (no state / param_groups)")
    ids = [i for g in groups for i in g.get("params", [])]
    chunks: list[Optional[int]] = []
    for i in ids:
        refs = [v for v in state.get(i, {}).values() if isinstance(v, TensorRef)]
        sizes = {r.shape for r in refs}
        if len(sizes) > 1 or any(len(s) != 1 for s in sizes):
            raise UnsupportedContent(f"optimizer state {i} holds tensors of shapes {sorted(sizes)}, not flat chunks")
        chunks.append(sizes.pop()[0] if sizes else None)
    return ids, chunks


def reshard_flat_file_set(sources: list[Path], dests: list[Path], model_file: Path, device: Optional[str] = None,
                          progress: Optional[Callable[[str], None]] = None) -> int:
    """Write `dests` (one optimizer file per new rank) from `sources` (one per old rank); returns bytes written."""
    files: list[TorchFile] = []
    w, m = len(sources), len(dests)
    try:
        model = open_torch_file(str(model_file), keep_plain=True)
        try:
            expect_state_dict(model_file, model.obj)
            params = model_params(model)
        finally:
            model.close()
        for p in sources:
            try:
                files.append(open_torch_file(str(p), keep_plain=True))
            except RefusedPickle:
                raise  # names the file already, and carries its own hint
            except UnsupportedContent as e:
                raise UnsupportedContent(f"{p}: {e}") from None
            expect_state_dict(Path(p), files[-1].obj)
        ids, chunks = _moments(files[0].obj)
        if any(_moments(f.obj)[1] != chunks for f in files[1:]):
            raise UnsupportedContent(
                f"{sources[0].parent}: the ranks' FSDP1 optimizer files hold states of different sizes, not equal "
                "flat-parameter chunks: a run with use_orig_params=True (a state per original parameter, cut at "
                "rank boundaries), whose layout the checkpoint does not record")
        try:
            sizes = flat_sizes(params, chunks, w)
        except UnsupportedContent as e:
            raise UnsupportedContent(f"{sources[0]}: {e}") from None
        total = 0
        for j, dest in enumerate(dests):
            total += write_torch_file(str(dest), _rank_tree(files, ids, sizes, m, j, device), device)
            if progress:
                progress(f"wrote {dest.name}")
        return total
    finally:
        for f in files:
            f.close()


def _rank_tree(files: list[TorchFile], ids: list[Any], sizes: list[int], m: int, j: int,
               device: Optional[str]) -> dict:
    w = len(files)
    tree = files[0].obj
    state = {}
    for i, n in zip(ids, sizes):
        if i not in tree["state"]:
            continue
        entry = dict(tree["state"][i])
        for key, ref in entry.items():
            if isinstance(ref, TensorRef):
                refs = [f.obj["state"][i][key] for f in files]
                entry[key] = _new_chunk(files, refs, n, w, m, j, normalize_location(ref.storage.location, device))
        state[i] = entry
    return {**tree, "state": state}


def _new_chunk(files: list[TorchFile], refs: list[TensorRef], n: int, w: int, m: int, j: int,
               loc: str) -> OutTensor:
    """New rank j's chunk: elements [j*c', (j+1)*c') of the N, from the old chunks' byte ranges, zero-padded."""
    old = n if w == 1 else -(-n // w)
    new = n if m == 1 else -(-n // m)
    a, b = min(j * new, n), min((j + 1) * new, n)
    item = _itemsize(refs[0].dtype)
    segs: list[tuple[Any, int, int]] = []
    for r, (tf, ref) in enumerate(zip(files, refs)):
        if not ref.is_contiguous():
            raise UnsupportedContent(f"{tf.path}: a non-contiguous flat chunk")
        lo, hi = max(a, r * old), min(b, (r + 1) * old)
        if lo < hi:
            segs.append((tf, tf.offsets[ref.storage.key] + (ref.offset + lo - r * old) * item, (hi - lo) * item))
    if new - (b - a):
        segs.append((None, 0, (new - (b - a)) * item))
    st = OutStorage(refs[0].dtype, new, loc, segments=lambda: segs)
    return OutTensor(st, 0, (new,), (1,), refs[0].requires_grad, refs[0].extra)
