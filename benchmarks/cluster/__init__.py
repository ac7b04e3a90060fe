"""Emulated cluster (network namespaces + tc tbf) benchmark; see docs/cluster.md."""
