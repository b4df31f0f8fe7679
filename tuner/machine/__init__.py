"""The machine under test: CPU/NUMA topology, what changes between runs (host), the comparability fingerprint,
NUMA-true page placement, the host-wide measurement lock, the pinned llama.cpp build, the roofline ceiling, and
``tuner doctor``.
"""
