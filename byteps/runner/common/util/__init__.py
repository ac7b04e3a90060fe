"""Horovod's ``horovod.runner.common.util`` path (byteps/runner/__init__.py)."""
