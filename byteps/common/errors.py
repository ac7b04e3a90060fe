"""The errors every role raises; no dependencies, so any module can import them."""
from __future__ import annotations


class BytePSError(RuntimeError):
    """A BytePS operation failed; the message names the tensor, ranks and the fix."""


class ConfigError(ValueError):
    """A BytePS environment variable is missing or malformed."""
