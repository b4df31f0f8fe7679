"""The machine under test: CPU/NUMA topology, what changes between runs (host), memory bandwidth by threads,
the comparability fingerprint, NUMA-true page placement, the host-wide measurement lock, the pinned llama.cpp
build and the roofline ceiling. It imports nothing above it (``tuner doctor``, which reads studies, is in
``tuner.output``).
"""
