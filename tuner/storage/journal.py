"""The local journal: no measured trial is lost to a storage outage.

Every finished trial's record is appended to a local JSONL file (flushed and fsynced)
*before* it is written to storage: ``storage_dir()/journal/STUDY-HASH.jsonl``, one file per
study and storage URL (HASH of the URL without its password). A line holds what Optuna
needs to recreate the trial: the study, the trial's number, state, values, params and
their distributions, its user attrs (the ``TrialRecord`` and its role), its quality
constraint, and the baseline's reference outputs.

``replay`` runs when a study run starts (under the host's measurement lock, after the
storage is opened): a journalled trial that storage holds finished and with its record
is dropped from the journal; any other is added to the study as a new finished trial
(``study.add_trial``) carrying its record, a ``replay_of`` system attr naming the original
number and, in ``retry_history``, that number (so the budget counts it once). The original,
if still RUNNING, is failed with reason ``orphaned`` naming its replacement. The journal
then keeps only what could not be replayed. A line goes as soon as storage confirms its
trial, so the journal holds exactly the measured trials storage lacks. One process per host measures (``tuner.machine.hostlock``), so one process writes a
journal at a time.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import asdict, replace
from pathlib import Path

import optuna
from optuna.distributions import distribution_to_json, json_to_distribution
from optuna.trial import FrozenTrial, TrialState

from tuner.paths import storage_dir
from tuner.progress import Progress
from tuner.storage import store
from tuner.storage.records import Failure, Reference, TrialRecord
from tuner.storage.urls import safe_url

REPLAY_OF = "replay_of"


def journal_path(study: str, url: str) -> Path:
    digest = hashlib.sha256(safe_url(url).encode()).hexdigest()[:10]
    return storage_dir() / "journal" / f"{re.sub(r'[^A-Za-z0-9_.-]', '_', study)}-{digest}.jsonl"


class Journal:
    """This run's journal of one study in one storage."""

    def __init__(self, study: str, url: str):
        self.study = study
        self.url = url
        self.path = journal_path(study, url)
        self.unstored: set[int] = {e["number"] for e in self.entries()}
        self.unwritable: str | None = None

    def entries(self) -> list[dict]:
        try:
            lines = self.path.read_text().splitlines()
        except FileNotFoundError:
            return []
        out = []
        for line in lines:
            try:
                out.append(json.loads(line))
            except (
                json.JSONDecodeError
            ):  # a line cut short by a crash or a full disk: nothing was stored from it
                continue
        return out

    def keep(
        self,
        trial: optuna.Trial,
        record: TrialRecord,
        values: tuple[float, ...] | None,
        reference: Reference | None = None,
    ) -> None:
        """Append the trial's record, fsynced, before it goes to storage."""
        entry = {
            "study": self.study,
            "storage": safe_url(self.url),
            "number": trial.number,
            "state": record.state,
            "values": list(values) if values is not None else None,
            "params": trial.params,
            "distributions": {k: distribution_to_json(d) for k, d in trial.distributions.items()},
            "attrs": store.record_attrs(record),
            "constraint": record.constraint,
            "reference": asdict(reference) if reference is not None else None,
        }
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with open(self.path, "a") as journal_file:
                journal_file.write(json.dumps(entry, default=str) + "\n")
                journal_file.flush()
                os.fsync(journal_file.fileno())
        except OSError as err:  # a full disk here too: storage is the only copy left
            self.unwritable = f"{self.path}: {err.strerror}"
            return
        self.unstored.add(trial.number)

    def stored(self, number: int) -> None:
        """Storage confirmed the trial (it is finished there, with its record): its line goes."""
        if number in self.unstored:
            self.unstored.discard(number)
            self.settle()

    def pending(self) -> tuple[int, str]:
        """(measured trials not yet confirmed in storage, where they are kept)."""
        return len(self.unstored), str(self.path)

    def settle(self) -> None:
        """Keep only the lines storage has not confirmed; no file when all are stored."""
        left = [e for e in self.entries() if e["number"] in self.unstored]
        try:
            if not left:
                self.path.unlink(missing_ok=True)
                return
            tmp = self.path.with_suffix(".tmp")
            tmp.write_text("".join(json.dumps(e, default=str) + "\n" for e in left))
            os.replace(tmp, self.path)
        except OSError:
            pass  # kept as it is: replay skips what storage already holds

    def replay(self, study: optuna.Study, progress: Progress) -> int:
        """Store the journalled trials storage lacks (see the module docstring); returns how many."""
        entries = self.entries()
        if not entries:
            return 0
        trials = {t.number: t for t in study.get_trials(deepcopy=False)}
        replayed: set[int] = {
            t.system_attrs[REPLAY_OF] for t in trials.values() if t.system_attrs.get(REPLAY_OF) is not None
        }
        added = 0
        for entry in entries:
            number = entry["number"]
            original = trials.get(number)
            if _already_stored(number, original, replayed) or _measured_nothing(entry):
                self.unstored.discard(number)
                continue
            new = _add_replayed(study, entry)
            if original is not None and original.state == TrialState.RUNNING:
                _fail_orphan(study, original, new.number)
            self.unstored.discard(number)
            added += 1
            progress(
                f"trial {number}: measured before the storage failed, stored from the journal as trial "
                f"{new.number}"
            )
        self.settle()
        return added


def _already_stored(number: int, original: FrozenTrial | None, replayed: set[int]) -> bool:
    """Storage has it already: replayed by an earlier run, or finished there with its record."""
    return number in replayed or (
        original is not None and original.state.is_finished() and store.has_record(original)
    )


def _measured_nothing(entry: dict) -> bool:
    """An interrupted trial measured nothing: there is nothing to keep."""
    record = json.loads(json.dumps(entry["attrs"][store.TRIAL_RECORD]))
    return ((record.get("failure") or {}).get("reason")) == "interrupted"


def _add_replayed(study: optuna.Study, entry: dict) -> FrozenTrial:
    """The journalled trial as a new finished trial, naming the original (``replay_of``, and in
    ``retry_history`` so the budget counts it once); the baseline's reference if storage lost it too."""
    number = entry["number"]
    state = TrialState[entry["state"]]
    study.add_trial(
        optuna.trial.create_trial(
            state=state,
            values=entry["values"] if state == TrialState.COMPLETE else None,
            params=entry["params"],
            distributions={k: json_to_distribution(d) for k, d in entry["distributions"].items()},
            user_attrs=entry["attrs"],
            system_attrs={REPLAY_OF: number, "retry_history": [number]},
            constraints={"quality_floor": entry["constraint"]}
            if entry.get("constraint") is not None
            else None,
        )
    )
    new = next(t for t in study.get_trials(deepcopy=False) if t.system_attrs.get(REPLAY_OF) == number)
    if entry.get("reference") and store.read_reference(study) is None:
        store.write_reference(study, replace(Reference(**entry["reference"]), trial=new.number))
    return new


def _fail_orphan(study: optuna.Study, original: FrozenTrial, replacement: int) -> None:
    """The original, left RUNNING by the process that measured it, fails as orphaned naming its replacement."""
    orphan = store.read_trial(original)
    store.write_finished_record(
        study,
        original,
        replace(
            orphan,
            state="FAIL",
            failure=Failure(
                store.ORPHANED,
                f"its process stopped before storing it; its measurement, kept in the "
                f"journal, is trial {replacement}",
            ),
        ),
    )
    study.tell(original.number, state=TrialState.FAIL)
