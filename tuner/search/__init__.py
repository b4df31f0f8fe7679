"""The search: domains resolved for one study and ``suggest`` (``space``), sampler choice (``sampling``), the
structured sampler (``structured_sampler``: Optuna's interface; ``planner``: the stage order; ``stages``: one module per
stage; ``history``: the trials it plans from) and its speculation model (``speedup_model``), pruning (``pruning``), warm
starts (``prior``). The knobs and ``TrialConfig`` it speaks live on the ground floor (``tuner.knobs``).
"""
