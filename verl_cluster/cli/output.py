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


def print_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")
    sys.stdout.flush()


def one_line(text: str, limit: int = 4000) -> str:
    """A message as printed: one line (a newline in a value cannot forge a second one), long values cut."""
    from verl_cluster.config.loader import short

    return short(text, limit)


def report_error(e: BaseException, debug: bool) -> int:
    if debug:
        traceback.print_exception(e, file=sys.stderr)
    if isinstance(e, VerlClusterError):
        err.print(f"[bold red]error:[/] {escape(one_line(e.message))}")
        if e.hint:
            err.print(f"[yellow]hint:[/] {escape(one_line(e.hint))}")
        return e.exit_code
    err.print(f"[bold red]internal error:[/] {type(e).__name__}: {escape(one_line(str(e)))}")
    if not debug:
        err.print("[yellow]hint:[/] run again with --debug for the traceback, and report it")
    return EXIT_UNHEALTHY
