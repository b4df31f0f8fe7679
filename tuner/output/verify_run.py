"""`tuner verify STUDY`: the deployed preset section launched against the study's baseline, on this host and build.

The rule, the verdicts and the exit codes are ``tuner.decisions.verify_rule``'s. This module reads what is deployed
(the study's section of ``reports/models-preset.ini``, or ``--preset`` / ``--section``), the claim (the study's
stored race), the study's context on the build in use (``--bin-dir``, else ``$LLAMA_CPP_BIN``, else the study
file's ``llama_cpp.bin_dir``, else the pinned build), prints the figures and records one line in the study.
"""

from __future__ import annotations

import os
import platform
import shlex
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import optuna

from tuner.decisions import evidence
from tuner.decisions.race import RaceResult
from tuner.decisions.verify_rule import (
    EXIT,
    Claim,
    Verification,
    baseline_contender,
    build_change,
    build_text,
    claim_for,
    edits,
    measure,
    result_lines,
    section_contender,
    verdict,
    verification_workload,
    why_lines,
)
from tuner.errors import UserError
from tuner.machine import hostlock
from tuner.machine.fingerprint import COMPARABILITY_KEYS, compare_fingerprints
from tuner.machine.llama_build import ENV_BIN_DIR
from tuner.models.quantize import file_sha256
from tuner.output.export import section_name, section_options
from tuner.output.preset import PRESET_FILE, DeployedSection, read_section
from tuner.paths import reports_dir
from tuner.prepare import prepare_again
from tuner.progress import Progress
from tuner.storage import store
from tuner.storage.records import StudyRecord

DEFAULT_ROUNDS = 5


@dataclass(frozen=True)
class Deployed:
    """What is checked: the section, the export's trial it came from and that trial's claim."""

    section: DeployedSection
    trial: int
    claim: Claim
    edited: list[str]
    target_quant: str | None  # the exported trial's target file: a variant's type, or None/source


def verify_deployed(
    study_name: str,
    storage: str | None,
    preset_file: Path | None,
    section_wanted: str | None,
    rounds: int,
    bin_dir: Path | None,
) -> int:
    """Launch the deployed section against the baseline, print the figures, record the verdict; its exit code."""
    if rounds < evidence.MIN_ROUNDS:
        raise UserError(
            f"--rounds {rounds}: a 95% interval needs at least {evidence.MIN_ROUNDS} paired rounds"
        )
    study, record = store.open_stored_study(study_name, storage)
    preset = preset_file or reports_dir() / PRESET_FILE
    deployed = read_deployed(study, record, read_section(preset, section_wanted or section_name(record.name)))
    check_target_file(record, deployed)
    chosen = bin_dir or os.environ.get(ENV_BIN_DIR)
    ctx = prepare_again(
        record, "verify", "", ("search space", *COMPARABILITY_KEYS), Path(chosen) if chosen else None
    )
    server = ctx.launch.server_binary
    where = f"{preset}: [{deployed.section.name}]"
    section = section_contender(
        deployed.section.served, server, ctx.launch.numactl, deployed.section.numactl, where
    )
    baseline_record = store.baseline_record(study)
    assert baseline_record is not None, "a study with a stored race had a baseline to race against"
    baseline = baseline_contender(baseline_record, server, ctx.launch.server_flags)
    workload, prompts = verification_workload(ctx.workload)
    build = build_change(record.build, ctx.build)
    for line in header_lines(deployed, record, ctx.build, build, prompts, rounds):
        print(line)
    printed = Progress.untimed()
    with hostlock.measuring(record.name, progress=printed):  # one measurement per host
        mine, theirs, ratio = measure(ctx, section, baseline, workload, rounds, printed)
        host = [
            line for line in compare_fingerprints(record.fingerprint, ctx.fingerprint) if "llama_" not in line
        ]
        checked = verification(deployed, record.build, ctx.build, (mine, theirs, ratio), prompts, build, host)
        store.append_verification(study, checked.to_json())
    for line in result_lines(checked, evidence.geometric_mean(mine), evidence.geometric_mean(theirs)):
        print(line)
    print(
        f"verify: recorded in study {record.name!r} (`tuner report {record.name}` lists every verification)"
    )
    return EXIT[checked.verdict]


def verification(
    deployed: Deployed,
    study_build: dict,
    this_build: dict,
    measured: tuple[list[float], list[float], evidence.Ratio],
    prompts: str,
    build: str,
    host: list[str],
) -> Verification:
    """The record of one verification: where, on what, what it measured, against what claim, the verdict, why."""
    mine, theirs, ratio = measured
    result = verdict(ratio, deployed.claim)
    claim = deployed.claim
    return Verification(
        time=datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        host=platform.node(),
        preset=str(deployed.section.path),
        section=deployed.section.name,
        trial=deployed.trial,
        build=str(this_build.get("commit")),
        build_number=this_build.get("build_number"),
        study_build=str(study_build.get("commit")),
        rounds=ratio.rounds,
        prompts=prompts,
        section_rates=mine,
        baseline_rates=theirs,
        speedup=ratio.estimate,
        low=ratio.low,
        high=ratio.high,
        claim=claim.speedup,
        claim_low=claim.low,
        claim_high=claim.high,
        claim_source=claim.source,
        verdict=result,
        edited=deployed.edited,
        why=why_lines(result, build, deployed.edited, host),
    )


def read_deployed(study: optuna.Study, record: StudyRecord, section: DeployedSection) -> Deployed:
    """The section's trial (its export comment's; without one, the race's winner), its claim, and its edits."""
    data = store.read_race(study)
    race = RaceResult.from_json(data) if data else None
    if race is None:
        raise UserError(
            f"study {record.name!r} has no stored race, so its export claimed no raced speedup; export it with "
            f"the race (`tuner export {record.name}`), then verify"
        )
    if section.origin is None:
        trial = race.winner
        print(
            f"verify: [{section.name}] has no `; tuner export:` comment; taken as the race's winner, trial {trial}"
        )
    elif section.origin[0] != record.name:
        raise UserError(
            f"{section.path}: [{section.name}] was exported from study {section.origin[0]!r}, not {record.name!r}; "
            f"verify that study, or pass --section with a section of {record.name!r}"
        )
    else:
        trial = section.origin[1]
    claim = claim_for(race, trial)
    exported = store.read_trial(study.trials[trial])
    assert exported.command is not None, "an exported trial was launched, so it has its command"
    written = section_options(record.name, exported.command, exported.config.temperature)[1]
    return Deployed(section, trial, claim, edits(written, section.options), exported.config.target_quant)


def check_target_file(record: StudyRecord, deployed: Deployed) -> None:
    """A deployed target variant must still be the file the study measured: its sha256 is checked (hashed
    afresh) before anything is launched; a missing or changed file is one line with the command that makes it."""
    quant = deployed.target_quant
    made = record.target_variants.get(quant or "")
    if made is None:
        return
    path = Path(deployed.section.options.get("model", made["path"]))
    where = f"{deployed.section.path}: [{deployed.section.name}] model = {path}"
    again = f"make it again with `{shlex.join(made['command'])}`" if made.get("command") else "make it again"
    if not path.is_file():
        raise UserError(f"{where}: the study's {quant} variant is not here; {again}")
    digest = file_sha256(path)
    if digest != made["sha256"]:
        raise UserError(
            f"{where}: sha256 {digest[:16]}..., not the {quant} variant the study measured "
            f"({made['sha256'][:16]}...); {again}"
        )
    print(f"verify: target {quant} {path}: sha256 {made['sha256'][:16]}... as the study measured it")


def header_lines(
    deployed: Deployed, record: StudyRecord, this_build: dict, build: str, prompts: str, rounds: int
) -> list[str]:
    """What is about to be launched, on which build, and how."""
    section = deployed.section
    state = f"edited since: {'; '.join(deployed.edited)}" if deployed.edited else "as exported"
    return [
        f"verify: [{section.name}] of {section.path}, trial {deployed.trial} of study {record.name} ({state}), "
        f"against the study's baseline on {build_text(this_build)}",
        *([f"verify: another build: {build}"] if build else []),
        f"verify: {rounds} paired rounds, one fresh launch of each per round, on {prompts}",
    ]
