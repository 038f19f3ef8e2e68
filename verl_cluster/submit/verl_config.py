"""Check a verl job's overrides against verl's real Hydra config, when verl is importable here."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Optional, Sequence

from verl_cluster.jobs.request import override_args

PROBE = Path(__file__).with_name("verl_probe.py")
MARK = "@@VC-JSON@@"


@dataclass(frozen=True)
class VerlConfigCheck:
    ran: bool
    skipped: Optional[str] = None  # why composing or validating was skipped
    unknown: list[tuple[str, Optional[str]]] = field(default_factory=list)  # (key, nearest valid key)
    error: Optional[str] = None
    validated: bool = False
    cached: Optional[str] = None  # when the answer was first found (the probe kept it; verl was not imported again)


def verl_available(python: Optional[str] = None) -> bool:
    if python and python != sys.executable:
        return subprocess.run([python, "-c", "import importlib.util as u, sys; sys.exit(u.find_spec('verl') is None)"],
                              capture_output=True, timeout=30).returncode == 0
    return importlib.util.find_spec("verl") is not None


def verl_python() -> str:
    """The Python that has verl: $VC_VERL_PYTHON (verl in its own venv), else this one."""
    return os.environ.get("VC_VERL_PYTHON") or sys.executable


def hydra_flags(args: Sequence[str]) -> dict[str, str]:
    """{"config_name": ..., "config_path": ...} from a job's `--config-name=X` / `-cn X` style args."""
    out, names = {}, {"--config-name": "config_name", "-cn": "config_name", "--config-path": "config_path",
                      "-cp": "config_path"}
    items = list(args)
    for i, a in enumerate(items):
        flag, eq, value = a.partition("=")
        if flag in names:
            out[names[flag]] = value if eq else (items[i + 1] if i + 1 < len(items) else "")
    return out


def probe_arg(module: str, overrides: Mapping[str, object], args: Sequence[str] = ()) -> str:
    return json.dumps({"module": module, "overrides": override_args(overrides), **hydra_flags(args)})


def from_probe(d: dict) -> VerlConfigCheck:
    if d.get("no_verl"):  # the probe ran, in a Python without verl
        return VerlConfigCheck(False, skipped=d.get("skipped"))
    return VerlConfigCheck(True, d.get("skipped"), [tuple(u) for u in d.get("unknown", [])], d.get("error"),
                           bool(d.get("validated")), d.get("cached"))


def check_verl_config(module: str, overrides: Mapping[str, object], python: Optional[str] = None,
                      timeout: float = 120.0, args: Sequence[str] = ()) -> VerlConfigCheck:
    python = python or verl_python()
    if not verl_available(python):
        return VerlConfigCheck(False, skipped="verl is not installed here: its config was not checked "
                                              "(pip install verl, or set VC_VERL_PYTHON to a Python that has it)")
    try:
        p = subprocess.run([python, str(PROBE), probe_arg(module, overrides, args)], capture_output=True, text=True,
                           timeout=timeout)
    except subprocess.TimeoutExpired:
        return VerlConfigCheck(False, skipped=f"verl config check did not finish within {timeout:.0f}s")
    for line in reversed(p.stdout.splitlines()):
        if line.startswith(MARK):
            return from_probe(json.loads(line[len(MARK):]))
    tail = (p.stderr.strip().splitlines() or ["no output"])[-1]
    return VerlConfigCheck(False, skipped=f"verl config check failed to run: {tail[:300]}")


def check_verl_config_on(runner, python: str, module: str, overrides: Mapping[str, object],
                         args: Sequence[str] = (), timeout: float = 180.0) -> VerlConfigCheck:
    """The same check in a node's Python (the cluster's head, where the job's verl is): verl_probe.py is sent as
    source (runners.remote_python), so nothing of ours needs to be installed there."""
    from verl_cluster.runners.remote_python import run_python

    return from_probe(run_python(runner, python, PROBE.read_text(), [probe_arg(module, overrides, args)],
                                 timeout=timeout))
