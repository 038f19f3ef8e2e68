"""The `verl-cluster` command: parse, call the library, print. Subcommands live in sibling modules."""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from verl_cluster import __version__
from verl_cluster.cli.output import print_json_error, quiet_ray_logs, report_error, reset_json

# subcommand name -> module under verl_cluster.cli (each has add_parser(sub) and run(args) -> int)
COMMANDS = {
    "up": "lifecycle_cmds",
    "down": "lifecycle_cmds",
    "status": "lifecycle_cmds",
    "forget": "lifecycle_cmds",
    "env": "env_cmd",
    "check": "check_cmd",
    "doctor": "doctor_cmd",
    "plan": "plan_cmd",
    "submit": "submit_cmd",
    "import": "import_cmd",
    "jobs": "jobs_cmds",
    "logs": "jobs_cmds",
    "stop": "jobs_cmds",
    "watch": "watch_cmd",
    "sbatch": "sbatch_cmd",
    "dashboard": "dashboard_cmd",
    "completion": "completion_cmd",
    "reshard": "reshard_cmd",
}


class Parser(argparse.ArgumentParser):
    """argparse's parser (usage and `PROG: error: ...` on stderr, exit 2); the error is also kept, so that under
    --json it becomes the error document on stdout as every other error does (docs/cli.md)."""

    last_error: tuple[str, str] | None = None  # (prog, message) of the last argument error

    def error(self, message: str):
        Parser.last_error = (self.prog, message)
        super().error(message)


def common_flags() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--debug", action="store_true", help="show full tracebacks")
    return p


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The parser; with `only` (a module name of COMMANDS), just that subcommand's module is imported — each
    pulls in its own part of the library, and a command's start-up time is the user's wait."""
    parser = Parser(
        prog="verl-cluster",
        description="Start, check, plan and launch multi-node verl RL runs on Ray.",
        parents=[common_flags()],
    )
    parser.add_argument("--version", action="version", version=f"verl-cluster {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    loaded = set()
    for name, module in COMMANDS.items():
        if module in loaded or (only and module != only):
            continue
        mod = importlib.import_module(f"verl_cluster.cli.{module}")
        mod.add_parsers(sub, common_flags())
        loaded.add(module)
    return parser


def split_command(argv: list[str]) -> tuple[list[str], list[str]]:
    """`submit watch.max_restarts=5 --watch -- python3 -m verl...`: the key=value words before `--` are the job's
    (job fields, verl overrides), not the command's; they are taken out so that argparse sees the command as the
    job. Returns (argv for argparse, those words)."""
    if "--" not in argv:
        return argv, []
    cut = argv.index("--")
    before = [a for a in argv[:cut] if "=" in a and not a.startswith("-")]
    return [a for a in argv[:cut] if a not in before] + argv[cut:], before


def _command_parser(parser: argparse.ArgumentParser, command: str | None) -> argparse.ArgumentParser:
    """The subcommand's own parser (the top one when there is none)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction) and command in action.choices:
            return action.choices[command]
    return parser


def _argcomplete_hook() -> None:
    """argcomplete's shell hook runs us with _ARGCOMPLETE set; answer it when argcomplete is installed
    (an optional extra: `verl-cluster completion bash` needs nothing)."""
    try:
        import argcomplete
    except ImportError:
        return
    argcomplete.autocomplete(build_parser())  # prints the candidates and exits


def main(argv: list[str] | None = None) -> int:
    if argv is None and "_ARGCOMPLETE" in os.environ:
        _argcomplete_hook()
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv
    own = argv[:argv.index("--")] if "--" in argv else argv  # after `--`: the job's command, not ours
    as_json = "--json" in own
    Parser.last_error = None
    reset_json()
    first = next((a for a in argv if not a.startswith("-")), None)
    if not debug:
        quiet_ray_logs()
    try:
        parser = build_parser(COMMANDS.get(first))
        argv, before = split_command(argv)
        args, extra = parser.parse_known_args(argv)
        parser = _command_parser(parser, getattr(args, "command", None))  # its usage, its name in the error
        if before:
            if not hasattr(args, "overrides"):
                parser.error(f"unrecognized arguments: {' '.join(before)}")
            args.before = before
        # key=value overrides may also follow the options (`submit JOB -c FILE a.b=1`)
        items = [a for a in extra if "=" in a and not a.startswith("-")]
        rest = [a for a in extra if a not in items]
        if rest or (items and not hasattr(args, "overrides")):
            parser.error(f"unrecognized arguments: {' '.join(rest or items)}")
        if items:
            args.overrides = list(args.overrides or []) + items
        if not getattr(args, "func", None):
            parser.print_help(sys.stderr)  # an error (exit 2): stdout carries data only
            if as_json:
                print_json_error("no command given", "see `verl-cluster --help`", 2)
            return 2
        args.whole_parser = build_parser  # for `completion`, which describes every command
        rc = int(args.func(args) or 0)
        if as_json and rc not in (0, 130):  # a failure said only on stderr still leaves a document
            print_json_error(f"`{args.command}` failed (exit {rc}); the reasons are on stderr", None, rc)
        return rc
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        if as_json:
            print_json_error("interrupted", None, 130)
        return 130
    except SystemExit as e:  # argparse: 0 for --help/--version, 2 on bad arguments
        rc = int(e.code) if isinstance(e.code, int) else (0 if e.code is None else 2)
        if as_json and rc:
            prog, message = Parser.last_error or ("verl-cluster", str(e.code))
            command = f"verl-cluster {first}" if first in COMMANDS else "verl-cluster"
            print_json_error(f"{command if prog == 'verl-cluster' else prog}: {message}", f"see `{command} --help`", rc)
        return rc
    except BaseException as e:  # noqa: BLE001 - the one place errors become messages
        return report_error(e, debug, as_json)
