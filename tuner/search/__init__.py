"""The search: domains resolved for one study and ``suggest`` (``space``), sampler choice (``sampling``), the
structured sampler and its speculation model (``sampler``, ``model``), pruning (``pruning``), warm starts
(``prior``). The knobs and ``TrialConfig`` it speaks live on the ground floor (``tuner.knobs``).
"""
