"""Framework-free core: config, keys, partitioning, the worker engine."""
from byteps.core.api import *  # noqa: F401,F403
from byteps.core.api import __all__  # noqa: F401
