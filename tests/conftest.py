import os
import pwd
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.harness import NetnsLab, integration_ready  # noqa: E402
from tests.harness.ray_cluster import SharedCluster, running_cluster  # noqa: E402


# The suite runs with a HOME of its own: nothing a test or the CLI it starts writes under ~ (cluster state, tokens,
# job records, known_hosts) reaches the user's, and a cluster name that matches one of theirs cannot reuse their
# token. At the end the user's ~/.verl-cluster and ~/.ssh are compared with how they were before the run.
_REAL_HOME = Path(os.environ.get("HOME") or pwd.getpwuid(os.getuid()).pw_dir)
_GUARDED = (".verl-cluster", ".ssh")


def _snapshot(home: Path) -> dict[str, tuple[int, int]]:
    out = {}
    for top in _GUARDED:
        root = home / top
        for p in [root, *root.rglob("*")] if root.exists() else []:
            st = p.lstat()
            out[str(p)] = (st.st_size, st.st_mtime_ns)
    return out


def pytest_configure(config):
    config._vc_real_home = (_REAL_HOME, _snapshot(_REAL_HOME))
    home = tempfile.mkdtemp(prefix="vc-test-home-", dir="/var/tmp")  # not /tmp: the namespace hosts hide it
    config._vc_suite_home = home
    os.environ["HOME"] = home
    os.environ["COLUMNS"] = "200"  # the CLI's tables wrap at the terminal's width; tests read them whole


def pytest_sessionfinish(session, exitstatus):
    real, before = session.config._vc_real_home
    after = _snapshot(real)
    changed = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
    if changed:
        print(f"\nthe suite touched the user's home ({real}): " + ", ".join(changed[:10]), file=sys.stderr)
        session.exitstatus = 1
    shutil.rmtree(session.config._vc_suite_home, ignore_errors=True)


@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    """A home of the test's own (created), as HOME: records, tokens and run folders land there."""
    h = tmp_path / "home"
    h.mkdir()
    monkeypatch.setenv("HOME", str(h))
    return h


@pytest.fixture
def real_home() -> Path:
    """The home the suite was started from (the tests themselves run with HOME pointing elsewhere)."""
    return _REAL_HOME


def require_integration() -> None:
    """Skip (or fail under VC_REQUIRE_INTEGRATION=1, as in CI) when this machine cannot make namespaces."""
    reason = integration_ready()
    if reason:
        if os.environ.get("VC_REQUIRE_INTEGRATION") == "1":
            pytest.fail(f"integration prerequisites missing: {reason}")
        pytest.skip(reason)


@pytest.fixture
def lab():
    """A fresh namespace lab; hosts are added with lab.add_host(name)."""
    require_integration()
    with NetnsLab() as lab:
        yield lab


@pytest.fixture(scope="module")
def module_lab():
    """One lab shared by a module's tests (a Ray cluster costs seconds to start)."""
    require_integration()
    with NetnsLab() as lab:
        yield lab


@pytest.fixture(scope="session")
def shared_cluster():
    """One healthy two-node Ray cluster (head + w1, NCCL/Gloo pinned to eth0) for every module that only submits
    to a cluster and reads it: starting one costs ~20 s of a 2-core machine. Tests leave it as they found it
    (their own jobs stopped, no node taken down); hosts they add to its lab stay until the session ends."""
    require_integration()
    with NetnsLab() as lab:
        head, w1 = lab.add_host("head"), lab.add_host("w1")
        with running_cluster(lab, head, [w1], name=f"shared{lab.n}", extra="network:\n  interface: eth0\n") as path:
            yield SharedCluster(lab, path, head, w1)
