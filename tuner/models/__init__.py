"""Models: GGUF metadata and draft compatibility (``gguf_info``, ``tuner inspect``), the fast header read and its cache,
quantized draft variants (``quantize``), and real models assembled from optional packages (``real_models``).
"""
