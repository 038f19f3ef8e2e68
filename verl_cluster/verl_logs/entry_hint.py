"""The fix for a job whose own module or script was not found where it ran (`python: No module named my_module`,
`can't open file 'train.py'`): when it is in the folder `submit` ran in, it only was not shipped with the job, and
the fix is the command that ships it (Ray's runtime_env working_dir)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Optional

_MODULE = re.compile(r": (?:No module named ([\w.]+)\s*$|Error while finding module specification for '([\w.]+)')")
_FILE = re.compile(r": can't open file '(.+)': \[Errno")
_ENTRYPOINT = "Running entrypoint for job "  # Ray's first line of the driver's log: `...: COMMAND`
_VALUE_FLAGS = ("-W", "-X")  # the interpreter's options that take the next word


def entry_argv(lines: list[str]) -> list[str]:
    """The job's command as Ray ran it, from its log; [] when the log does not say."""
    for line in lines:
        if line.startswith(_ENTRYPOINT) and ": " in line[len(_ENTRYPOINT):]:
            try:
                return shlex.split(line[len(_ENTRYPOINT):].split(": ", 1)[1])
            except ValueError:
                return []
    return []


def _script(argv: list[str]) -> Optional[str]:
    """The script word of `python [options] SCRIPT ...`; None for -m/-c or no script."""
    words = iter(argv[1:])
    for w in words:
        if w in _VALUE_FLAGS:
            next(words, None)
        elif w.startswith("-m") or w.startswith("-c") or w == "-":
            return None
        elif not w.startswith("-"):
            return w
    return None


def _python(argv: list[str]) -> str:
    name = Path(argv[0]).name if argv else ""
    return name if name.startswith(("python", "pypy")) else "python"


def ship_fix(evidence: str, lines: list[str], here: str) -> Optional[str]:
    """The command that ships the missing entrypoint, when `here` holds it; None otherwise (the generic fix
    stands: ship the folder that holds it, or install it on every node)."""
    argv = entry_argv(lines)
    py, here_p = _python(argv), Path(here)
    m = _MODULE.search(evidence)
    if m:
        name = m.group(1) or m.group(2)
        if name.endswith(".__main__"):
            return None
        local = here_p.joinpath(*name.split("."))
        found = local.with_name(local.name + ".py") if local.with_name(local.name + ".py").is_file() else (
            local if local.is_dir() else None)
        if found is None:
            return None
        rest = " ..." if argv and argv[-1] != name else ""
        return (f"{found.relative_to(here_p)} is in {here} (where this ran) but not where the job ran: ship "
                f"it with the job: verl-cluster submit --working-dir . -- {py} -m {name}{rest}")
    m = _FILE.search(evidence)
    if not m:
        return None
    typed = _script(argv) or Path(m.group(1)).name
    if Path(typed).name != Path(m.group(1)).name:
        return None  # the log's command and the error disagree: say nothing we cannot stand behind
    local = Path(typed) if Path(typed).is_absolute() else here_p / typed
    if not local.is_file():
        return None
    rest = " ..." if argv and argv[-1] != typed else ""
    if Path(typed).is_absolute():
        return (f"{typed} is on this machine but not where the job ran: ship its folder with the job: "
                f"verl-cluster submit --working-dir {local.parent} -- {py} {local.name}{rest}")
    return (f"{typed} is in {here} (where this ran) but not where the job ran: ship it with the job: "
            f"verl-cluster submit --working-dir . -- {py} {typed}{rest}")
