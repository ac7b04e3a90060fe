"""The collective layer (Horovod's operations on numpy arrays, every rule decided once):
the operations (:mod:`.ops`), their handles and held names (:mod:`.handles`), the rules
every collective obeys (:mod:`.rules`: root, op, naming), the one dtype table
(:mod:`.carry`), process sets and their operations (:mod:`.process_sets`,
:mod:`.set_ops`) and the object collectives (:mod:`.objects`).

Importing this package loads none of its modules.
"""
