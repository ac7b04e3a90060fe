"""The vendored Horovod suites are run by tests/horovod/run.py inside a bpslaunch job (one
pytest per worker); the repository's default pytest run must not collect them.  With
HVD_SUITE_REVERSE=1 (run.py --reverse) the tests run in reverse order, to check that no
result depends on the tests before it."""
import os

collect_ignore = ["parallel", "utils", "run.py"]


def pytest_collection_modifyitems(session, config, items):
    if os.environ.get("HVD_SUITE_REVERSE") == "1":
        items.reverse()
