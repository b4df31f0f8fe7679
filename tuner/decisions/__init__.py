"""Decisions an operator bets on: configurations re-measured launch by launch (``remeasure``), sentinels and drift
(``drift``), the finalist race (``race``), per-content-type winners (``per_type``) and request routing (``route``).
"""
