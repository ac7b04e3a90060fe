"""Moved to :mod:`byteps.common.logs` (every role's floor); this name stays for existing
imports and is the same module object, so attributes set on one are seen through the other."""
import sys

from byteps.common import logs as _moved

sys.modules[__name__] = _moved
