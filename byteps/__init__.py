"""byteps: a framework-agnostic parameter-server for distributed training."""
__version__ = "0.1.0"
# The distribution's name ("byteps" on the package index is the original C++ BytePS).
DIST = "byteps-ps"


def missing_framework(module: str, extra: str, plugin: str, exc: ImportError) -> ImportError:
    """The ImportError of a plugin whose framework is missing: says how to install it."""
    return ImportError(
        f"{plugin} needs {module} ({exc}); install it with: pip install '{DIST}[{extra}]' "
        f"(in a checkout of the project: pip install -e '.[{extra}]')")


def __getattr__(name: str):
    """``byteps.run``: Horovod's ``horovod.run`` (byteps/launcher/pyrun.py), imported on use."""
    if name == "run":
        from byteps.launcher.pyrun import run
        return run
    raise AttributeError(f"module 'byteps' has no attribute {name!r}")
