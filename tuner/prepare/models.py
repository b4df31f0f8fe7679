"""The study's models: quantized drafts made or taken from the cache, the GGUF headers read, drafts that cannot
draft for the target refused."""

from __future__ import annotations

from pathlib import Path

from tuner.errors import UserError
from tuner.models.gguf_info import ModelInfo, check_draft_compatibility, read_model_info
from tuner.models.quantize import Variant, ensure_variant
from tuner.progress import Progress
from tuner.studyfile.spec import StudySpec


def make_variants(spec: StudySpec, bin_dir: Path, progress: Progress) -> dict[str, Variant]:
    """Every quantize variant the study asks for, made now or taken from the cache (tuner.models.quantize)."""
    variants = {}
    for request in spec.quantize:
        variant = ensure_variant(request, bin_dir, source_file_type=read_model_info(request.source).file_type)
        progress(f"draft {request.name}: {'made' if variant.made else 'cached'} {variant.path}")
        variants[request.name] = variant
    return variants


def check_models(
    spec: StudySpec, quantized: dict[str, Path] | None = None
) -> tuple[ModelInfo, dict[str, ModelInfo]]:
    """Read the GGUF headers of the target and every draft (``quantized``: the quantize variants' files by draft
    name, see ``make_variants``); a draft that cannot draft for the target is one line naming it."""
    target = read_model_info(spec.target)
    drafts: dict[str, ModelInfo] = {}
    named = [(f"drafts[{i}]", path.stem, path) for i, path in enumerate(spec.drafts)]
    named += [(f"drafts (quantize {name})", name, path) for name, path in (quantized or {}).items()]
    for where, name, path in named:
        info = read_model_info(path)
        compat = check_draft_compatibility(target, info)
        if not compat.ok:
            raise UserError(
                f"{spec.path}: {where}: {path.name} cannot draft for {spec.target.name} "
                f"({'; '.join(compat.reasons)}); remove it from drafts"
            )
        drafts[name] = info
    return target, drafts
