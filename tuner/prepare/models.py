"""The study's models: quantized drafts made or taken from the cache, the GGUF headers read, drafts that cannot
draft for the target refused."""

from __future__ import annotations

from pathlib import Path

from tuner.errors import UserError
from tuner.models.gguf_info import ModelInfo, check_draft_compatibility, read_model_info
from tuner.models.quantize import QuantizeRequest, Variant, default_cache, ensure_variant, source_digest
from tuner.prepare.context import TargetVariant
from tuner.progress import Progress
from tuner.studyfile.spec import StudySpec


def make_variants(spec: StudySpec, bin_dir: Path, progress: Progress) -> dict[str, Variant]:
    """Every quantize variant of a draft the study asks for, made now or taken from the cache
    (tuner.models.quantize), by draft name."""
    return {
        request.name: _variant(request, bin_dir, progress, f"draft {request.name}")
        for request in spec.quantize
    }


def make_target_variants(spec: StudySpec, bin_dir: Path, progress: Progress) -> dict[str, TargetVariant]:
    """The target's variants (``target.quantize``) by type, the values of the knob target_quant: made or taken
    from the cache, each with its header and its file's digest."""
    variants = {}
    for request in spec.target_quantize:
        variant = _variant(request, bin_dir, progress, f"target {request.type}")
        digest = source_digest(variant.path, default_cache())
        variants[request.type] = TargetVariant(variant, read_model_info(variant.path), digest)
    return variants


def _variant(request: QuantizeRequest, bin_dir: Path, progress: Progress, what: str) -> Variant:
    variant = ensure_variant(request, bin_dir, source_file_type=read_model_info(request.source).file_type)
    size = variant.path.stat().st_size / 1e9
    progress(f"{what}: {'made' if variant.made else 'cached'} {variant.path} ({size:.2f} GB)")
    return variant


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
