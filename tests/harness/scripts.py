"""A script of the repository (scripts/, launch/) loaded as a module: they are run as files, not installed."""

from __future__ import annotations

import functools
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]


def load_script(rel: str, name: str | None = None) -> ModuleType:
    """A fresh module of ROOT/REL, named NAME (the file's stem by default) and registered in sys.modules under it,
    where dataclasses look their module up."""
    path = ROOT / rel
    spec = importlib.util.spec_from_file_location(name or path.stem, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


@functools.lru_cache(maxsize=None)
def shipped_fit() -> tuple[dict, list[dict], dict]:
    """fit_plan_calibration's fit of the recorded runs as shipped (constants, rows, info), once per test process: a
    fit replays every run (seconds) and several tests read the same one. Read it, never change it."""
    fit = load_script("scripts/calibration/fit_plan_calibration.py")
    return fit.fit(fit.CALIB.RUNS_FILE)
