import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.harness import NetnsLab, integration_ready  # noqa: E402


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
