"""What a verl checkpoint folder holds, read from its file names (no tensor is opened here).

verl 0.9.1's FSDP checkpoint manager (`verl/utils/checkpoint/fsdp_checkpoint_manager.py`) writes, per role
folder (`global_step_N/actor`, `global_step_N/critic`), one file per rank and world size:
`model_world_size_{W}_rank_{r}.pt`, `optim_world_size_{W}_rank_{r}.pt`, `extra_state_world_size_{W}_rank_{r}.pt`,
plus `fsdp_config.json` ({"FSDP_version", "world_size"}), `huggingface/` (config, tokenizer) and, for LoRA,
`lora_train_meta.json`. The PPO trainer adds `global_step_N/data.pt` (its dataloader) and writes
`latest_checkpointed_iteration.txt` beside the step folders. A run loads the files named with its own world size.
"""

from __future__ import annotations

import json
import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from verl_cluster.errors import ConfigError

KINDS = ("model", "optim", "extra_state")
RANK_FILE = re.compile(r"^(model|optim|extra_state)_world_size_(\d+)_rank_(\d+)\.pt$")
TRACKER = "latest_checkpointed_iteration.txt"
STEP_DIR = re.compile(r"^global_step_(\d+)$")
FSDP1_OPTIM_HINT = ("train with actor_rollout_ref.actor.strategy=fsdp2 (its optimizer moments are DTensors that "
                    "reshard whatever the wrap policy), or save FSDP1 steps with "
                    "checkpoint.save_contents=[model,extra]")
FSDP2_HINT = ("train with actor_rollout_ref.actor.strategy=fsdp2 (and critic.strategy=fsdp2): FSDP2 checkpoints "
              "hold DTensor shards that reshard exactly")


class NotReshardable(ConfigError):
    """A checkpoint this tool does not understand or cannot reshard (exit 2)."""


def rank_file(kind: str, world_size: int, rank: int) -> str:
    return f"{kind}_world_size_{world_size}_rank_{rank}.pt"


@dataclass(frozen=True)
class RoleCheckpoint:
    """One role folder (actor, critic) of a step."""

    name: str
    path: Path
    world_sizes: tuple[int, ...]  # world sizes with a complete set of rank files
    kinds: tuple[str, ...]  # which of model/optim/extra_state the source world size has
    fsdp_version: Optional[int]
    saved_world_size: Optional[int]  # fsdp_config.json's
    lora: bool

    def files(self, world_size: int) -> list[Path]:
        return [self.path / rank_file(k, world_size, r) for k in self.kinds for r in range(world_size)]


@dataclass(frozen=True)
class StepCheckpoint:
    """A `global_step_N` folder and the checkpoint root holding it (None when given the step folder alone)."""

    root: Optional[Path]
    path: Path
    step: int
    roles: tuple[RoleCheckpoint, ...]
    other_files: tuple[str, ...] = field(default=())  # data.pt and anything else beside the roles

    def world_size(self) -> int:
        """The world size every role was saved with (they are saved together)."""
        sizes = {self._source(r) for r in self.roles}
        if len(sizes) != 1:
            raise NotReshardable(f"{self.path}: roles saved with different world sizes "
                                 f"({', '.join(f'{r.name}: {self._source(r)}' for r in self.roles)})")
        return sizes.pop()

    @staticmethod
    def _source(role: RoleCheckpoint) -> int:
        if role.saved_world_size in role.world_sizes:
            return role.saved_world_size
        if len(role.world_sizes) == 1:
            return role.world_sizes[0]
        raise NotReshardable(f"{role.path}: rank files for world sizes {list(role.world_sizes)} and "
                             f"fsdp_config.json does not say which one was saved",
                             "pass --from-world-size W")


def _tracker_step(root: Path) -> Optional[int]:
    """The step `latest_checkpointed_iteration.txt` names: a small regular file, never followed through a
    symbolic link (the folder is untrusted; a link could make the error echo another file's first bytes)."""
    f = root / TRACKER
    if f.is_symlink():
        raise NotReshardable(f"{f}: a symbolic link; verl writes the tracker as a plain file",
                             "replace it with a file holding the step number (or remove it to use the newest step)")
    if not f.is_file():
        return None
    try:
        fd = os.open(f, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as e:
        raise NotReshardable(f"{f}: cannot read it ({e.strerror})") from None
    try:
        raw = os.read(fd, 64) if stat.S_ISREG(os.fstat(fd).st_mode) else b""
    finally:
        os.close(fd)
    text = raw.decode("utf-8", "replace").strip()
    if not text.isdigit() or not text.isascii():
        raise NotReshardable(f"{f}: expected a step number, found {text[:40]!r}")
    return int(text)


def step_dirs(root: Path) -> dict[int, Path]:
    out = {}
    for p in root.iterdir() if root.is_dir() else ():
        m = STEP_DIR.match(p.name)
        if m and p.is_dir():
            out[int(m.group(1))] = p
    return out


def resolve_step(path: Path, step: Optional[int] = None) -> tuple[Optional[Path], Path, int]:
    """(root, step folder, step) for a checkpoint root (trainer.default_local_dir) or a global_step_N folder."""
    path = Path(path)
    if not path.exists():
        raise ConfigError(f"{path}: no such checkpoint folder")
    m = STEP_DIR.match(path.name)
    if m and path.is_dir():
        if step is not None and step != int(m.group(1)):
            raise ConfigError(f"--step {step} but {path} is step {m.group(1)}")
        return (path.parent if (path.parent / TRACKER).exists() else None), path, int(m.group(1))
    steps = step_dirs(path)
    if not steps:
        _refuse_foreign(path)
        raise NotReshardable(f"{path}: no global_step_N folder and no rank files",
                             "pass trainer.default_local_dir or one of its global_step_N folders")
    if step is None:
        step = _tracker_step(path)
        if step is None or step not in steps:
            step = max(steps)
    if step not in steps:
        raise ConfigError(f"{path}: no global_step_{step} (found {', '.join(map(str, sorted(steps)))})")
    return path, steps[step], step


def _refuse_foreign(path: Path) -> None:
    """Exit 2 with the reason for the checkpoint kinds this tool knows it does not reshard."""
    names = {p.name for p in path.iterdir()} if path.is_dir() else set()
    if "dist_ckpt" in names or ".metadata" in names or any(n.startswith("mp_rank_") for n in names) or \
            {"model", "optimizer"} <= names:
        raise NotReshardable(
            f"{path}: a Megatron checkpoint (dist_ckpt / torch.distributed.checkpoint), not per-rank FSDP files; "
            "verl-cluster reshards FSDP checkpoints only",
            "Megatron's distributed checkpoints are saved by tensor and loaded by Megatron on its own layout; "
            "resume it with verl's Megatron workers")
    if "adapter_model.safetensors" in names or "adapter_config.json" in names:
        raise NotReshardable(f"{path}: a PEFT adapter folder (adapter_model.safetensors), not an FSDP checkpoint; "
                             "it has no world size and needs no resharding")


def read_role(path: Path) -> RoleCheckpoint:
    _refuse_foreign(path)
    found: dict[int, dict[str, set[int]]] = {}
    for p in path.iterdir():
        m = RANK_FILE.match(p.name)
        if m:
            found.setdefault(int(m.group(2)), {}).setdefault(m.group(1), set()).add(int(m.group(3)))
    complete = tuple(sorted(w for w, kinds in found.items()
                            if "model" in kinds and all(ranks == set(range(w)) for ranks in kinds.values())))
    fsdp_version = saved = None
    cfg = path / "fsdp_config.json"
    if cfg.is_file():
        try:
            data = json.loads(cfg.read_bytes())
            fsdp_version, saved = data.get("FSDP_version"), data.get("world_size")
        except (ValueError, AttributeError) as e:  # ValueError: bad JSON or bytes that are not UTF-8
            raise NotReshardable(f"{cfg}: not the JSON verl writes ({e})")
        for key, value in (("FSDP_version", fsdp_version), ("world_size", saved)):
            if value is not None and (type(value) is not int or value < 1):
                raise NotReshardable(f"{cfg}: {key} is {json.dumps(value)[:40]}, expected a whole number "
                                     "(verl writes {\"FSDP_version\": 1 or 2, \"world_size\": W})")
    if not complete:
        if found:
            w = max(found)
            missing = [rank_file(k, w, r) for k in found[w] for r in range(w) if r not in found[w][k]]
            raise NotReshardable(f"{path}: world size {w} is missing {', '.join(missing[:4])}"
                                 + (f" and {len(missing) - 4} more" if len(missing) > 4 else ""),
                                 "copy the missing files from the node that saved them")
        raise NotReshardable(f"{path}: no model_world_size_W_rank_R.pt files (not a verl FSDP checkpoint)")
    src = saved if saved in complete else complete[-1]
    return RoleCheckpoint(name=path.name, path=path, world_sizes=complete,
                          kinds=tuple(k for k in KINDS if k in found[src]), fsdp_version=fsdp_version,
                          saved_world_size=saved, lora=(path / "lora_train_meta.json").exists())


def expect_state_dict(path: Path, obj: object) -> None:
    """Refuse a rank file that unpickles but is not what verl saves there: `model.state_dict()` (a dict of
    tensors by name) in model_*.pt, `optimizer.state_dict()` ({"state": {...}, "param_groups": [...]}) in optim_*.pt."""
    optim = path.name.startswith("optim_")
    what = None
    if not isinstance(obj, dict):
        name = type(obj).__name__
        what = f"{'an' if name[0] in 'aeiou' else 'a'} {name}"
    elif optim:
        state, groups = obj.get("state"), obj.get("param_groups")
        if not isinstance(state, dict) or not isinstance(groups, list):
            what = f"a dict with keys {sorted(map(str, obj))[:6]}"
        elif not all(isinstance(v, dict) for v in state.values()):
            what = "a state that is not a dict per parameter"
        elif not all(isinstance(g, dict) and isinstance(g.get("params"), list) for g in groups):
            what = "param_groups that are not dicts with a params list"
    elif not all(isinstance(k, str) for k in obj):
        what = "a dict whose keys are not all parameter names"
    if what:
        expected = ("an optimizer state_dict ({'state': {...}, 'param_groups': [...]})" if optim
                    else "a model state_dict (a dict of tensors by parameter name)")
        raise NotReshardable(f"{path}: holds {what}, expected {expected} as verl's checkpoint manager saves it",
                             "this file was not written by verl's FSDP checkpoint manager; copy the step again "
                             "from where the run saved it")


def read_step(path: Path, step: Optional[int] = None) -> StepCheckpoint:
    root, step_path, n = resolve_step(path, step)
    roles, others = [], []
    for p in sorted(step_path.iterdir()):
        if p.name.startswith(".reshard-"):
            continue  # an interrupted reshard's scratch folder
        if p.is_dir() and (any(RANK_FILE.match(q.name) for q in p.iterdir()) or (p / "fsdp_config.json").exists()):
            roles.append(read_role(p))
        elif p.is_dir() and p.name in ("actor", "critic"):
            _refuse_foreign(p)
            raise NotReshardable(f"{p}: no rank files (not a verl FSDP checkpoint)")
        elif RANK_FILE.match(p.name):
            roles.append(read_role(step_path))  # the SFT trainer saves its one model in the step folder
            break
        else:
            others.append(p.name)
    if not roles:
        _refuse_foreign(step_path)
        raise NotReshardable(f"{step_path}: no role folder with rank files (actor/, critic/)")
    per_rank_data = sorted(n for n in others if re.match(r"^data_\d+\.pt$", n))
    if per_rank_data:
        raise NotReshardable(
            f"{step_path}: per-rank dataloader states ({', '.join(per_rank_data[:3])}) of verl's SFT trainer: each "
            "holds its rank's sampler position, which has no exact counterpart on another world size")
    return StepCheckpoint(root, step_path, n, tuple(roles), tuple(others))


def resume_world_size_problem(ckpt_dir: str | os.PathLike, world_size: int) -> Optional[str]:
    """What a `trainer.resume_mode=auto` run on `world_size` GPUs would miss in `ckpt_dir`
    (trainer.default_local_dir, or the global_step_N folder of trainer.resume_from_path), with the command that
    fixes it; None when it resumes (or starts fresh)."""
    root = Path(ckpt_dir)
    if not root.is_dir():
        return None
    m = STEP_DIR.match(root.name)
    if m:  # trainer.resume_from_path: one step folder
        step, step_path, root = int(m.group(1)), root, root.parent
    else:
        step = _tracker_step(root) if (root / TRACKER).exists() else None
        if step is None:
            return None  # verl starts from scratch without the tracker
        step_path = root / f"global_step_{step}"
        if not step_path.is_dir():
            return (f"{root / TRACKER} points to global_step_{step}, which does not exist: verl would train "
                    "from scratch")
    try:
        ckpt = read_step(step_path)
    except NotReshardable as e:
        return f"global_step_{step} cannot be resumed on {world_size} GPUs: {e.message}"
    except OSError as e:
        return (f"{step_path}: cannot read it ({e.strerror or e}), so cannot tell whether it resumes on "
                f"{world_size} GPUs")
    lacking = [r.name for r in ckpt.roles if world_size not in r.world_sizes]
    if not lacking:
        return None
    try:
        saved = ckpt.world_size()
    except NotReshardable as e:
        return e.message
    target = step_path if m else root
    return (f"global_step_{step} was saved by {saved} ranks and has no files for world size {world_size} "
            f"({', '.join(lacking)}): verl would fail to load it; run "
            f"`verl-cluster reshard {target} --world-size {world_size}` first")
