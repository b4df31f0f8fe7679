"""``tuner export`` from end to end: the study's records read, its deployment decided as one value
(``tuner.decisions.export_choice.decide``: the pooled race, per content type, per load class), then that value
written (``tuner.output.export``) and the preset's notes printed."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import optuna

from tuner.decisions.export_choice import Deployed, Deployment, ExportRequest, Recorded, decide
from tuner.decisions.per_type import PerTypeResultJson
from tuner.decisions.route import section_name
from tuner.measurement.measure import MeasurementSettings
from tuner.output.analysis import (
    break_even,
    by_concurrency,
    launch_spread,
    levels_of,
    suites_of,
    trials_frame,
)
from tuner.output.export import Export, build_export, per_suite_rows, write_export
from tuner.output.preset import PRESET_FILE, history_path, preset_sections
from tuner.paths import inside, reports_dir, writable_file, writable_folder
from tuner.prepare import prepare_again, study_estimate
from tuner.progress import Progress
from tuner.storage import store
from tuner.storage.records import StudyRecord


def export_study(
    study_name: str, storage: str | None, request: ExportRequest, out: Path | None, preset_file: Path | None
) -> None:
    """Decide the study's deployment (``decisions.export_choice.decide``: pooled, per content type and per load
    class, raced) and write it."""
    if out is not None:  # checked before minutes of racing
        writable_folder(out, "--out")
    if preset_file is not None:
        writable_file(preset_file, "--preset")
    study, record = store.open_stored_study(study_name, storage)
    progress = Progress(print)  # race rounds with elapsed and remaining time, also in the dashboard
    progress.sink = lambda figures: store.write_progress(study, {"command": "tuner export", **figures})
    recorded = recorded_study(study, record)
    ctx = None if request.no_race else prepare_again(record)  # once: every race re-measures with it
    if ctx is not None:
        progress.time.unit_s = study_estimate(
            ctx
        ).launch_s  # a launch as the study estimates it, until one is timed
    deployment = decide(recorded, request, ctx, progress)
    out_dir = out or inside(reports_dir(), study.study_name, "study") / "export"
    preset = preset_file or reports_dir() / PRESET_FILE
    pooled = write_deployment(deployment, recorded, out_dir, preset)
    progress.time.plan(0.0)
    progress.record(f"exported trial {pooled.trial}")


def recorded_study(study: optuna.Study, record: StudyRecord) -> Recorded:
    """The study's records as a deployment reads them."""
    records = store.read_trials(study)
    frame = trials_frame(records, noise_cv=record.measurement.get("noise_cv", MeasurementSettings.noise_cv))
    levels = levels_of(frame)
    return Recorded(study, record, records, frame, suites_of(frame), levels, per_suite_rows(frame))


def exports_of(
    deployment: Deployment, recorded: Recorded
) -> tuple[Export, list[Export] | None, list[Export]]:
    """The deployment as exports: the pooled one, the paying types' (None without a router) and the load
    classes'."""
    type_json = deployment.type_race.to_json() if deployment.type_race else None

    def export(deployed: Deployed, per_type: PerTypeResultJson | None) -> Export:
        built = build_export(recorded.record, deployed.trial, recorded.frame, deployed.policy)
        command = built.command
        if deployed.slots is not None:
            assert deployed.trial.command is not None, "a trial measured at a load has its command"
            command = deployed.trial.command.with_slots(deployed.slots)
        return replace(
            built, command=command, race=deployed.race, section_name=deployed.section, per_type=per_type
        )

    pooled = export(deployment.pooled, type_json)
    per_type = [export(d, type_json) for d in deployment.per_type]
    by_load = [export(d, None) for d in deployment.by_load]
    return pooled, per_type if deployment.router else None, by_load


def write_deployment(deployment: Deployment, recorded: Recorded, out_dir: Path, preset: Path) -> Export:
    """The deployment's files written (``write_export``), each named, and the preset's notes printed; the pooled
    export."""
    export, per_type, by_load = exports_of(deployment, recorded)
    verdict = (
        break_even(by_concurrency(recorded.frame), launch_spread(recorded.records), deployment.load_races)
        if by_load
        else ""
    )
    for path in write_export(export, out_dir, preset, per_type, by_load, verdict):
        print(f"wrote {path}")
    _note_kept_sections(export, preset)
    if history_path(preset).exists():
        print(
            f"earlier versions of its sections: `tuner preset history {preset}`; "
            f"`tuner preset rollback {preset} SECTION` puts one back"
        )
    return export


def _note_kept_sections(export: Export, preset: Path) -> None:
    """A type's section from an earlier export that this one found no gain for stays: say so."""
    if not export.per_type:
        return
    kept = [section_name(f"{export.section}-{t['suite']}") for t in export.per_type["types"] if not t["pays"]]
    for name in set(kept) & set(preset_sections(preset)):
        print(
            f"note: section [{name}] of an earlier export is kept in {preset}, but this export found no "
            f"gain for it on held-out prompts; remove it by hand to serve that type with [{export.section}]"
        )
