"""README's tour, run as README writes it: every fenced `verl-cluster ...` line of "A tour, with real output" and
"The GSM8K path" is read from README.md itself (so README cannot drift from the commands) and run, in README's
order, from a folder outside the checkout with a HOME of its own, on this machine as a one-node cluster (`up` once,
`down` at the end). Only the lines in SKIPPED do not run, each with why. A line runs as a shell would run it
(`~` expanded, a README example submission id replaced by the one the tour's `submit` printed) with the venv's
bin on PATH, as README's `source .venv/bin/activate` sets it.

Each command must end as README says (exit 1 where its output says the job does not fit, else 0), print no
traceback, say which cluster it used, and print the first line of output README shows for it (figures, paths and
the cluster's name aside). The files a line names (`launch/smoke.yaml`, the fixtures) are copied into the folder
first: a user runs the tour on their own copies. Which cluster: README's first `up` finds nothing recorded and takes
the packaged one-node default; here `$VERL_CLUSTER` names a copy of it with its ports moved (so the tour meets no Ray
already on this machine) for that `up` only, and every later line finds it as a user's does, the one cluster up."""

from __future__ import annotations

import fcntl
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
SECTIONS = ("A tour, with real output", "The GSM8K path")
NAME = "readme-tour"

# README line (as written, `$ ` and comments dropped) -> why it does not run here
SKIPPED = {
    "verl-cluster dashboard -c my.yaml --open": "network: an SSH tunnel to a remote head, opened in a browser",
    'eval "$(verl-cluster env -c prod)"': "network: the exports of a remote cluster named prod",
    "verl-cluster plan launch/gsm8k.yaml --data ~/data/gsm8k/train.parquet":
        "GPU: plans on this machine's GPUs (no --gpus); and the GSM8K files are downloaded",
    "verl-cluster submit launch/gsm8k.yaml --dry-run": "GPU: preflight needs the 8 GPUs the job asks for",
    "verl-cluster submit launch/gsm8k.yaml data.train_batch_size=256": "GPU: a verl PPO run",
}

# ports no other test and no default Ray uses (tests/integration/test_lifecycle.py's local cycle has its own)
PORTS = {"head": {"gcs_port": 6581, "dashboard_port": 8467, "ray_client_port": 10203},
         "ray.ports": {"node_manager": 6910, "object_manager": 6911, "dashboard_agent_grpc": 6912,
                       "dashboard_agent_listen": 52567, "metrics_export": 6913, "runtime_env_agent": 6914,
                       "min_worker": 22002, "max_worker": 22999}}
EXAMPLE_ID = re.compile(r"\b[a-z0-9][a-z0-9_.-]*-\d{8}-\d{6}-\d{3}\b")  # a submission id as README shows one
NUMBER = re.compile(r"(?<![A-Za-z0-9.])\d+(?:\.\d+)*")  # times, sizes, ids; not a name's (qwen2.5, H100)
PATH = re.compile(r"(?<![\w.])/[\w.\-/]+")  # /home/me/... in README, the tour's own folder here


@dataclass
class Line:
    command: str  # as README writes it, its comment dropped
    shown: list[str] = field(default_factory=list)  # the output README shows under it


def section(text: str, title: str) -> str:
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start:end if end > 0 else len(text)]


def ours(command: str) -> bool:
    words = shlex.split(command)
    return bool(words) and (words[0] == "verl-cluster" or (words[0] == "eval" and "verl-cluster" in command))


def tour_lines(text: str) -> list[Line]:
    """The verl-cluster lines of the two sections' fenced blocks, in order, with the output shown under each (a
    block with `$ ` prompts shows output; one without is commands and comments)."""
    lines: list[Line] = []
    for title in SECTIONS:
        for block in re.findall(r"^```[a-z]*\n(.*?)^```", section(text, title), re.S | re.M):
            rows = block.replace("\\\n", " ").splitlines()  # a continued line is one command
            prompts = any(r.startswith("$ ") for r in rows)
            current = None
            for row in rows:
                if prompts and not row.startswith("$ "):
                    if current is not None:
                        current.shown.append(row)
                    continue
                command = " ".join(re.sub(r"\s#\s.*$", "", row[2:] if prompts else row).split())
                current = Line(command) if command and not command.startswith("#") and ours(command) else None
                if current is not None:
                    lines.append(current)
    return lines


def normal(line: str) -> str:
    """A line as compared: the tour's cluster name as README's, paths of the writer's machine as PATH, figures as
    0, runs of spaces as one."""
    return NUMBER.sub("0", PATH.sub("PATH", " ".join(line.replace(NAME, "local").split())))


def shows(expected: str, actual: list[str]) -> bool:
    """README's line (numbers aside, `...` for what it leaves out) is one of the lines printed."""
    pattern = ".*".join(re.escape(part) for part in normal(expected).split("..."))
    return any(re.fullmatch(pattern, normal(a)) for a in actual)


@pytest.fixture
def tour_dir(tmp_path):
    """A folder outside the checkout with a HOME of its own, the environment a user's shell has there, and the
    one-node default with its ports moved as $VERL_CLUSTER."""
    assert not str(tmp_path.resolve()).startswith(str(ROOT))
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    doc = yaml.safe_load((ROOT / "verl_cluster/cluster_configs/local.yaml").read_text())
    doc["cluster_name"] = NAME
    doc["head"].update(PORTS["head"])
    doc["ray"]["ports"] = PORTS["ray.ports"]
    cluster = tmp_path / "tour.yaml"
    cluster.write_text(yaml.safe_dump(doc))
    env = {**os.environ, "HOME": str(home), "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
           "COLUMNS": "200"}
    env.pop("VERL_CLUSTER", None)
    with open("/var/tmp/vc-readme-tour.lock", "w") as lock:  # fixed ports: a second run waits for this one
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield work, env, cluster


def copy_named_files(words: list[str], work: Path) -> None:
    """The checkout's files a line names, copied to the same relative place under `work`; a job file with the
    folder it sits in (its working_dir and scripts are there)."""
    for word in words:
        part = word.split("=", 1)[-1]
        src = ROOT / part
        if not part or part.startswith(("/", "~", "-")) or not src.exists() or src.resolve() == ROOT:
            continue
        if src.is_file() and src.suffix in (".yaml", ".yml", ".sh"):
            src, part = src.parent, str(src.parent.relative_to(ROOT))
        if (work / part).exists():
            continue
        if src.is_dir():
            shutil.copytree(src, work / part, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            (work / part).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, work / part)


def argv_of(command: str, env: dict, last_id: str | None) -> tuple[list[str], list[str] | None]:
    """(argv as a shell would run it, the jq filter it is piped to or None)."""
    words = shlex.split(command)
    pipe = None
    if "|" in words:
        cut = words.index("|")
        words, pipe = words[:cut], words[cut + 1:]
    words = [env["HOME"] + w[1:] if w == "~" or w.startswith("~/") else w for w in words]
    if last_id:
        words = [EXAMPLE_ID.sub(last_id, w) for w in words]
    return words, pipe


def test_readme_tour_runs_outside_the_checkout(tour_dir):
    work, env, cluster = tour_dir
    lines = tour_lines((ROOT / "README.md").read_text())
    written = [line.command for line in lines]
    assert set(SKIPPED) <= set(written), f"SKIPPED names lines README no longer has: {set(SKIPPED) - set(written)}"
    todo = [line for line in lines if line.command not in SKIPPED]
    assert todo and todo[0].command == "verl-cluster up", written  # the tour starts the cluster first
    ran, last_id, t0 = [], None, time.monotonic()
    try:
        for line in todo:
            argv, pipe = argv_of(line.command, env, last_id)
            copy_named_files(argv, work)
            # `up` first, as README's, with nothing recorded: the one-node default, here its copy with the ports
            # moved; every later line finds it as a user's does, the one cluster up here
            first = {"VERL_CLUSTER": str(cluster)} if line is todo[0] else {}
            r = subprocess.run(argv, cwd=work, env=env | first, capture_output=True, text=True, timeout=180)
            said = r.stdout + r.stderr
            ran.append(f"{line.command}: exit {r.returncode} ({time.monotonic() - t0:.0f}s)")
            want = 1 if line.shown and "does not fit" in line.shown[0] else 0
            assert r.returncode == want, (line.command, r.returncode, said[-3000:])
            assert "Traceback" not in said and "internal error" not in said, (line.command, said[-3000:])
            if argv[1] not in ("plan", "jobs"):  # plan --gpus reads none; jobs names each it lists
                # every other command says which cluster it used
                assert any(x.startswith(f"cluster: {NAME} (") for x in r.stderr.splitlines()), (line.command, said)
            if argv[1] == "submit":
                found = EXAMPLE_ID.search(r.stderr.split("submitted ", 1)[-1])
                last_id = found.group(0) if found else last_id
            printed = said.splitlines()
            if pipe and shutil.which(pipe[0]):
                piped = subprocess.run(pipe, input=r.stdout, capture_output=True, text=True, timeout=30,
                                       check=True).stdout
                if line.shown and line.shown[0].startswith("{"):  # what jq printed, compared as JSON
                    assert normal(json.dumps(json.loads(piped))) == normal(json.dumps(json.loads(line.shown[0]))), \
                        (line.command, piped, line.shown[0])
                    continue
                printed = piped.splitlines()
            elif pipe:
                json.loads(r.stdout)  # no jq here: the document it would read is JSON
                continue
            shown = [x for x in line.shown if x.strip() and x.strip() != "..."]
            if shown:
                assert shows(shown[0], printed), (line.command, shown[0], printed[:20])
    finally:
        down = subprocess.run(["verl-cluster", "down", "-c", str(cluster)], cwd=work, env=env, capture_output=True,
                              text=True, timeout=120)  # named: once it is down, no -c would mean the default
    assert down.returncode == 0, down.stderr[-2000:]
    assert time.monotonic() - t0 < 120, ran
