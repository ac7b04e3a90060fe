"""The package's floors: transport imports nothing of ours; common imports only transport;
the scheduler and the server never load the worker (byteps.core); old import paths work."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from conftest import ROOT, job_env

# (what to import, prefixes of our modules it may load)
LAYERS = [
    ("byteps.transport, byteps.transport.wire, byteps.transport.shm",
     ("byteps.transport",)),
    ("byteps.common, byteps.common.errors, byteps.common.config, byteps.common.logs, "
     "byteps.common.node, byteps.common.metrics", ("byteps.transport", "byteps.common")),
    ("byteps.compression", ("byteps.compression",)),
    ("byteps.scheduler", ("byteps.scheduler", "byteps.common", "byteps.transport")),
    ("byteps.server", ("byteps.server", "byteps.common", "byteps.transport",
                       "byteps.compression")),
]


def _loaded(modules: str) -> list[str]:
    """Our modules (other than ``byteps`` itself) that importing ``modules`` loads, in a
    fresh interpreter."""
    code = (f"import sys, {modules}\nimport json\n"
            "print(json.dumps(sorted(m for m in sys.modules if m.startswith('byteps.'))))")
    out = subprocess.run([sys.executable, "-c", code], env=job_env(), cwd=ROOT,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("modules,allowed", LAYERS, ids=[m.split(",")[0] for m, _ in LAYERS])
def test_layer_imports_only_what_is_below(modules, allowed):
    loaded = _loaded(modules)
    for want in modules.split(", "):
        assert want in loaded or want == "byteps", (want, loaded)
    above = [m for m in loaded if not m.startswith(allowed)]
    assert not above, (f"importing {modules} loads {above}; only modules under {allowed} "
                       f"may be imported at module level (import others inside functions)")


def test_scheduler_and_server_do_not_load_the_worker():
    loaded = _loaded("byteps.scheduler, byteps.server")
    assert "byteps.core.engine" not in loaded and "byteps.core.api" not in loaded, loaded
    assert not [m for m in loaded if m.startswith("byteps.core")], loaded


def test_old_import_paths():
    """byteps.core.config/node/logs/metrics are the byteps.common modules themselves;
    importing byteps.core loads no worker module, and its api names resolve on use."""
    code = """
import sys
import byteps.core as core
import byteps.common.config, byteps.common.node, byteps.common.logs, byteps.common.metrics
from byteps.core import config, node, logs, metrics
from byteps.core.config import Config, ConfigError
from byteps.core.node import BytePSError, SchedulerLink, PEER_FAILED_EXIT
from byteps.common import errors
assert config is byteps.common.config and node is byteps.common.node
assert logs is byteps.common.logs and metrics is byteps.common.metrics
assert ConfigError is errors.ConfigError and BytePSError is errors.BytePSError
assert "byteps.core.api" not in sys.modules and "byteps.core.engine" not in sys.modules
assert core.BytePSError is BytePSError and callable(core.push_pull)
assert "byteps.core.api" in sys.modules
try:
    core.no_such_name
except AttributeError:
    pass
else:
    raise AssertionError("byteps.core.no_such_name resolved")
print("ok")
"""
    out = subprocess.run([sys.executable, "-c", code], env=job_env(), cwd=ROOT,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr
