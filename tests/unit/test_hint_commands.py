"""Every `verl-cluster ...` command a message tells the user to run parses as written: a hint that sends the user
to a command or argument that does not exist (`doctor CLUSTER.yaml`, when doctor takes no cluster) is a dead end."""

import re
from pathlib import Path

import pytest

from verl_cluster.cli import build_parser

ROOT = Path(__file__).resolve().parents[2]
HINT = re.compile(r"`verl-cluster ([^`{\[|\"\n]+)`")  # literal ones: no f-string field, no [optional] or a|b forms
PLACEHOLDER = {"M": "2", "SHELL": "bash"}  # words an argument's type would refuse as they are written


def hints() -> list[tuple[str, str]]:
    got = []
    for py in sorted((ROOT / "verl_cluster").rglob("*.py")):
        for m in HINT.finditer(py.read_text()):
            words = m.group(1).split(">")[0].split()  # `doctor --json > NODE.json`: the shell's redirect is not ours
            got.append((f"{py.relative_to(ROOT)}: `verl-cluster {m.group(1)}`",
                        " ".join(PLACEHOLDER.get(w, w) for w in words)))
    return got


def test_the_sources_have_hints_to_check():
    assert len(hints()) >= 30


@pytest.mark.parametrize("where, line", hints(), ids=lambda v: v if isinstance(v, str) and "`" not in v else None)
def test_a_hinted_command_parses(where, line):
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command").choices
    words = line.split()
    if len(words) == 1:  # a command named in passing (`verl-cluster plan`), or a top-level flag (`--help`)
        assert words[0] in sub or words[0] in parser._option_string_actions, f"{where}: no such command"
        return
    try:
        parser.parse_args(line.split())
    except SystemExit as e:
        assert e.code == 0, f"{where} does not parse"
