"""Horovod's ``horovod.runner.common`` path (byteps/runner/__init__.py)."""
