"""What a prepared study is (``StudyContext``: everything fixed for one study run on this host) and what of it is
stored (``study_record``: the workload and the scorer as the study record keeps them)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tuner.knobs.config import TrialConfig
from tuner.machine.fingerprint import Fingerprint
from tuner.measurement.launch import LaunchContext
from tuner.measurement.measure import MeasurementSettings
from tuner.measurement.workload import Workload
from tuner.models.gguf_info import ModelInfo
from tuner.models.quantize import Variant
from tuner.search.space import ResolvedSpace
from tuner.storage.records import StudyRecord, measurement_record
from tuner.studyfile.spec import StudySpec


@dataclass(frozen=True)
class TargetVariant:
    """One llama-quantize variant of the target: how it was made, its header and its file's digest (the export
    writes it, ``tuner verify`` checks it)."""

    variant: Variant
    info: ModelInfo
    sha256: str

    def record(self) -> dict:
        """As the study record keeps it: provenance, file, digest, size and type."""
        return {
            **self.variant.provenance,
            "path": str(self.variant.path),
            "sha256": self.sha256,
            "bytes": self.info.file_size_bytes,
        }


@dataclass(frozen=True)
class StudyContext:
    """Everything fixed for the lifetime of one study run on this host."""

    spec: StudySpec
    target: ModelInfo
    drafts: dict[str, ModelInfo]
    space: ResolvedSpace
    launch: LaunchContext
    workload: Workload
    fingerprint: Fingerprint
    build: dict
    log_dir: Path
    quantized: dict[str, Variant] | None = None  # draft name -> variant made by llama-quantize
    target_variants: dict[str, TargetVariant] = field(default_factory=dict)  # by type: the knob target_quant

    def target_for(self, config: TrialConfig) -> ModelInfo:
        """The header of the target file ``config`` runs (a variant's, or the study's target)."""
        variant = self.target_variants.get(config.target_quant or "")
        return variant.info if variant else self.target

    @property
    def settings(self) -> MeasurementSettings:
        return self.spec.measurement

    def study_record(self, created_by: str) -> StudyRecord:
        """What this run would store for a new study, and compare against a stored one."""
        spec = self.spec
        return StudyRecord(
            name=spec.name,
            created_by=created_by,
            fingerprint=self.fingerprint,
            build=self.build,
            target=self.target.to_dict(),
            drafts={name: info.to_dict() for name, info in self.drafts.items()},
            space=self.space.as_dict(),
            space_digest=self.space.digest(),
            space_notes=tuple(self.space.notes),
            objectives=tuple(o.metric for o in spec.objectives),
            quality=quality_record(spec),
            spec_path=str(spec.path.resolve()),
            workload=workload_record(spec, self.workload),
            measurement=measurement_record(
                self.settings.comparability(),
                [
                    str(v)
                    for knob in ("spec_type", "lookup")
                    for v in getattr(self.space.domains.get(knob), "values", ())
                ],
            ),
            quantized_drafts={name: v.provenance for name, v in (self.quantized or {}).items()},
            target_variants={name: v.record() for name, v in self.target_variants.items()},
        )


def workload_record(spec: StudySpec, workload: Workload) -> dict:
    """The workload as stored: prompts and digest and, only for a study of several users or load bounds,
    the concurrency levels and the bounds (so a study of one user stores what it always stored)."""
    record: dict[str, Any] = {"prompts": [p.id for p in workload.prompts], "digest": workload.digest()}
    if spec.load_levels:
        record["concurrency"] = list(spec.load_levels)
    if spec.constraints:
        record["constraints"] = {c.name: c.limit for c in spec.constraints}
    return record


def quality_record(spec: StudySpec) -> dict:
    """The scorer as stored: name, floor and, for kld/perplexity, the ceiling and the text's digest."""
    quality = spec.quality
    record = {"scorer": quality.scorer, "floor": quality.floor}
    if quality.max_kld is not None:
        record["max_kld"] = quality.max_kld
    if quality.text_file is not None:
        record["text_digest"] = hashlib.sha256(quality.text_file.read_bytes()).hexdigest()[:16]
    return record
