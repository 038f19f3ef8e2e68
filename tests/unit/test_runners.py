"""Runners: quoting at the SSH boundary, the local runner, fan-out keeps every host."""

import shlex
import subprocess
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from verl_cluster.errors import RunnerError
from verl_cluster.runners import LocalRunner, fan_out
from verl_cluster.runners.base import CommandTimeout
from verl_cluster.runners.ssh import SshRunner


@given(argv=st.lists(st.text(min_size=0, max_size=20), min_size=1, max_size=5),
       env=st.dictionaries(st.from_regex(r"[A-Z_][A-Z0-9_]{0,8}", fullmatch=True), st.text(max_size=10), max_size=3))
def test_command_line_round_trips_through_a_shell_parser(argv, env):
    argv = [a.replace("\0", "") for a in argv]
    env = {k: v.replace("\0", "") for k, v in env.items()}
    line = SshRunner.command_line(argv, env, timeout=7)
    parts = shlex.split(line)
    assert parts[:4] == ["timeout", "-k", "5", "7"]
    assert parts[4] == "env" if env else True
    assert parts[-len(argv):] == argv
    for k, v in env.items():
        assert f"{k}={v}" in parts


def test_injection_is_inert(tmp_path):
    """A hostile argument reaches the program as one literal string when run through sh -c."""
    marker = tmp_path / "pwned"
    evil = f"x; touch {marker}; echo $(touch {marker})`touch {marker}`"
    line = SshRunner.command_line(["echo", evil], {"V": f"'$(touch {marker})"})
    out = subprocess.run(["sh", "-c", line], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == evil
    assert not marker.exists()


def test_local_runner_env_rc_stdin():
    r = LocalRunner()
    res = r.run(["sh", "-c", 'echo "$FOO"; cat; exit 3'], env={"FOO": "bar baz"}, stdin="in\n")
    assert res.rc == 3 and res.stdout == "bar baz\nin\n" and not res.ok


def test_local_runner_timeout_and_missing():
    r = LocalRunner()
    t0 = time.monotonic()
    with pytest.raises(CommandTimeout):
        r.run(["sleep", "5"], timeout=0.5)
    assert time.monotonic() - t0 < 3
    with pytest.raises(RunnerError, match="not found"):
        r.run(["/no/such/binary"])


def test_local_popen_streams_and_terminates():
    p = LocalRunner().popen(["sh", "-c", "echo one; echo two; sleep 30"])
    lines = p.lines()
    assert next(lines) == "one" and next(lines) == "two"
    t0 = time.monotonic()
    p.terminate()
    assert p.wait(5) != 0 and time.monotonic() - t0 < 6


def test_local_put_text_mode(tmp_path):
    dst = LocalRunner().put_text("secret", str(tmp_path / "a/b/tok"), 0o600)
    assert (tmp_path / "a/b/tok").read_text() == "secret"
    assert oct((tmp_path / "a/b/tok").stat().st_mode & 0o777) == "0o600" and dst.endswith("tok")


def test_fan_out_returns_every_host_in_order():
    def work(x):
        if x == "b":
            raise RunnerError("b", "connection refused")
        time.sleep(0.5)
        return x.upper()

    t0 = time.monotonic()
    res = fan_out(["a", "b", "c"], work)
    assert time.monotonic() - t0 < 0.9  # parallel: one after another takes 1 s or more
    assert [r.host for r in res] == ["a", "b", "c"]
    assert res[0].value == "A" and res[2].value == "C"
    assert not res[1].ok and res[1].reason == "connection refused"


def test_local_timeout_kills_the_whole_process_group(tmp_path):
    pidfile = tmp_path / "child"
    with pytest.raises(CommandTimeout):
        LocalRunner().run(["sh", "-c", f"sleep 60 & echo $! > {pidfile}; wait"], timeout=2)  # room to write it
    child = int(pidfile.read_text())
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and subprocess.run(["kill", "-0", str(child)]).returncode == 0:
        time.sleep(0.1)
    assert subprocess.run(["kill", "-0", str(child)], capture_output=True).returncode != 0


def test_local_popen_of_a_non_executable_is_a_runner_error(tmp_path):
    f = tmp_path / "script"
    f.write_text("#!/bin/sh\necho hi\n")  # not chmod +x
    with pytest.raises(RunnerError, match="not executable"):
        LocalRunner().popen([str(f)])
