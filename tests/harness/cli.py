"""Run the product's CLI as a user does: a fresh process, from the repository root."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run_cli(*args, env: dict | None = None, timeout: float = 180) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "verl_cluster", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT, env={**os.environ, **(env or {})})


def cli(capsys, *argv) -> tuple[int, str, str]:
    """The CLI in this process (main), as (exit code, stdout, stderr) captured by pytest's capsys."""
    from verl_cluster.cli import main

    rc = main(list(argv))
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


def cli_json(capsys, *argv):
    """(exit code, the --json document) of the CLI in this process."""
    import json

    rc, out, _ = cli(capsys, *argv, "--json")
    return rc, json.loads(out)


def ctrl_c_default() -> None:
    """preexec_fn for a CLI process a test interrupts: a shell's background job inherits SIGINT ignored, and Python
    then installs no KeyboardInterrupt handler, so the test's SIGINT would do nothing."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
