"""Printing helpers shared by the subcommands: JSON, rich tables, errors."""

from __future__ import annotations

import json
import logging
import os
import sys
import traceback
from typing import Any

from rich.console import Console
from rich.markup import escape

from verl_cluster.errors import EXIT_UNHEALTHY, VerlClusterError

# wide tables when piped (rich would wrap at 80 columns)
_width = None if sys.stdout.isatty() else int(os.environ.get("COLUMNS", "200"))
out = Console(highlight=False, width=_width)  # data
err = Console(stderr=True, highlight=False, soft_wrap=True)  # progress, messages


# Ray's client-side INFO lines ("dashboard_sdk.py:371 -- Uploading package ...", "sdk.py:520 -- WebSocket closed")
# would interleave with the job's own output; --debug keeps them
RAY_CLIENT_LOGGERS = ("ray.dashboard.modules.dashboard_sdk", "ray.dashboard.modules.job.sdk",
                      "ray._private.runtime_env.packaging")


def _warnings_only(record: logging.LogRecord) -> bool:
    return record.levelno >= logging.WARNING


def quiet_ray_logs() -> None:
    # a filter, not a level: these modules set their loggers to INFO when Ray imports them, after us
    for name in RAY_CLIENT_LOGGERS:
        logging.getLogger(name).addFilter(_warnings_only)


_json_written = False  # a command's --json document is out: an error after it adds no second one


def print_json(data: Any, indent: int | None = 2) -> None:
    global _json_written
    sys.stdout.write(json.dumps(data, indent=indent, default=str) + "\n")
    sys.stdout.flush()
    _json_written = True


def reset_json() -> None:
    """A new command (main may run several in one process: the tests)."""
    global _json_written
    _json_written = False


def print_json_error(message: str, hint: str | None, exit_code: int) -> None:
    """Under --json, a failure is a document too (docs/cli.md): {"error": {...}} on one line of stdout, unless the
    command's own document is already out. The one-line error stays on stderr."""
    if not _json_written:
        print_json({"error": {"message": message, "hint": hint, "exit_code": exit_code}}, indent=None)


def one_line(text: str, limit: int = 4000) -> str:
    """A message as printed: one line (a newline in a value cannot forge a second one), long values cut."""
    from verl_cluster.config.loader import short

    return short(text, limit)


def report_error(e: BaseException, debug: bool, as_json: bool = False) -> int:
    if debug:
        traceback.print_exception(e, file=sys.stderr)
    if isinstance(e, VerlClusterError):
        message, hint, code = one_line(e.message), one_line(e.hint) if e.hint else None, e.exit_code
        err.print(f"[bold red]error:[/] {escape(message)}")
        if hint:
            err.print(f"[yellow]hint:[/] {escape(hint)}")
    else:
        message, code = f"internal error: {type(e).__name__}: {one_line(str(e))}", EXIT_UNHEALTHY
        hint = None if debug else "run again with --debug for the traceback, and report it"
        err.print(f"[bold red]internal error:[/] {escape(message.removeprefix('internal error: '))}")
        if hint:
            err.print(f"[yellow]hint:[/] {hint}")
    if as_json:
        print_json_error(message, hint, code)
    return code
