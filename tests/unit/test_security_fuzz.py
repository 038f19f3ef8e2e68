"""Hostile input to every command that reads a file: generated YAML bombs, oversize and malformed files, hostile keys
and values, hostile scripts. Each must be refused with exit 2, one error line (plus at most a hint), no traceback,
within 2 s, and no payload may create a file (the injections try `touch`).

In-process (`main()`), with HOME and the working directory in a fresh folder, so the whole set runs in a few seconds.
"""

import os
import time
from pathlib import Path

import pytest

from verl_cluster.cli import main
from verl_cluster.config.loader import MAX_BYTES, MAX_SCALAR

ROOT = Path(__file__).resolve().parents[2]
LIMIT_S = 2.0
MARK = "PWNED"  # every injection below tries to create a file with this in its name


def _laughs(levels=9, width=9) -> str:
    out = "l0: &l0 [" + ",".join(["lol"] * width) + "]\n"
    for i in range(1, levels):
        out += f"l{i}: &l{i} [" + ",".join([f"*l{i - 1}"] * width) + "]\n"
    return out


def _structural(base: str, section: str = "") -> dict[str, str | bytes]:
    """Attacks on the YAML reader itself, each as a file that starts like a valid one (`base`). With `section` (a
    free-form mapping of the schema) the payload sits where any value is accepted, so only the reader's bounds
    can refuse it."""
    def put(block: str) -> str:
        if not section:
            return base + block
        return base + f"{section}:\n" + "".join(f"  {ln}\n" for ln in block.splitlines())

    first = base.splitlines()[0]
    return {
        "billion-laughs": put(_laughs()),
        "laughs-in-a-value": put("x: " + "{a: " * 3 + "1" + "}" * 3 + "\n" + _laughs(7, 8)),
        "self-merge": put("h: &h\n  a: 1\n  <<: *h\n"),
        "self-alias": put("h: &h [1, *h]\n"),
        "deep-flow": put("x: " + "[" * 3000 + "]" * 3000 + "\n"),
        "deep-block": put("".join("  " * i + f"k{i}:\n" for i in range(100)) + "  " * 100 + "v: 1\n"),
        "wide-map": put("x: {" + ",".join(f"k{i}: {i}" for i in range(120_000))[:MAX_BYTES - 200] + "}\n"),
        "long-value": put("x: " + "A" * (MAX_SCALAR + 10) + "\n"),
        "long-key": put("? " + "K" * 20_000 + "\n: 1\n"),
        "oversize": base + "# pad\n" * (MAX_BYTES // 6 + 10),
        "duplicate-key": base + first + "\n",
        "python-tag": put("x: !!python/object/apply:os.system ['touch PWNED-tag']\n"),
        "not-utf8": base.encode() + b"# \xff\xfe\xfd\n",
        "nul-bytes": base + "# a\0b\n",
        "two-documents": base + "---\n" + base,
        "top-level-list": "- 1\n- 2\n",
        "unknown-alias": put("x: *nowhere\n"),
        "tab-indent": put("x:\n\t- 1\n"),
    }


CLUSTER_BASE = "cluster_name: fz\n"
CLUSTER_FIELDS = {
    "proxycommand-host": "head: {host: 'x:22 -oProxyCommand=touch${IFS}PWNED-h;#'}\n",
    "semicolon-host": "head: {host: '10.0.0.2; touch PWNED-s'}\n",
    "newline-host": 'head: {host: "gpu1\\ntouch PWNED-n"}\n',
    "option-user": "head: {host: localhost}\nssh: {user: '-oProxyCommand=touch PWNED-u'}\n",
    "semicolon-ray": "head: {host: localhost, ray_executable: '/v/bin/ray; touch PWNED-r'}\n",
    "dash-env-key": "head: {host: localhost, env: {'-S': 'touch PWNED-e'}}\n",
    "shell-env-key": "head: {host: localhost}\nray: {env: {'X=1; touch PWNED-k; Y': v}}\n",
    "control-path": 'head: {host: localhost}\nsecurity: {token_file: "/tmp/t\\ntouch PWNED-p"}\n',
    "bad-node-ip": "head: {host: localhost, node_ip: '$(touch PWNED-i)'}\n",
    "open-dashboard": "head: {host: localhost}\nsecurity: {auth: none, dashboard_host: all}\n",
}
JOB_BASE = "name: fz\ncommand: [python, x.py]\nlauncher: torchrun\nmodel: {catalog: qwen2.5-0.5b}\n"
JOB_FIELDS = {
    "env-injection": "env: {'X=1; touch PWNED-j; Y': v}\n",
    "env-dash": "env: {'-S': v}\n",
    "secret-name": "secrets: ['A;touch PWNED-s']\n",
    "runtime-env-key": "runtime_env: {env_vars: {'a b': v}}\n",
    "cluster-newline": 'cluster: "c\\ntouch PWNED-c.yaml"\n',
    "working-dir-control": 'working_dir: "w\\u001b[2J"\n',
}
SCRIPTS = {
    "arith-bomb": "export N=$(( 9**9**9 ))\npython3 -m verl.trainer.main_ppo a=$N\n",
    "arith-chain": "export N=$(( " + "+".join(["1"] * 3000) + " ))\npython3 -m verl.trainer.main_ppo a=$N\n",
    "arith-nest": "export N=$(( " + "(" * 400 + "1" + ")" * 400 + " ))\npython3 -m verl.trainer.main_ppo a=$N\n",
    "command-sub": "export N=$(touch PWNED-cs)\npython3 -m verl.trainer.main_ppo a=$N\n",
    "backticks": "export N=`touch PWNED-bt`\npython3 -m verl.trainer.main_ppo a=$N\n",
    "eval": "eval 'touch PWNED-ev'\npython3 -m verl.trainer.main_ppo a=1\n",
    "pipe": "python3 -m verl.trainer.main_ppo a=1 | tee PWNED-pipe\n",
    "oversize": "# pad\n" * (MAX_BYTES // 6 + 10) + "python3 -m verl.trainer.main_ppo a=1\n",
    "not-utf8": b"#!/bin/bash\npython3 -m verl.trainer.main_ppo a=\xff\n",
    "unterminated": "python3 -m verl.trainer.main_ppo a='x\n",
    "bad-export": "export 'X;touch PWNED-x'=1\npython3 -m verl.trainer.main_ppo a=1\n",
    "env-key-prefix": "'-S'=1 python3 -m verl.trainer.main_ppo a=1\n",
}
CLI_VALUES = {  # hostile values on the command line, with a valid job file
    "override-bomb": ["x=[" + ", ".join(f"&a{i} [*a{i - 1},*a{i - 1},*a{i - 1},*a{i - 1},*a{i - 1},*a{i - 1},"
                                          f"*a{i - 1},*a{i - 1},*a{i - 1},*a{i - 1}]" if i else "&a0 [1,1,1,1,1,1,1,1,1,1]"
                                          for i in range(7)) + "]"],
    "env-override": ["env.-S=touch PWNED-o"],
    "env-override-semicolon": ["env.A;touch PWNED-o2=1"],
    "deep-key": [".".join(["k"] * 200) + "=1"],
    "many-overrides": [f"overrides.k{i}=1" for i in range(5000)],
}


def _cases():
    out = []
    for name, text in _structural(CLUSTER_BASE + "head: {host: localhost}\n").items():
        out.append(("up", f"cluster-{name}", text))
    for name, text in CLUSTER_FIELDS.items():
        out.append(("up", f"cluster-{name}", CLUSTER_BASE + text))
    structural_jobs = _structural(JOB_BASE, "overrides")
    for cmd in ("plan", "submit", "sbatch"):
        for name in ("billion-laughs", "self-merge", "deep-flow", "wide-map", "long-value", "oversize",
                     "duplicate-key", "python-tag", "not-utf8"):
            out.append((cmd, f"job-{name}", structural_jobs[name]))
        for name, text in JOB_FIELDS.items():
            out.append((cmd, f"job-{name}", JOB_BASE + text))
    for name in ("laughs-in-a-value", "self-alias", "deep-block", "long-key", "nul-bytes", "two-documents",
                 "top-level-list", "unknown-alias", "tab-indent"):
        out.append(("submit", f"job-{name}", structural_jobs[name]))
    for name, text in SCRIPTS.items():
        out.append(("import", f"script-{name}", text))
    for name, words in CLI_VALUES.items():
        out.append(("submit", f"cli-{name}", words))
    out.append(("sbatch", "cli-log-dir", ["--log-dir", "l\ntouch PWNED-ld"]))
    out.append(("sbatch", "cli-sbatch-arg", ["--sbatch-arg", "--x=1\ntouch PWNED-sa"]))
    return out


CASES = _cases()


def _argv(cmd: str, payload: Path | None, extra: list[str]) -> list[str]:
    local = str(ROOT / "cluster_configs/local.yaml")
    if cmd == "up":
        return ["up", "-c", str(payload), "--dry-run"]
    if cmd == "plan":
        return ["plan", str(payload), "--gpus", "1x8xH100-80GB"]
    if cmd == "submit":
        return ["submit", str(payload), "-c", local, "--dry-run", *extra]
    if cmd == "sbatch":
        return ["sbatch", str(payload), "--dry-run", *extra]
    return ["import", str(payload)]


def _files(folder: Path) -> set[str]:
    return {str(p.relative_to(folder)) for p in folder.rglob("*")}


@pytest.fixture(scope="module")
def warm():
    """Import every command's modules once, so the timings below are the commands' own."""
    for argv in (["up", "--help"], ["plan", "--help"], ["submit", "--help"], ["sbatch", "--help"],
                 ["import", "--help"]):
        try:
            main(argv)
        except SystemExit:
            pass


@pytest.mark.parametrize("cmd,name,payload", CASES, ids=[f"{c}-{n}" for c, n, _ in CASES])
def test_hostile_input_is_refused_fast_in_one_line(cmd, name, payload, tmp_path, monkeypatch, capsys, warm):
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(tmp_path)
    if isinstance(payload, list):  # hostile command-line values with a valid file
        path, extra = tmp_path / "job.yaml", payload
        path.write_text(JOB_BASE)
    else:
        path = tmp_path / ("run.sh" if cmd == "import" else "input.yaml")
        path.write_bytes(payload if isinstance(payload, bytes) else payload.encode())
        extra = []
    before = _files(tmp_path)
    capsys.readouterr()
    t0 = time.monotonic()
    rc = main(_argv(cmd, path, extra))
    took = time.monotonic() - t0
    cap = capsys.readouterr()
    lines = cap.err.strip().splitlines()
    if lines and lines[0].startswith("cluster: "):  # which cluster file the command read (every command says it)
        lines = lines[1:]
    assert rc == 2, (rc, cap.err[-500:], cap.out[-300:])
    assert took <= LIMIT_S, f"{took:.2f}s"
    assert "Traceback" not in cap.err and cap.out == ""
    assert lines[0].startswith("error: ") and len(lines) <= 2 and all(ln.startswith("hint: ") for ln in lines[1:]), \
        cap.err[:500]
    assert len(cap.err) < 5000
    assert _files(tmp_path) == before, _files(tmp_path) - before
    assert not list(tmp_path.rglob(f"*{MARK}*"))


@pytest.mark.parametrize("cmd", ["up", "plan", "submit", "sbatch", "import"])
def test_the_valid_bases_pass(cmd, tmp_path, monkeypatch, capsys, warm):
    """So each refusal above is the payload's doing, not the base's."""
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    path = tmp_path / ("run.sh" if cmd == "import" else "input.yaml")
    path.write_text({"up": CLUSTER_BASE + "head: {host: localhost}\n",
                     "import": "python3 -m verl.trainer.main_ppo a=1\n"}.get(cmd, JOB_BASE))
    assert main(_argv(cmd, path, [])) == 0, capsys.readouterr().err


def test_the_set_covers_every_command_and_stays_small():
    cmds = {c for c, _, _ in CASES}
    assert cmds == {"up", "plan", "submit", "sbatch", "import"}
    assert 40 <= len(CASES) <= 120
