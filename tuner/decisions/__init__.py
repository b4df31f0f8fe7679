"""Decisions an operator bets on: launch-level evidence and its error rates (``evidence``), configurations
re-measured launch by launch (``remeasure``), sentinels and drift (``drift``), the sequential finalist race
(``race``), per-content-type winners (``per_type``), the trials a deployment is chosen among (``front``),
which trial is deployed with what verdict, per type and per load (``deployment``) and request routing
(``route``).
"""
