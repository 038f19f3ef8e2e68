"""Integration modules run side by side under pytest-xdist (`--dist loadgroup`, see scripts/test.sh): each module
stays in one worker with its own lab and cluster, and every test on the session's shared cluster goes to one
worker, so that cluster is started once. The tests mostly wait on Ray and sshd (a serial run keeps a 2-core
machine about a third busy). The groups must be marked before xdist's own hook reads them, and pytest 9.2 drops
the group xdist 3.8 puts in a test's id (pytest-dev/pytest-xdist#1386; pyproject pins pytest below it): either way
loadgroup runs as plain load, every module's fixtures built on both workers, so the last hook stops such a run."""

import pytest


@pytest.hookimpl(tryfirst=True)  # before xdist's worker hook, which appends each test's group to its id
def pytest_collection_modifyitems(config, items):
    for item in items:
        group = "shared-cluster" if "shared_cluster" in getattr(item, "fixturenames", ()) else item.module.__name__
        item.add_marker(pytest.mark.xdist_group(group))


def pytest_xdist_node_collection_finished(node, ids):
    """On the controller under --dist loadgroup: every test here has a group, so each id a worker reports must carry
    it (`name@group`), or the scheduler spreads the module over both workers as plain load would."""
    if node.config.getvalue("dist") == "loadgroup" and ids and not any("@" in i for i in ids):
        pytest.exit(f"pytest-xdist's --dist loadgroup is not honoured by pytest {pytest.__version__} "
                    f"(pytest-dev/pytest-xdist#1386: {ids[0]} came back without its group): install pytest<9.2, "
                    "as pyproject's test extra pins it", returncode=4)
