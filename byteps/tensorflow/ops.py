"""``byteps.tensorflow.ops``: the original BytePS's module of these names, for scripts
that import them from there; each is byteps.tensorflow's own (docs/tensorflow.md)."""
from byteps.tensorflow import (  # noqa: F401
    broadcast,
    get_pushpull_speed,
    init,
    local_rank,
    local_size,
    push_pull,
    rank,
    resume,
    shutdown,
    size,
    suspend,
)

__all__ = ["broadcast", "get_pushpull_speed", "init", "local_rank", "local_size", "push_pull",
           "rank", "resume", "shutdown", "size", "suspend"]
