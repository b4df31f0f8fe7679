"""Decisions an operator bets on: launch-level evidence and its error rates (``evidence``), configurations
re-measured launch by launch (``remeasure``), sentinels and drift (``drift``), the sequential finalist race
(``race``), per-content-type winners (``per_type``) and request routing (``route``).
"""
