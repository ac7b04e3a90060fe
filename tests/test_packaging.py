"""Issue 16, items 9-13: licence and metadata, distribution name, extras, set-up, sdist."""
from __future__ import annotations

import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from conftest import ROOT

pytestmark = pytest.mark.timeout(300)
tomllib = pytest.importorskip("tomllib")     # Python 3.11+


def project() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def test_licence_and_metadata():
    text = (ROOT / "LICENSE").read_text()
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    assert "END OF TERMS AND CONDITIONS" in text
    p = project()
    assert p["license"] == "Apache-2.0" and p["license-files"] == ["LICENSE"]
    assert p["authors"] and p["urls"] and p["keywords"]
    assert any(c.startswith("Topic :: System :: Distributed Computing") for c in p["classifiers"])


def test_distribution_name_is_not_the_original_byteps():
    from byteps import DIST
    from byteps.launcher import DIST as LAUNCHER_DIST
    name = project()["name"]
    assert name == DIST == LAUNCHER_DIST
    assert name.replace("_", "-").lower() != "byteps"     # the original's C++ package
    assert f"`{name}`" in (ROOT / "README.md").read_text()


def test_extras_have_lower_bounds_and_pins_live_in_constraints():
    p = project()
    extras = p["optional-dependencies"]
    for req in [r for reqs in extras.values() for r in reqs] + p["dependencies"]:
        assert "==" not in req and "<2.5" not in req and "<28" not in req, req
    assert extras["torch"] == ["torch>=2.1"] and extras["tensorflow"] == ["tensorflow>=2.16"]
    assert "mxnet>=1.9" in extras["mxnet"]
    assert any(r.startswith("scikit-learn") for r in extras["examples"])
    pins = (ROOT / "constraints.txt").read_text().split()
    for pin in ("torch==2.13.0", "tensorflow-cpu==2.21.0", "tf-keras==2.21.0"):
        assert pin in pins


def _make_n(*args) -> str:
    if shutil.which("make") is None:
        pytest.skip("no make")
    res = subprocess.run(["make", "-n", *args], cwd=ROOT, capture_output=True, text=True,
                         timeout=60)
    assert res.returncode == 0, res.stderr
    return res.stdout


def test_make_demo_installs_only_what_the_torch_demo_needs(tmp_path):
    out = _make_n(f"VENV={tmp_path / 'v'}", "demo")
    lines = out.splitlines()
    pip = [i for i, ln in enumerate(lines) if "pip install" in ln]
    assert [lines[i] for i in pip] == [
        f"{tmp_path / 'v'}/bin/python -m pip install -q --no-compile -c constraints.txt "
        f"-e '.[torch,examples]'"], out
    # pip's one-core byte-compilation is replaced by compileall on every core, right after
    compile_cmd = f"{tmp_path / 'v'}/bin/python -m compileall -q -j 0 "
    assert lines[pip[0] + 1].startswith(compile_cmd), out
    assert "tensorflow" not in out
    out = _make_n(f"VENV={tmp_path / 'v'}", "venv")
    extras = "-e '.[torch,tensorflow,tf-keras,examples,test]'"
    assert extras in out and "-m compileall -q -j 0" in out.split(extras)[1], out


def test_the_test_venv_and_the_project_are_byte_compiled(tmp_path):
    """Where PYTHONDONTWRITEBYTECODE is set Python never writes .pyc files, so every process
    of every test job would compile the frameworks and byteps again: the Makefile compiles
    them (`make test`: the venv once, the project's own modules before every run)."""
    import importlib.util
    torch = pytest.importorskip("torch")
    assert Path(importlib.util.cache_from_source(torch.__file__)).exists(), torch.__file__
    compile_line = ("-m compileall -q -j 0 byteps tests benchmarks examples >/dev/null 2>&1 "
                    "|| true")
    lines = _make_n(f"VENV={tmp_path / 'v'}", "test-core").splitlines()
    at = next(i for i, ln in enumerate(lines) if "-m pytest" in ln)
    assert lines[at - 1].endswith(compile_line), lines
    # `make test` (CI's command): its recipe's first line, read from the Makefile (a dry
    # run would start its recursive make, which runs the MXNet tests)
    text = (ROOT / "Makefile").read_text()
    recipe = text.split("\ntest: venv\n", 1)[1].splitlines()
    assert recipe[0] == "\t@$(call COMPILE,$(PY),byteps tests benchmarks examples)", recipe
    assert "COMPILE = $(1) " + compile_line.replace("byteps tests benchmarks examples",
                                                    "$(2)") in text


def test_mxnet_tests_are_skipped_with_a_message_on_python_312(tmp_path):
    fake = tmp_path / "python3.12"       # answers like a Python 3.12 would
    fake.write_text('#!/bin/sh\ncase "$2" in *print*) echo 3.12;; *) exit 0;; esac\n')
    fake.chmod(0o755)
    res = subprocess.run(["make", "--no-print-directory", "test-mxnet", f"MXPYTHON={fake}"],
                         cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith("SKIPPED the MXNet tests: MXNet 1.9.1 needs numpy<1.24, "
                                 "which has no wheel for Python 3.12"), res.stdout


def test_gitignore_has_build_outputs():
    lines = (ROOT / ".gitignore").read_text().split()
    assert "build/" in lines and "dist/" in lines


def test_sdist_ships_the_tests_complete(tmp_path):
    setuptools = pytest.importorskip("setuptools")
    if int(setuptools.__version__.split(".")[0]) < 77:
        pytest.skip("setuptools < 77 cannot build an SPDX licence expression")
    src = tmp_path / "src"
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(
        ".git", ".venv*", "build", "dist", "*.egg-info", "__pycache__", ".*_cache", "traces"))
    res = subprocess.run([sys.executable, "-c", "from setuptools import build_meta as b; "
                          "print(b.build_sdist('dist'))"], cwd=src, capture_output=True,
                         text=True, timeout=240)
    assert res.returncode == 0, res.stderr[-3000:]
    sdist = src / "dist" / res.stdout.split()[-1]
    with tarfile.open(sdist) as tar:
        names = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
    shipped_tests = {n for n in names if n.startswith("tests/")}
    assert {"tests/conftest.py", "tests/scripts/launcher_job.py", "LICENSE",
            "constraints.txt", "Makefile", "benchmarks/cluster/jobs.py"} <= names
    for path in (ROOT / "tests").rglob("*"):
        rel = path.relative_to(ROOT).as_posix()
        if path.is_file() and "__pycache__" not in rel:
            assert rel in shipped_tests, f"{rel} is not in the sdist"
    assert not any("__pycache__" in n or n.endswith(".pyc") for n in names)


def test_plugins_say_how_to_install_their_framework():
    for module, framework, extra in (("byteps.torch", "torch", "torch"),
                                     ("byteps.tensorflow", "tensorflow", "tensorflow"),
                                     ("byteps.keras", "tensorflow", "tensorflow")):
        code = (f"import sys; sys.modules[{framework!r}] = None\n"
                f"try:\n    import {module}\nexcept ImportError as e:\n    print(e)")
        res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             timeout=120, cwd=ROOT)
        assert f"pip install 'byteps-ps[{extra}]'" in res.stdout, (module, res.stdout,
                                                                  res.stderr[-2000:])
