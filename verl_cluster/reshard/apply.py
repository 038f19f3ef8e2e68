"""Plan and run a reshard of one `global_step_N` from its saved world size W to M.

In place (the default), the M rank files are written into a scratch folder inside the step
(`.reshard-ws{M}.tmp/`), synced, and only then renamed beside the W files (names differ, nothing is overwritten:
the step resumes on W and on M); each role's `fsdp_config.json` is switched to M last. With `out`, the whole
step is written as `OUT/.reshard-global_step_N.tmp/`, renamed to `OUT/global_step_N`, and only then is
`OUT/latest_checkpointed_iteration.txt` written. An interrupted reshard leaves the source untouched and a
scratch folder that the next run removes.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import stat
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Optional

from verl_cluster.errors import ClusterError
from verl_cluster.reshard.layout import (FSDP1_OPTIM_HINT, FSDP2_HINT, TRACKER, NotReshardable, StepCheckpoint,
                                         rank_file, read_step)

Progress = Optional[Callable[[str], None]]


@dataclass(frozen=True)
class FileOp:
    op: str  # "reshard" | "extra" | "copy" | "config"
    dest: str
    sources: tuple[str, ...]
    bytes: int  # bytes read


@dataclass(frozen=True)
class ReshardPlan:
    step_dir: str
    step: int
    roles: tuple[str, ...]
    from_world_size: int
    world_size: int
    fsdp_size: int
    out_dir: Optional[str]  # None: in place
    scratch: str
    ops: tuple[FileOp, ...]
    nothing_to_do: bool = False
    notes: tuple[str, ...] = ()
    device: Optional[str] = None  # write tensors for this device type ("cpu") instead of the saved one
    fsdp1: tuple[str, ...] = ()  # role folders saved by FSDP1 (fsdp_config.json FSDP_version 1)

    @property
    def reads(self) -> list[str]:
        return sorted({s for op in self.ops for s in op.sources})

    @property
    def writes(self) -> list[str]:
        return [op.dest for op in self.ops]

    @property
    def bytes_read(self) -> int:
        return sum(op.bytes for op in self.ops)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["ops"] = [asdict(o) for o in self.ops]
        d["reads"], d["writes"], d["bytes_read"] = self.reads, self.writes, self.bytes_read
        return d


@dataclass
class ReshardResult:
    plan: ReshardPlan
    seconds: float = 0.0
    bytes_written: int = 0
    peak_anon_bytes: int = 0  # peak anonymous resident memory of this process during the reshard
    start_anon_bytes: int = 0
    hwm_bytes: int = 0
    largest_tensor_bytes: int = 0
    largest_tensor: str = ""
    rng: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["plan"] = self.plan.to_dict()
        return d


def _not_copied(p: Path, what: str) -> NotReshardable:
    return NotReshardable(f"{p}: {what}; verl writes plain files and folders, and --out copies only those (a "
                          "link in an untrusted folder is never followed)",
                          "replace it with a copy of what it stands for, or remove it, then run reshard again")


def _kind(p: Path, mode: int) -> None:
    if stat.S_ISLNK(mode):
        raise _not_copied(p, "a symbolic link")
    if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
        raise _not_copied(p, "not a regular file or folder")


def _size(p: Path) -> int:
    """Bytes `--out` copies from `p`, refusing what it does not copy (links, pipes, devices) anywhere under it."""
    st = os.lstat(p)
    _kind(p, st.st_mode)
    if not stat.S_ISDIR(st.st_mode):
        return st.st_size
    return sum(_size(p / name) for name in sorted(os.listdir(p)))


def _copy(src: Path, dest: Path) -> None:
    """Copy a file or folder of the step without following a link: every part is opened with O_NOFOLLOW
    relative to its folder's descriptor, so one planted after the plan is refused too."""
    parent = os.open(src.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        _copy_at(parent, src.name, src, dest)
    finally:
        os.close(parent)


def _copy_at(dir_fd: int, name: str, shown: Path, dest: Path) -> None:
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=dir_fd)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise _not_copied(shown, "a symbolic link") from None
        raise
    try:
        st = os.fstat(fd)
        _kind(shown, st.st_mode)
        if stat.S_ISDIR(st.st_mode):
            os.mkdir(dest)
            for child in sorted(os.listdir(fd)):
                _copy_at(fd, child, shown / child, dest / child)
        else:
            with open(os.dup(fd), "rb") as f, open(dest, "xb") as out:
                shutil.copyfileobj(f, out, 8 << 20)
        os.chmod(dest, stat.S_IMODE(st.st_mode))
        os.utime(dest, ns=(st.st_atime_ns, st.st_mtime_ns))
    finally:
        os.close(fd)


def plan_reshard(ckpt_dir: str | os.PathLike, world_size: int, *, step: Optional[int] = None,
                 out_dir: str | os.PathLike | None = None, fsdp_size: Optional[int] = None,
                 from_world_size: Optional[int] = None, device: Optional[str] = None) -> ReshardPlan:
    """What a reshard of `ckpt_dir` (a checkpoint root or a global_step_N folder) to `world_size` reads and
    writes. Raises NotReshardable (exit 2) for a checkpoint it does not understand."""
    if world_size < 1:
        raise NotReshardable(f"--world-size must be at least 1, got {world_size}")
    ckpt = read_step(Path(ckpt_dir), step)
    w = from_world_size or ckpt.world_size()
    for role in ckpt.roles:
        if w not in role.world_sizes:
            raise NotReshardable(f"{role.path}: no complete set of rank files for world size {w}")
    fsdp = _target_fsdp_size(ckpt, w, world_size, fsdp_size)
    fsdp1 = tuple(str(r.path) for r in ckpt.roles if r.fsdp_version == 1)
    if fsdp1 and fsdp != world_size:
        raise NotReshardable(
            f"{fsdp1[0]}: an FSDP1 checkpoint to an HSDP mesh (--fsdp-size {fsdp_size}): FSDP1 loads each "
            "parameter by an all-gather over the process groups its saved mesh names, and a new 2-D mesh's "
            "groups have names only the new run knows", "reshard to a 1-D mesh (leave out --fsdp-size)")
    out = Path(out_dir) if out_dir is not None else None
    if out is not None and (out / ckpt.path.name).exists():
        raise NotReshardable(f"{out / ckpt.path.name} exists already", "pick another --out folder")
    done = out is None and all(world_size in r.world_sizes for r in ckpt.roles)
    scratch = (out / f".reshard-{ckpt.path.name}.tmp") if out is not None else \
        (ckpt.path / f".reshard-ws{world_size}.tmp")
    ops: list[FileOp] = []
    if not done:
        for role in ckpt.roles:
            base = scratch / role.name if role.path != ckpt.path else scratch
            for kind in role.kinds:
                srcs = tuple(str(role.path / rank_file(kind, w, r)) for r in range(w))
                per = sum(os.path.getsize(s) for s in srcs)
                for j in range(world_size):
                    op = "extra" if kind == "extra_state" else "reshard"
                    ops.append(FileOp(op, str(base / rank_file(kind, world_size, j)), srcs,
                                      per // world_size if op == "reshard" else os.path.getsize(srcs[min(j, w - 1)])))
            ops.append(FileOp("config", str(base / "fsdp_config.json"), (), 0))
            if out is not None:
                for p in sorted(role.path.iterdir()):
                    if p.name not in ("fsdp_config.json",) and not _is_rank_file(p.name):
                        ops.append(FileOp("copy", str(base / p.name), (str(p),), _size(p)))
        if out is not None and all(r.path != ckpt.path for r in ckpt.roles):  # else copied with the role
            for name in ckpt.other_files:
                ops.append(FileOp("copy", str(scratch / name), (str(ckpt.path / name),), _size(ckpt.path / name)))
    notes = []
    if done:
        notes.append(f"every role already has files for world size {world_size}")
    if fsdp1:
        notes.append("FSDP1: the model's DTensor shards (plain full tensors at world size 1, where FSDP1 runs "
                     "unsharded) and the optimizer's flat-parameter chunks (units inferred under verl's default "
                     "wrap policy, checked against every saved chunk size) are resharded exactly")
    if any(r.lora for r in ckpt.roles):
        notes.append("LoRA run: adapter (and any base) tensors are DTensors like the rest and are resharded the "
                     "same way")
    return ReshardPlan(str(ckpt.path), ckpt.step, tuple(r.name for r in ckpt.roles), w, world_size, fsdp,
                       str(out) if out is not None else None, str(scratch), tuple(ops), done, tuple(notes), device,
                       fsdp1)


def _is_rank_file(name: str) -> bool:
    from verl_cluster.reshard.layout import RANK_FILE

    return bool(RANK_FILE.match(name))


def _target_fsdp_size(ckpt: StepCheckpoint, w: int, m: int, fsdp_size: Optional[int]) -> int:
    """Ranks a tensor is sharded over on the new world size: verl's fsdp_size (-1 or >= world: all ranks)."""
    if fsdp_size is None or fsdp_size < 0 or fsdp_size >= m:
        return m
    if m % fsdp_size:
        raise NotReshardable(f"--fsdp-size {fsdp_size} does not divide --world-size {m}")
    return fsdp_size


def apply_reshard(plan: ReshardPlan, progress: Progress = None) -> ReshardResult:
    """Run `plan`: write into its scratch folder, then switch (see the module doc)."""
    import torch  # noqa: F401 - fail early, before any folder is made

    from verl_cluster.reshard.dtensor_files import FileSetStats, reshard_file_set
    from verl_cluster.reshard.flat_files import reshard_flat_file_set
    from verl_cluster.reshard.extra import write_extra
    from verl_cluster.reshard.memory import PeakMemory
    from verl_cluster.reshard.shards import MeshShape
    from verl_cluster.reshard.torchfile import UnsupportedContent, forget_locations, release_reader

    result = ReshardResult(plan)
    if plan.nothing_to_do:
        return result
    scratch = Path(plan.scratch)
    if scratch.exists():
        shutil.rmtree(scratch)  # an earlier run's, interrupted
    t0 = time.monotonic()
    target = MeshShape(plan.world_size, plan.fsdp_size)
    try:
        with PeakMemory() as mem:
            groups: dict[tuple, list[FileOp]] = {}
            for op in plan.ops:
                Path(op.dest).parent.mkdir(parents=True, exist_ok=True)
                if op.op == "reshard":
                    groups.setdefault(op.sources, []).append(op)
            for srcs, ops in groups.items():
                if progress:
                    progress(f"{Path(srcs[0]).parent.name}: {Path(srcs[0]).name.split('_world_size')[0]} "
                             f"{plan.from_world_size} -> {plan.world_size} ranks")
                fsdp1 = str(Path(srcs[0]).parent) in plan.fsdp1
                try:
                    if fsdp1 and Path(srcs[0]).name.startswith("optim_"):
                        model = Path(srcs[0]).parent / rank_file("model", plan.from_world_size, 0)
                        stats = FileSetStats(bytes_written=reshard_flat_file_set(
                            [Path(s) for s in srcs], [Path(o.dest) for o in ops], model, plan.device, progress))
                    else:
                        stats = reshard_file_set([Path(s) for s in srcs], [Path(o.dest) for o in ops], target,
                                                 plan.device, progress, fsdp1=fsdp1)
                except UnsupportedContent as e:  # a refused pickle carries its own hint
                    hint = getattr(e, "hint", None) or (FSDP1_OPTIM_HINT if fsdp1 else FSDP2_HINT)
                    raise NotReshardable(str(e), hint)
                result.bytes_written += stats.bytes_written
                if stats.largest_tensor_bytes > result.largest_tensor_bytes:
                    result.largest_tensor_bytes = stats.largest_tensor_bytes
                    result.largest_tensor = stats.largest_tensor
            for op in plan.ops:
                if op.op == "extra":
                    j = int(Path(op.dest).stem.rsplit("_", 1)[1])
                    result.rng.append(_extra(write_extra, [Path(s) for s in op.sources], j, Path(op.dest)))
                elif op.op == "copy":
                    _copy(Path(op.sources[0]), Path(op.dest))
                elif op.op == "config":
                    _write_config(Path(op.dest), Path(plan.step_dir), plan)
            _sync_tree(scratch)
        result.peak_anon_bytes, result.start_anon_bytes, result.hwm_bytes = mem.peak_anon, mem.start_anon, mem.hwm
        _switch(plan, scratch)
    except OSError as e:
        shutil.rmtree(scratch, ignore_errors=True)
        raise ClusterError(f"{e.filename or scratch}: {e.strerror or e}; nothing was changed",
                           "a reshard needs free space for one more copy of the step's rank files") from e
    except BaseException:
        shutil.rmtree(scratch, ignore_errors=True)
        raise
    finally:
        forget_locations()
        release_reader()
    result.seconds = time.monotonic() - t0
    return result


def _extra(write_extra, sources: list[Path], rank: int, dest: Path) -> str:
    import pickle

    try:
        return write_extra(sources, rank, dest)
    except (pickle.UnpicklingError, EOFError, RuntimeError, AttributeError, KeyError) as e:
        first = next((ln for ln in str(e).splitlines() if ln.strip()), "")
        raise NotReshardable(f"{sources[0]}: not the extra state verl writes ({type(e).__name__}: {first[:200]})",
                             "its rank-0 file is read with torch's weights-only loader: tensors, plain data and "
                             "numpy RNG state only")


def _write_config(dest: Path, step_dir: Path, plan: ReshardPlan) -> None:
    role = dest.parent.name if dest.parent.name != Path(plan.scratch).name else None
    src = (step_dir / role / "fsdp_config.json") if role else step_dir / "fsdp_config.json"
    data = json.loads(src.read_text()) if src.is_file() else {"FSDP_version": 2}
    data["world_size"] = plan.world_size
    dest.write_text(json.dumps(data, indent=4))


def _sync_tree(root: Path) -> None:
    for p in sorted(root.rglob("*"), reverse=True):
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _replace_file(dest: Path, text: str) -> None:
    tmp = dest.with_name(f".{dest.name}.tmp")
    tmp.unlink(missing_ok=True)  # whatever is there (a planted link would be followed): the folder is untrusted
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    with os.fdopen(fd, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, dest)


def _switch(plan: ReshardPlan, scratch: Path) -> None:
    if plan.out_dir is not None:
        out = Path(plan.out_dir)
        os.rename(scratch, out / Path(plan.step_dir).name)
        _replace_file(out / TRACKER, str(plan.step))
        return
    step_dir = Path(plan.step_dir)
    configs = []
    for p in sorted(scratch.rglob("*")):
        if p.is_dir():
            continue
        dest = step_dir / p.relative_to(scratch)
        if p.name == "fsdp_config.json":
            configs.append((dest, p.read_text()))
        else:
            os.rename(p, dest)  # a new name beside the W files: nothing is replaced
    for dest, text in configs:
        _replace_file(dest, text)
    shutil.rmtree(scratch, ignore_errors=True)


def reshard(ckpt_dir: str | os.PathLike, world_size: int, *, step: Optional[int] = None,
            out_dir: str | os.PathLike | None = None, fsdp_size: Optional[int] = None,
            device: Optional[str] = None, progress: Progress = None) -> ReshardResult:
    """Plan and apply in one call (the library entry point `watch` uses)."""
    plan = plan_reshard(ckpt_dir, world_size, step=step, out_dir=out_dir, fsdp_size=fsdp_size, device=device)
    return apply_reshard(plan, progress)
