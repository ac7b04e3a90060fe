"""One gradient's path through the worker: a tensor's declaration and the checks at each
use of its name (:mod:`.tensors`), a name used again with another shape or dtype
(:mod:`.redeclare`), how a tensor is cut into partitions (:mod:`.partitions`), and
``push_pull`` with the operations built directly on it (:mod:`.pushpull`), which hands the
partitions to the engine (:mod:`byteps.core.engine`).

Importing this package loads none of its modules.
"""
