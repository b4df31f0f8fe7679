"""The built-in synthetic model family: small GGUFs whose speculative landscape is real.

Random weights give 0% draft acceptance, so the models are built from token n-gram
statistics of a pinned code corpus: a target that predicts from the last two tokens,
drafts that approximate it less well, an MoE variant whose expert count matters, and
broken members for the error paths. See ``family.py`` for the members and
``family.ensure_family`` for the entry point.
"""
