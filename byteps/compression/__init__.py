"""Gradient compression for byteps: pure numpy, no framework, no network.

``parse(compression_params)`` validates the user's settings (the original BytePS keys) into
a :class:`Spec`; ``worker_pipeline`` / ``server_pipeline`` build the per-partition state
that turns float32 gradients into fixed-size frames (``Pipeline.frame_bytes``) and back.
Each compressor module documents its frame layout.
"""
from .base import CompressionError, compress_flagged, decompress_flagged, nonfinite_frame
from .pipeline import Pipeline, carry_state, server_pipeline, worker_pipeline
from .spec import COMPRESSORS, KEYS, Spec, parse

__all__ = ["COMPRESSORS", "KEYS", "CompressionError", "Pipeline", "Spec", "carry_state", "parse",
           "server_pipeline", "worker_pipeline", "compress_flagged", "decompress_flagged",
           "nonfinite_frame"]
