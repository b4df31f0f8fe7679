"""The storage schema: how records sit in Optuna's storage, written once, read back as records.

Optuna's storage is the one database. A study keeps its ``StudyRecord`` in one study
user attr, and each trial its ``TrialRecord`` in one trial user attr, written in one
commit when the trial ends. Besides them, Optuna-level coordination keeps small attrs:
a trial's ``role`` (set when it is enqueued), ``requeued_by`` (set by the heartbeat
retry) and ``running_on`` (worker and server port, set once its server is up: who to
ask about a running trial), and the study's ``created_by`` (the worker that runs the baseline),
plus the baseline's ``reference`` outputs, the perplexity cache, the last finalist ``race``, the last
race of each load class (``race_cN``), the last ``per_type`` race, every ``tuner verify`` of a deployed
section (``verifications``), the ``search_prior`` (a warm start from earlier studies) and the running
command's ``progress`` (elapsed and remaining time, for the dashboard). Nothing else reads or writes user attrs.

Schema versions: 1 stored loose attrs per field (before records); a study of schema 1
is refused with a one-line message naming its version. A trial that ended without
writing a record (its process was killed, or a heartbeat failed it) reads back as a
failed record with reason ``orphaned``; one failed on resume under the SQLite lock
(``coordination.fail_orphans``) stores that reason itself.

A measured trial reaches storage through the local journal (``tuner.storage.journal``): its
record is appended there (fsynced) first, then written here; a storage outage
(``tuner.storage.outage``) leaves it in the journal, and the next run adds it to the study as a
new finished trial carrying the same record, with system attrs ``replay_of`` (the
original number) and ``retry_history`` (so the budget counts it once). Storage URLs are
shown only through ``tuner.storage.urls.safe_url`` (password as ``***``).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, cast

import optuna
from optuna.trial import FrozenTrial, TrialState

from tuner.errors import UserError
from tuner.machine.fingerprint import Fingerprint
from tuner.measurement.quality import ScorerFigures
from tuner.paths import check_study_name
from tuner.progress import StoredProgress
from tuner.storage.outage import cannot_open, classify
from tuner.storage.records import (
    SCHEMA_VERSION,
    Failure,
    Reference,
    StudyRecord,
    TrialRecord,
    WarmStartPrior,
    config_from_dict,
)
from tuner.storage.urls import check_scheme, safe_url, with_driver
from tuner.studyfile.spec import default_storage_url
from tuner.studyfile.validate import load_yaml_mapping

STUDY_RECORD = "study_record"
TRIAL_RECORD = "record"
ROLE = "role"
REQUEUED_BY = "requeued_by"
RUNNING_ON = "running_on"
CREATED_BY = "created_by"
REFERENCE = "reference"
PERPLEXITY = "perplexity"
KLD = "kld"  # model flags -> {"mean_kld", "same_top"} (the kld scorer)
RACE = "race"  # the last finalist race (tuner.decisions.race.RaceResult as JSON)
LOAD_RACE = "race_c"  # + N: the last race of the load class of N users (a RaceResult with users=N, as JSON)
PER_TYPE = "per_type"  # the last per-type race (tuner.decisions.per_type.PerTypeResult as JSON)
VERIFICATIONS = (
    "verifications"  # every `tuner verify`, oldest first (tuner.decisions.verify_rule.Verification as JSON)
)
# the running command's last progress line, elapsed and estimated remaining time (optuna-dashboard shows it)
PROGRESS = "progress"
SEARCH_STAGE, SEARCH_REASON = "search_stage", "search_reason"  # why the sampler chose a trial
SEARCH_PRIOR = (
    "search_prior"  # what earlier studies in this storage found (tuner.search.prior), set at creation
)
ORPHANED = "orphaned"  # the process running the trial died before recording it


# ------------------------------------------------------------------ studies


def write_study_record(study: optuna.Study, record: StudyRecord) -> None:
    study.set_user_attr(STUDY_RECORD, record.to_json())


def has_study_record(study: optuna.Study) -> bool:
    return STUDY_RECORD in study.user_attrs


def read_study_record(study: optuna.Study) -> StudyRecord:
    """The study's record; a study stored by an older tuner is a one-line error."""
    attrs = study.user_attrs
    data = attrs.get(STUDY_RECORD)
    if data is None:
        version = 1 if "fingerprint" in attrs else None
        if version is None:
            raise UserError(
                f"study {study.study_name!r} has no study record yet: it is being created, or its "
                "creator died first; run it (`tuner run`) to record it"
            )
        raise UserError(
            f"study {study.study_name!r} was stored with storage schema {version}, this tuner reads "
            f"schema {SCHEMA_VERSION}; run the study again under a new name (its file's `name:`)"
        )
    if data.get("schema") != SCHEMA_VERSION:
        raise UserError(
            f"study {study.study_name!r} was stored with storage schema {data.get('schema')}, this "
            f"tuner reads schema {SCHEMA_VERSION}; use the tuner version that wrote it, or run the "
            "study again under a new name"
        )
    return StudyRecord.from_json(data)


def created_by(study: optuna.Study) -> str | None:
    return study.user_attrs.get(CREATED_BY)


def set_created_by(study: optuna.Study, worker: str) -> None:
    study.set_user_attr(CREATED_BY, worker)


def write_reference(study: optuna.Study, reference: Reference) -> None:
    study.set_user_attr(
        REFERENCE,
        {
            "trial": reference.trial,
            "tokens": reference.tokens,
            "texts": reference.texts,
            "tokens_per_second": reference.tokens_per_second,
        },
    )


def read_reference(study: optuna.Study) -> Reference | None:
    data = study.user_attrs.get(REFERENCE)
    return Reference(**data) if data else None


def _scorer_cache(study: optuna.Study, key: str) -> dict:
    """A text scorer's cache (figures per model flags), read mid-trial: an outage reads it empty (the
    scorer runs again) instead of losing the trial's measurement before the journal keeps it."""
    try:
        return dict(study.user_attrs.get(key, {}))
    except Exception as err:  # noqa: BLE001 - only storage outages, re-raised otherwise
        if classify(err) is None:
            raise
        return {}


def _write_scorer_cache(study: optuna.Study, key: str, cache: dict) -> None:
    """Best effort: the figure is in the trial's record too, and the journal keeps that record when the
    storage is down (the trial's own writes then stop the run in one line, see tuner.storage.outage)."""
    try:
        study.set_user_attr(key, cache)
    except Exception as err:  # noqa: BLE001 - only storage outages, re-raised otherwise
        if classify(err) is None:
            raise


def perplexity_cache(study: optuna.Study) -> dict[str, float]:
    return _scorer_cache(study, PERPLEXITY)


def write_perplexity_cache(study: optuna.Study, cache: dict[str, float]) -> None:
    _write_scorer_cache(study, PERPLEXITY, cache)


def kld_cache(study: optuna.Study) -> dict[str, ScorerFigures]:
    return _scorer_cache(study, KLD)


def write_kld_cache(study: optuna.Study, cache: dict[str, ScorerFigures]) -> None:
    _write_scorer_cache(study, KLD, cache)


# ------------------------------------------------------------------ trials


def write_trial_record(trial: optuna.Trial, record: TrialRecord) -> None:
    """The trial's one write of everything it measured (or why it could not)."""
    trial.set_user_attr(TRIAL_RECORD, record.to_json())


def enqueue(study: optuna.Study, params: dict, role: str, skip_if_exists: bool = False) -> None:
    study.enqueue_trial(params, user_attrs={ROLE: role}, skip_if_exists=skip_if_exists)


def requeue_attrs(trial: FrozenTrial, worker: str) -> dict:
    """The attrs a dead worker's trial is queued again with: its role, and who queued it."""
    return {ROLE: role_of(trial), REQUEUED_BY: worker}


def requeued_by(trial: FrozenTrial) -> str | None:
    return trial.user_attrs.get(REQUEUED_BY)


def note_search(study: optuna.Study, trial: FrozenTrial, stage: str, reason: str) -> None:
    """The sampler's stage and reason for a trial it is about to run (also in the running trial's copy)."""
    for key, value in ((SEARCH_STAGE, stage), (SEARCH_REASON, reason)):
        study._storage.set_trial_user_attr(trial._trial_id, key, value)
        trial.user_attrs[key] = value


def search_note(trial: FrozenTrial | optuna.Trial) -> tuple[str | None, str | None]:
    return trial.user_attrs.get(SEARCH_STAGE), trial.user_attrs.get(SEARCH_REASON)


def host_fingerprint(study: optuna.Study) -> Fingerprint:
    """The study record's machine fingerprint (empty before the record exists): the search reads its bandwidth
    probe (``tuner.machine.bandwidth``)."""
    data = study.user_attrs.get(STUDY_RECORD)
    return cast(Fingerprint, dict(data.get("fingerprint") or {})) if data else {}


def study_models(study: optuna.Study) -> tuple[dict, dict[str, dict]]:
    """The study record's target and drafts (``ModelInfo`` dicts, the drafts by name; empty before the record
    exists): the search reads their weight bytes (``tuner.search.speedup_model.draft_byte_shares``)."""
    data = study.user_attrs.get(STUDY_RECORD) or {}
    return dict(data.get("target") or {}), dict(data.get("drafts") or {})


def search_context(study: optuna.Study) -> tuple[dict, list[str]] | None:
    """(the space as a dict, objectives) for a sampler, from the study record; None before it exists."""
    data = study.user_attrs.get(STUDY_RECORD)
    return (data["space"], list(data["objectives"])) if data else None


def write_prior(study: optuna.Study, prior: WarmStartPrior) -> None:
    study.set_user_attr(SEARCH_PRIOR, prior)


def read_prior(study: optuna.Study) -> WarmStartPrior | None:
    return study.user_attrs.get(SEARCH_PRIOR)


def stored_winners(storage, exclude: str) -> list[tuple[str, StudyRecord, TrialRecord, dict]]:
    """Every other study in ``storage`` with a record and a winner: (name, its record, the winning
    trial's record, its params), oldest first. The winner is the raced one, else the best feasible trial."""
    out = []
    for name in optuna.get_all_study_names(storage):
        if name == exclude:
            continue
        study = optuna.load_study(
            study_name=name, storage=storage, sampler=optuna.samplers.RandomSampler(seed=0)
        )
        data = study.user_attrs.get(STUDY_RECORD)
        if not data or data.get("schema") != SCHEMA_VERSION:
            continue
        trials = study.get_trials(deepcopy=False)
        race = read_race(study)
        winner = next((t for t in trials if race and t.number == race.get("winner")), None)
        record = (
            read_trial(winner)
            if winner
            else best_of([read_trial(t) for t in trials if t.state.is_finished()])
        )
        if record is not None and record.feasible:
            params = dict(trials[record.number].params)
            out.append((name, StudyRecord.from_json(data), record, params))
    return out


def report_running_rate(trial: optuna.Trial, step: int, tokens_per_second: float) -> None:
    """A running trial's tokens/s after ``step`` passes, as an Optuna intermediate value (the dashboard
    plots it); for a study whose one objective is tokens/s (see ``tuner.run.objective.StudyObjective``). Best
    effort: a storage hiccup costs the point, never the measurement (the record holds every sample)."""
    try:
        trial.report(tokens_per_second, step)
    except Exception:  # noqa: BLE001 - any storage error; the journal path handles real outages
        pass


def write_finished_record(study: optuna.Study, trial: FrozenTrial, record: TrialRecord) -> None:
    """The record of a trial this process does not run (an orphan being failed): written
    while it is still RUNNING, before it is told finished."""
    study._storage.set_trial_user_attr(trial._trial_id, TRIAL_RECORD, record.to_json())


def mark_running(trial: optuna.Trial, worker: str, port: int) -> None:
    trial.set_user_attr(RUNNING_ON, {"worker": worker, "port": port})


def running_on(trial: FrozenTrial) -> dict | None:
    """{"worker": "HOST:PID", "port": N} of a trial whose server came up, else None."""
    return trial.user_attrs.get(RUNNING_ON)


def record_attrs(record: TrialRecord) -> dict:
    """The user attrs that hold a finished trial's record (a trial added whole, e.g. from the journal)."""
    return {ROLE: record.role, TRIAL_RECORD: record.to_json()}


def has_record(trial: FrozenTrial) -> bool:
    return TRIAL_RECORD in trial.user_attrs


def role_of(trial: FrozenTrial | optuna.Trial) -> str:
    return trial.user_attrs.get(ROLE, "search")


def read_trial(trial: FrozenTrial) -> TrialRecord:
    """A trial as a record; one without a record yet (running, waiting, or orphaned) is built
    from Optuna's own fields."""
    data = trial.user_attrs.get(TRIAL_RECORD)
    if data is not None:
        return TrialRecord.from_json(data, trial.number, trial.state.name)
    failure = None
    if trial.state == TrialState.FAIL:
        failure = Failure(ORPHANED, "the process running it died before recording it")
    return TrialRecord(
        number=trial.number,
        state=trial.state.name,
        role=role_of(trial),
        config=config_from_dict(dict(trial.params)),
        failure=failure,
    )


def failure_reason(trial: FrozenTrial) -> str | None:
    """Why a finished trial failed, None if it did not fail or left no record of why
    (a dead worker's trial, or a benchmark replay's)."""
    data = trial.user_attrs.get(TRIAL_RECORD)
    return ((data or {}).get("failure") or {}).get("reason")


def read_trials(study: optuna.Study, finished_only: bool = True) -> list[TrialRecord]:
    return [
        read_trial(t) for t in study.get_trials(deepcopy=False) if t.state.is_finished() or not finished_only
    ]


def best_feasible(study: optuna.Study) -> TrialRecord | None:
    return best_of(read_trials(study))


def best_of(records: list[TrialRecord]) -> TrialRecord | None:
    """Highest tokens/s among complete trials that meet the quality floor."""
    return max(
        (r for r in records if r.feasible), key=lambda r: r.measured_metrics.tokens_per_second, default=None
    )


def baseline_trial(study: optuna.Study) -> FrozenTrial:
    """The trial whose outputs are the reference (its params are the baseline configuration's)."""
    reference = read_reference(study)
    if reference is None:
        raise UserError(f"study {study.study_name!r} has no baseline yet; run it first (`tuner run`)")
    return study.trials[reference.trial]


def add_measured_trial(
    study: optuna.Study, record: TrialRecord, params: dict, distributions: dict, values: list[float] | None
) -> TrialRecord:
    """Store a trial measured outside Optuna's ask/tell (a sentinel), with its record, in one call."""
    complete = record.failure is None
    study.add_trial(
        optuna.trial.create_trial(
            state=TrialState.COMPLETE if complete else TrialState.FAIL,
            params=params,
            distributions=distributions,
            values=values if complete else None,
            user_attrs=record_attrs(record),
            system_attrs={"constraints": [record.constraint]} if complete else {},
        )
    )
    return read_trial(study.trials[-1])


def write_race(study: optuna.Study, race: dict) -> None:
    study.set_user_attr(RACE, race)


def read_race(study: optuna.Study) -> dict | None:
    return study.user_attrs.get(RACE)


def write_load_race(study: optuna.Study, users: int, race: dict | None) -> None:
    """A load class's race; None clears an earlier one (this export found nothing to race at that level)."""
    study.set_user_attr(f"{LOAD_RACE}{users}", race)


def read_load_races(study: optuna.Study) -> dict[int, dict]:
    """Each load class's last race by its users, fewest first."""
    found = {
        int(key[len(LOAD_RACE) :]): race
        for key, race in study.user_attrs.items()
        if key.startswith(LOAD_RACE) and key[len(LOAD_RACE) :].isdigit() and race
    }
    return dict(sorted(found.items()))


def write_progress(study: optuna.Study, progress: StoredProgress) -> None:
    """Where the running command is: its last line, elapsed and remaining seconds (``tuner.progress.Progress``)."""
    study.set_user_attr(PROGRESS, progress)


def read_progress(study: optuna.Study) -> StoredProgress | None:
    return study.user_attrs.get(PROGRESS)


def write_per_type(study: optuna.Study, result: Mapping[str, Any]) -> None:
    study.set_user_attr(PER_TYPE, result)


def read_per_type(study: optuna.Study) -> dict | None:
    return study.user_attrs.get(PER_TYPE)


def append_verification(study: optuna.Study, line: dict) -> None:
    """One more ``tuner verify`` in the study's record, after the earlier ones (the host lock it measured under
    keeps two verifications on one host from interleaving)."""
    study.set_user_attr(VERIFICATIONS, [*read_verifications(study), line])


def read_verifications(study: optuna.Study) -> list[dict]:
    """Every ``tuner verify`` of the study, oldest first."""
    return list(study.user_attrs.get(VERIFICATIONS) or [])


def baseline_record(study: optuna.Study) -> TrialRecord | None:
    """The trial whose outputs are the study's reference (else its first complete baseline)."""
    reference = read_reference(study)
    if reference is not None:
        return read_trial(study.trials[reference.trial])
    return next((r for r in read_trials(study) if r.role == "baseline" and r.complete), None)


# ------------------------------------------------------------------ opening a stored study


def resolve_ref(ref: str, storage: str | None) -> tuple[str, str]:
    """(study name, storage URL) from a study name or a study file (its name and storage); a name that
    is not one safe folder name is refused, as the study file's parser refuses it (it names folders)."""
    path = Path(ref)
    if path.suffix in (".yaml", ".yml") or path.is_file():
        data = load_yaml_mapping(path)
        name = check_study_name(str(data.get("name") or path.stem), f"{path}: name")
        return name, storage or data.get("storage") or default_storage_url()
    return check_study_name(ref, "study (not a file, so a study name)"), storage or default_storage_url()


def require_storage(url: str) -> None:
    """A missing SQLite file is a typo or a study never run, not a new empty database."""
    if url.startswith("sqlite:///") and not Path(url.removeprefix("sqlite:///")).is_file():
        raise UserError(
            f"storage {safe_url(url)}: no such file; run a study first (`tuner run studies/NAME.yaml`) "
            "or pass --storage"
        )


def open_stored_study(ref: str, storage: str | None = None) -> tuple[optuna.Study, StudyRecord]:
    """A stored study by name or study file, with its record; an unknown name lists the known ones,
    an unreachable or missing database is one line."""
    name, url = resolve_ref(ref, storage)
    check_scheme(url)
    require_storage(url)
    try:
        try:
            study = optuna.load_study(
                study_name=name, storage=with_driver(url), sampler=optuna.samplers.RandomSampler(seed=0)
            )
        except KeyError:
            known = optuna.get_all_study_names(with_driver(url))
            raise UserError(
                f"study {name!r}: not in {safe_url(url)}; known studies: {', '.join(known) or 'none'}"
            ) from None
    except UserError:
        raise
    except Exception as err:  # sqlalchemy and the drivers raise many kinds; all mean "cannot use this URL"
        raise cannot_open(err, url) from err
    return study, read_study_record(study)
