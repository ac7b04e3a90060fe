"""Horovod's object functions for TensorFlow: plain Python values (msgpack, never pickle)
through :mod:`byteps.core.collective.objects`.  They run in Python at once (eagerly and in TF1
graphs alike), so ``session=`` is accepted and not needed."""
from __future__ import annotations

from byteps.core.collective import objects
from byteps.core.api.basics import process_set_kw

__all__ = ["allgather_object", "broadcast_object", "broadcast_object_fn"]


def broadcast_object(obj, root_rank: int = 0, session=None, name=None, process_set=None):
    """Rank ``root_rank``'s ``obj`` on every rank (plain values, lists, tuples, dicts,
    numpy arrays, argparse.Namespace, dataclasses; msgpack, never pickle)."""
    return objects.broadcast_object(obj, root_rank, name,
                                    **process_set_kw(process_set, "broadcast_object"))


def broadcast_object_fn(root_rank: int = 0, session=None, name=None, process_set=None):
    """A function ``obj -> rank root_rank's obj`` (Horovod's TF1 helper)."""
    def fn(obj):
        return broadcast_object(obj, root_rank, session, name, process_set)
    return fn


def allgather_object(obj, session=None, name=None, process_set=None) -> list:
    """Every rank's ``obj``, as a list in rank order."""
    return objects.allgather_object(obj, name,
                                    **process_set_kw(process_set, "allgather_object"))
