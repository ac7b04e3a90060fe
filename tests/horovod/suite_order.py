"""A pytest plugin for the vendored Horovod suites (``-p suite_order``, loaded by
tests/horovod/run.py): with HVD_SUITE_REVERSE=1 (run.py --reverse) the tests run in
reverse order, to check that no result depends on the tests before it.  (Not a conftest.py:
a second conftest module would shadow tests/conftest.py in the repository's own run, which
ignores this folder: see ``collect_ignore`` there.)"""
import os


def pytest_collection_modifyitems(session, config, items):
    if os.environ.get("HVD_SUITE_REVERSE") == "1":
        items.reverse()
