"""Preparing a study: what it needs before anything runs, checked once (``prepare`` -> ``StudyContext``).

One module per concern: the models and drafts (``models``: quantized drafts made or cached, GGUF headers,
drafts refused that cannot draft), the space (``space``: fitted to the target and this machine, warm starts
checked), the workload (``workload``: suites loaded, the chat template, prompts that fit their context), the
prepared study itself (``context``: ``StudyContext`` and what of it is stored), the estimate (``estimate``:
``study_estimate``, the time before it runs) and ``study`` (``prepare``, and ``prepare_again`` for a stored
study). Study runs, export's and verify's races, the grid recorder and the benchmarks all start here.
"""

from tuner.prepare.context import StudyContext
from tuner.prepare.estimate import study_estimate
from tuner.prepare.study import prepare, prepare_again

__all__ = ["StudyContext", "prepare", "prepare_again", "study_estimate"]
