"""The search: knob registry (``knobs``), domains and ``TrialConfig`` (``space``), sampler choice (``sampling``), the
structured sampler and its speculation model (``sampler``, ``model``), pruning (``pruning``), warm starts (``prior``).
"""
