"""Fixtures shared by the tests: one real-process cluster for the whole session (five
nodes, groups for `/py/locks` and `/py/watch` besides the root group, a router), and a
unique path prefix per test so tests sharing the cluster never see each other's nodes."""

import itertools
import re
from pathlib import Path
from typing import Iterator

import pytest

import warden
from cluster import ProcessCluster

# The package under test is the installed one (its stubs are generated at build time), not
# the source tree next to these tests.
assert Path(warden.__file__).resolve().parent != Path(__file__).resolve().parent.parent / "warden", (
    "tests import the source tree: install the package (pip install --target DIR client/python) and put DIR on PYTHONPATH"
)

#: Prefixes served by groups of their own (a lock group to kill the leader of, a watch group).
LOCK_PREFIX = "/py/locks"
WATCH_PREFIX = "/py/watch"

_unique = itertools.count(1)


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProcessCluster]:
    """The shared cluster: five `warden node`s, `warden admin bootstrap`, a group for each of
    LOCK_PREFIX and WATCH_PREFIX, and a router."""
    directory = tmp_path_factory.mktemp("cluster")
    started = ProcessCluster(directory, [LOCK_PREFIX, WATCH_PREFIX])
    try:
        yield started
    finally:
        started.stop()
        print(f"cluster logs in {directory}")


@pytest.fixture
def endpoint(cluster: ProcessCluster) -> str:
    """The cluster's router."""
    return cluster.router_addr


@pytest.fixture
def prefix(request: pytest.FixtureRequest) -> str:
    """A path of this test's own under `/py/t` (root group)."""
    name = re.sub(r"[^a-z0-9]+", "-", request.node.name.lower()).strip("-")[:40]
    return f"/py/t/{name}-{next(_unique)}"
