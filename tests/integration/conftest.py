"""Integration modules run side by side under pytest-xdist (`--dist loadgroup`, see scripts/test.sh): each module
stays in one worker with its own lab and cluster, and every test on the session's shared cluster goes to one
worker, so that cluster is started once. The tests mostly wait on Ray and sshd (a serial run keeps a 2-core
machine about a third busy)."""

import pytest


def pytest_collection_modifyitems(config, items):
    for item in items:
        group = "shared-cluster" if "shared_cluster" in getattr(item, "fixturenames", ()) else item.module.__name__
        item.add_marker(pytest.mark.xdist_group(group))
