"""Running a study on this host, control flowing one way: the study's loop (``study_loop``: the study
opened or joined, its record written once, the baseline first: ``study_start``; trials until the budget
counts across workers) -> the Optuna objective (``objective``: suggest, measure, store; this process's
trials and their progress lines) -> one trial's measurement in named steps (``trial_measurement``).
"""
