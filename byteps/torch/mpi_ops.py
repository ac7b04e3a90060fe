"""``byteps.torch.mpi_ops``: Horovod's module path ``horovod.torch.mpi_ops``, for scripts
and test suites that import its names from there (``from horovod.torch.mpi_ops import
synchronize``) or reach ``hvd.mpi_ops._basics``.  Every name is byteps.torch's own
(docs/torch.md); ``_basics`` is the core's :mod:`byteps.core.api.basics`."""
from byteps.core.api import basics as _basics  # noqa: F401
from byteps.torch import *  # noqa: F401,F403
from byteps.torch import __all__  # noqa: F401
