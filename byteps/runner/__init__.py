"""``byteps.runner``: Horovod's module paths under ``horovod.runner`` that scripts and
Horovod's own test suites import, so that changing the import line is enough.

``byteps.runner.run`` is ``byteps.run`` (Horovod's ``horovod.runner.run``,
byteps/launcher/pyrun.py); ``byteps.runner.common.util.env.get_env_rank_and_size`` reads the
ranks bpslaunch gives every worker.  The launcher itself is ``bpslaunch``
(byteps/launcher).  Imports nothing of the worker (tests/test_layers.py)."""


def __getattr__(name: str):
    if name == "run":
        from byteps.launcher.pyrun import run
        return run
    raise AttributeError(f"module 'byteps.runner' has no attribute {name!r}")
