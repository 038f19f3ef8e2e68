"""What the user named as the job, in one of three forms, kept so that it can be loaded again (by `watch`, for every
attempt of a run) exactly as `submit` loaded it:

    JOB.yaml [key=value ...]                       kind "spec"
    SCRIPT.sh [key=value ...]                      kind "script" (one of verl's example scripts, as is)
    [key=value ...] -- python3 -m MODULE ARGS...   kind "command" (the words before `--` are job fields/overrides)
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from verl_cluster.config.job import JobSpec
from verl_cluster.errors import ConfigError

KINDS = ("spec", "script", "command")


@dataclass(frozen=True)
class JobInput:
    kind: str
    path: str = ""  # absolute; spec and script
    argv: tuple[str, ...] = ()  # the command; kind "command"
    overrides: tuple[str, ...] = ()  # key=value words: job fields (watch.*, placement.*) and verl overrides

    @classmethod
    def from_words(cls, first: Optional[str], rest: list[str], before: list[str] = ()) -> "JobInput":
        """`first rest...` as argparse left them; `before`: the key=value words given before `--`."""
        from verl_cluster.verl_scripts.script_import import is_python, is_script

        words = ([first] if first else []) + list(rest)
        at = next((i for i, w in enumerate(words) if is_python(w)), None)
        if at is not None:
            pre = list(before) + words[:at]
            bad = [w for w in pre if "=" not in w or w.startswith("-")]
            if bad:
                raise ConfigError(f"`{bad[0][:80]}` comes before the command: only key=value words (job fields such "
                                  "as watch.max_restarts=5, or verl overrides) may come before `-- python3 -m ...`",
                                  "put the job file first, or key=value words then `-- python3 -m MODULE ...`")
            return cls("command", argv=tuple(words[at:]), overrides=tuple(_absolute_working_dir(w) for w in pre))
        if not words:
            raise ConfigError("no job given", "verl-cluster submit JOB.yaml, SCRIPT.sh, or -- python3 -m MODULE ...")
        first, rest = words[0], list(before) + words[1:]
        if "=" in first and not Path(first).exists():
            raise ConfigError(f"`{first[:80]}` is not a job file",
                              "the job file comes first (JOB.yaml key=value ...); before `-- python3 -m ...` "
                              "only key=value words may come")
        kind = "script" if is_script(first) else "spec"
        if kind == "script" and not Path(first).is_file():
            raise ConfigError(f"{first}: script not found")
        # absolute, links kept: resolve() would turn /dev/fd/63 (`<(...)`) into a `pipe:[...]` path that is no file
        return cls(kind, path=os.path.abspath(first) if Path(first).exists() else first, overrides=tuple(rest))

    def load(self, extra: list[str] = ()) -> tuple[JobSpec, Any]:
        """(JobSpec, ImportedJob or None) with `extra` key=value words applied after the recorded ones."""
        from verl_cluster.verl_scripts.script_import import load_job_input

        words = list(self.overrides) + list(extra)
        if self.kind == "command":
            return load_job_input(self.argv[0], list(self.argv[1:]), words)
        return load_job_input(self.path, words)

    def job(self, extra: list[str] = ()) -> JobSpec:
        return self.load(extra)[0]

    def describe(self) -> str:
        if self.kind == "command":
            return " ".join(list(self.overrides) + ["--"] + list(self.argv))[:300]
        return " ".join([self.path] + list(self.overrides))[:300]

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "path": self.path, "argv": list(self.argv), "overrides": list(self.overrides)}

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> "JobInput":
        kind = doc.get("kind")
        if kind not in KINDS:
            raise ConfigError(f"a recorded job input has an unknown kind {kind!r}")
        return cls(kind, str(doc.get("path") or ""), tuple(doc.get("argv") or ()), tuple(doc.get("overrides") or ()))

    @classmethod
    def from_record(cls, rec: dict[str, Any]) -> Optional["JobInput"]:
        """From a job record or run.json: the `job_input` it holds, or the older `job_file` + `overrides` pair
        (records written before the three forms were kept; a command line then stored `python3` as its file)."""
        if isinstance(rec.get("job_input"), dict):
            return cls.from_json(rec["job_input"])
        if not rec.get("job_file"):
            return None
        return cls.from_words(rec["job_file"], list(rec.get("overrides") or []))


def working_dir_word(path: Optional[str]) -> list[str]:
    """--working-dir DIR as the job field it sets (working_dir=ABSOLUTE, so a watcher started elsewhere ships the
    same folder); a DIR that is not a folder is bad input before anything else runs."""
    if not path:
        return []
    p = Path(path).expanduser()
    if not p.is_dir():
        raise ConfigError(f"--working-dir {path}: not a directory", "name the folder that holds the job's code "
                          "(e.g. --working-dir . in the folder of my_module.py)")
    return [f"working_dir={p.resolve()}"]


def _absolute_working_dir(word: str) -> str:
    """`working_dir=.` before `--` means the folder the command was typed in: kept absolute in the record."""
    key, _, value = word.partition("=")
    if key != "working_dir" or not value:
        return word
    return f"working_dir={Path(value).expanduser().resolve()}"
