"""byteps: a framework-agnostic parameter-server for distributed training."""
__version__ = "0.1.0"
