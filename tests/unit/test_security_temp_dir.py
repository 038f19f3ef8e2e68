"""Ray's temp dir: the rules judged on each node (temp_dir_node.py), the node script's `start` (made 0700, refused, or
Ray started from inside it), the per-user default and the earlier shared one (/tmp/vc-<cluster>) still found."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from tests.harness.wait import wait_for
from verl_cluster.config.cluster import load_cluster
from verl_cluster.errors import ConfigError
from verl_cluster.nodes import node_script
from verl_cluster.nodes.agent import SCRIPT
from verl_cluster.nodes.temp_dir_node import prepare_temp_dir, temp_dir_problem
from verl_cluster.lifecycle.up import _refusal
from verl_cluster.runners.remote_python import MARK

NOBODY = 65534
as_root = pytest.mark.skipif(os.getuid() != 0, reason="making another user's folder needs root")


def mode(path) -> int:
    return os.stat(path).st_mode & 0o7777


def test_missing_folders_are_made_0700_and_pass(tmp_path):
    temp = tmp_path / "vc-1" / "c"
    assert temp_dir_problem(str(temp)) is None  # nothing there yet: `up` makes it
    old = os.umask(0)  # a lax umask must not leak into the new folders
    try:
        assert prepare_temp_dir(str(temp)) is None
    finally:
        os.umask(old)
    assert mode(temp.parent) == 0o700 and mode(temp) == 0o700
    os.chmod(temp, 0o777)  # what Ray does to its temp dir: the private parent is what keeps others out
    assert temp_dir_problem(str(temp)) is None


@pytest.mark.parametrize("loose", [0o755, 0o750, 0o711, 0o777, 0o707])
def test_a_parent_others_may_enter_is_refused_with_chmod(tmp_path, loose):
    temp = tmp_path / "vc-1" / "c"
    prepare_temp_dir(str(temp))
    os.chmod(temp.parent, loose)
    what, fix = temp_dir_problem(str(temp))
    assert f"{temp.parent} (owner " in what and f"mode {loose:04o}) lets others in" in what
    assert fix.startswith(f"chmod 700 {temp.parent}")
    assert prepare_temp_dir(str(temp)) == [what, fix]  # `start` refuses it as well; it never loosens or fixes


def test_a_shared_sticky_parent_such_as_tmp_is_refused_without_chmod_advice(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o1777)
    what, fix = temp_dir_problem(str(shared / "vc-c"))
    assert "is a folder users share" in what and "chmod" not in fix and "/tmp/vc-" in fix
    what, _ = temp_dir_problem("/tmp/vc-some-cluster")  # the earlier default's place
    assert "/tmp (owner root, mode 1777)" in what


def test_an_ancestor_others_can_write_without_sticky_bit_is_refused(tmp_path):
    open_ = tmp_path / "open"
    open_.mkdir()
    os.chmod(open_, 0o777)
    temp = open_ / "mine" / "c"
    assert prepare_temp_dir(str(temp))[0].startswith(f"{open_} (owner ")
    assert "writable by others without the sticky bit" in temp_dir_problem(str(temp))[0]


@as_root
def test_another_users_parent_temp_dir_ancestor_or_symlink_is_refused(tmp_path):
    parent = tmp_path / "vc-1"
    parent.mkdir(mode=0o700)
    temp = parent / "c"
    os.chown(parent, NOBODY, -1)
    what, fix = temp_dir_problem(str(temp))
    assert f"{parent} (owner nobody, mode 0700) is not yours" in what and f"remove {parent}" in fix
    os.chown(parent, 0, -1)
    temp.mkdir()
    os.chown(temp, NOBODY, -1)
    what, _ = temp_dir_problem(str(temp))
    assert f"the temp dir {temp} (owner nobody" in what and "is not yours" in what
    # an ancestor that belongs to another user (not root): they could swap the folders below it
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    os.chown(theirs, NOBODY, -1)
    assert "belongs to another user" in temp_dir_problem(str(theirs / "p" / "c"))[0]
    # a symlink another user placed on the way chooses where the temp dir goes
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "vc-1")
    os.lchown(link, NOBODY, -1)
    assert f"{link} is a symlink owned by nobody" in temp_dir_problem(str(link / "c"))[0]


def test_judged_as_the_given_user(tmp_path):
    """The rules are the node user's: a folder of ours is another user's folder to someone else."""
    temp = tmp_path / "vc-1" / "c"
    prepare_temp_dir(str(temp))
    assert "is not yours" in temp_dir_problem(str(temp), uid=os.getuid() + 4242)[0]


def run_script(*args, cwd=None):
    return subprocess.run([sys.executable, "-c", SCRIPT, *args], capture_output=True, text=True, timeout=30,
                          cwd=cwd)


def test_node_script_start_runs_from_inside_the_temp_dir(tmp_path):
    temp = tmp_path / "vc-1" / "c"
    caller = tmp_path / "caller"
    caller.mkdir()
    r = run_script("start", str(temp), "--", "sh", "-c", 'pwd; printf "%s\\n" "$0"', "x y", cwd=caller)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == [str(temp), "x y"]  # exec'd from there, argv passed as is
    assert mode(temp.parent) == 0o700
    r = run_script("start", str(temp), "--", str(tmp_path / "no-ray"), "start")
    assert r.returncode == 1 and r.stderr.strip() == f"cannot run {tmp_path}/no-ray: No such file or directory"


def test_node_script_start_refuses_before_running_anything(tmp_path):
    temp = tmp_path / "vc-1" / "c"
    temp.parent.mkdir(mode=0o777)
    os.chmod(temp.parent, 0o777)
    canary = tmp_path / "ran"
    r = run_script("start", str(temp), "--", "touch", str(canary))
    assert r.returncode == 2 and not canary.exists()
    what, fix = _refusal(r.stdout)
    assert "mode 0777) lets others in" in what and fix.startswith("chmod 700")
    assert not temp.exists()  # nothing made inside a folder others can enter
    assert _refusal(MARK + json.dumps({"kinds": []})) is None and _refusal("Ray runtime started") is None


def test_probe_and_kill_find_a_cluster_under_its_earlier_temp_dir(tmp_path):
    new, old = f"{tmp_path}/vc-0/a", f"{tmp_path}/vc-a"
    ray = subprocess.Popen(["sh", "-c", f"sleep 30 & wait # --temp-dir={old}"])
    try:  # the shell's child, waited for until it runs sleep (old_kinds names it) rather than for a fixed 0.3 s
        wait_for(lambda: any(pp == ray.pid and cmd.startswith("sleep")
                             for pp, cmd in node_script.read_procs().values()), 10, "the sleep")
        procs = node_script.read_procs()
        found, was = node_script.ours_and_old(new, old, procs, "10.0.0.1:6379")
        assert found == {} and ray.pid in was
        r = run_script("probe", new, "10.0.0.1:6379", old)
        doc = json.loads(r.stdout.splitlines()[-1][len(MARK):])
        assert ray.pid in doc["pids"] and doc["old_kinds"] == ["sh", "sleep"]
        # without the earlier temp dir (a config that sets ray.temp_dir) it is not ours
        doc = json.loads(run_script("probe", new, "10.0.0.1:6379").stdout.splitlines()[-1][len(MARK):])
        assert doc["pids"] == [] and doc["old_kinds"] == []
        r = run_script("kill", new, "10.0.0.1:6379", old)
        assert json.loads(r.stdout.splitlines()[-1][len(MARK):])["stopped"] == 2
        assert ray.wait(5) is not None
    finally:
        ray.kill()


def test_client_server_goes_with_the_running_temp_dir():
    """Both temp dirs' clusters name one GCS address: its client server counts for the earlier dir only when our
    Ray runs there and not under the new one."""
    procs = {10: (1, "raylet --temp_dir=/tmp/vc-0/a --node_id=ab"),
             11: (1, "python -m ray.util.client.server --address=10.0.0.1:6379 --mode=proxy")}
    found, old = node_script.ours_and_old("/tmp/vc-0/a", "/tmp/vc-a", procs, "10.0.0.1:6379")
    assert set(found) == {10, 11} and old == {}
    procs[10] = (1, "raylet --temp_dir=/tmp/vc-a --node_id=ab")
    found, old = node_script.ours_and_old("/tmp/vc-0/a", "/tmp/vc-a", procs, "10.0.0.1:6379")
    assert found == {} and set(old) == {10, 11}


def spec_of(tmp_path, body):
    p = tmp_path / "c.yaml"
    p.write_text(body)
    return load_cluster(p)


def test_default_is_per_user_and_the_earlier_one_is_looked_for(tmp_path):
    s = spec_of(tmp_path, "cluster_name: c\nhead: {host: localhost}\n")
    assert s.temp_dir == f"/tmp/vc-{os.getuid()}/c" and s.legacy_temp_dir == "/tmp/vc-c"
    s = spec_of(tmp_path, "cluster_name: c\nhead: {host: localhost}\nray: {temp_dir: '/scratch/{uid}/r-{cluster_name}'}\n")
    assert s.temp_dir == f"/scratch/{os.getuid()}/r-c" and s.legacy_temp_dir is None  # set by the user: theirs
    # a numeric name: /tmp/vc-<number> is some user's parent now, never taken for this cluster's old temp dir
    assert spec_of(tmp_path, "cluster_name: '1000'\nhead: {host: localhost}\n").legacy_temp_dir is None


def test_too_long_default_names_cluster_name(tmp_path):
    with pytest.raises(ConfigError) as e:
        spec_of(tmp_path, f"cluster_name: {'x' * 60}\nhead: {{host: localhost}}\n")
    assert "the default for this cluster_name" in e.value.message and "shorter cluster_name" in e.value.hint


@pytest.mark.parametrize("path", ["/tmp", "/tmp/", "/var/tmp", "/dev/shm", "/"])
def test_a_shared_folder_itself_is_refused_at_load(tmp_path, path):
    with pytest.raises(ConfigError, match="is a folder every user shares"):
        spec_of(tmp_path, f"cluster_name: c\nhead: {{host: localhost}}\nray: {{temp_dir: '{path}'}}\n")


FORKS_ON_TERM = """import os, signal, subprocess, sys, time
def term(*_):  # like a dying parent that starts one more child (its command line names no temp dir)
    subprocess.Popen([sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                      "open('child-up', 'w').close(); time.sleep(120)"], start_new_session=True)
    time.sleep(0.5)
    os._exit(0)
signal.signal(signal.SIGTERM, term)
open("parent-up", "w").close()
time.sleep(120)
"""


def test_kill_gets_a_child_forked_during_the_shutdown_and_orphaned(tmp_path):
    """`down`'s node kill: a Ray process that forks as it dies leaves a child whose parent is gone and whose command
    line names no temp dir; it still works in the temp dir, and goes too. Nothing outside the temp dir is touched."""
    temp = tmp_path / "ray-temp"
    temp.mkdir()
    (temp / "parent.py").write_text(FORKS_ON_TERM)
    outsider = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], cwd=tmp_path)
    parent = subprocess.Popen([sys.executable, str(temp / "parent.py"), f"--temp-dir={temp}"], cwd=temp)
    try:
        for _ in range(100):
            if (temp / "parent-up").exists():
                break
            time.sleep(0.05)
        r = subprocess.run([sys.executable, "-c", SCRIPT, "kill", str(temp)], capture_output=True, text=True,
                           timeout=60)
        assert r.returncode == 0, r.stderr
        assert (temp / "child-up").exists()  # the parent did fork on SIGTERM
        doc = json.loads(r.stdout.strip().splitlines()[-1].split(MARK, 1)[-1])
        assert doc["left"] == [] and doc["stopped"] == 2, doc
        procs = node_script.read_procs()
        assert not [pid for pid, (_, cmd) in procs.items() if "child-up" in cmd], "the orphaned child is alive"
        assert outsider.poll() is None  # not ours: its folder is not the temp dir
    finally:
        parent.kill()
        outsider.kill()
        for pid, (_, cmd) in node_script.read_procs().items():
            if "child-up" in cmd:
                os.kill(pid, signal.SIGKILL)
