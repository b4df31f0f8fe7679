"""optuna-dashboard on the studies' storage (`tuner dashboard`, `make dashboard`).

Before serving, every study is annotated for a reader: objective names instead of
"Objective 0", a study note (target, machine, build, floor, baseline, best feasible),
and one note per trial with its exact llama-server command line (and the failure
reason of failed trials). Notes are written only when their text changed, so running
the dashboard again leaves the storage as it was. The server binds 127.0.0.1 by
default: the dashboard has no authentication and can rename or delete studies.
"""

from __future__ import annotations

import shlex
import warnings

import optuna

from tuner.errors import UserError
from tuner.storage import store
from tuner.storage.records import StudyRecord, TrialRecord
from tuner.storage.urls import with_driver
from tuner.studyfile.spec import default_storage_url

LOOPBACK = ("127.0.0.1", "localhost", "::1")


def study_note(study: optuna.Study, record: StudyRecord) -> str:
    target, fp, quality = record.target, record.fingerprint, record.quality
    reference = store.read_reference(study)
    lines = [
        f"## {study.study_name}",
        f"- **target**: {target.get('name') or target.get('path')} ({target.get('architecture')}, "
        f"{target.get('quantization')}, {(target.get('weights_bytes') or 0) / 1e9:.2f} GB)",
        f"- **machine**: {fp.get('cpu_model')}, {fp.get('physical_cores')} cores, NUMA nodes {fp.get('numa_nodes')}",
        f"- **llama.cpp**: {fp.get('llama_commit')} ({fp.get('llama_build_flags')})",
        f"- **quality**: {quality.get('scorer')} scorer, floor {quality.get('floor')} "
        "(a trial is feasible when its record's `constraint` is <= 0)",
    ]
    if reference is not None:
        lines.append(f"- **baseline**: trial {reference.trial}, {reference.tokens_per_second:.1f} tokens/s")
    best = store.best_feasible(study)
    if best is not None:
        assert best.metrics is not None, "a feasible trial is complete, so it has metrics"
        lines.append(
            f"- **best feasible**: trial {best.number}, {best.metrics.tokens_per_second:.1f} tokens/s, "
            f"x{best.metrics.speedup:.2f} over the baseline"
        )
    lines += [
        "",
        f"`tuner report {study.study_name}` draws the fronts and the roofline; "
        f"`tuner export {study.study_name}` writes the winner's launch script.",
    ]
    return "\n".join(lines)


def trial_note(record: TrialRecord) -> str:
    lines = [f"**role**: {record.role}"]
    metrics = record.metrics
    if record.complete:
        assert metrics is not None, "a complete trial has metrics"
        verdict = "feasible" if record.feasible else "below the quality floor"
        lines.append(
            f"{metrics.tokens_per_second:.1f} tokens/s, x{metrics.speedup:.2f} over the baseline, "
            f"acceptance {metrics.acceptance:.2f}, quality {metrics.quality:.3f}: {verdict}"
            + (" (noisy)" if record.spread and record.spread.noisy else "")
        )
    if record.failure:
        lines.append(f"**failed**: {record.failure.reason}: {record.failure.detail}")
    if record.argv:
        lines += ["", "```sh", shlex.join(record.argv) + " --host 127.0.0.1 --port 8080", "```"]
    return "\n".join(lines)


def annotate(storage_url: str) -> int:
    """Objective names and notes on every study of the storage; returns the notes written."""
    from optuna_dashboard import get_note, save_note

    written = 0
    for name in optuna.get_all_study_names(storage_url):
        study, record = store.open_stored_study(name, storage_url)
        objectives = list(record.objectives)
        if len(objectives) == len(study.directions) and study.metric_names != objectives:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                study.set_metric_names(objectives)  # the dashboard's axis and column names
        note = study_note(study, record)
        if get_note(study) != note:
            save_note(study, note)
            written += 1
        for frozen in study.get_trials(deepcopy=False):
            if not frozen.state.is_finished():
                continue
            body = trial_note(store.read_trial(frozen))
            trial = optuna.trial.Trial(study, frozen._trial_id)
            if get_note(trial) != body:
                save_note(trial, body)
                written += 1
    return written


def serve(storage: str | None, host: str, port: int, notes: bool) -> None:
    """Annotate the studies (unless ``notes`` is false), then serve optuna-dashboard until Ctrl-C."""
    from optuna_dashboard import run_server

    url = storage or default_storage_url()
    store.require_storage(url)
    url = with_driver(url)  # a raw '/', ':' or '@' in the password, percent-encoded
    if not 0 < port < 65536:
        raise UserError(f"--port: must be 1-65535, got {port}")
    if notes:
        print(f"dashboard: {annotate(url)} notes updated", flush=True)
    if host not in LOOPBACK:
        print(
            f"dashboard: listening on {host}: anyone who can reach it can edit or delete studies", flush=True
        )
    print(f"dashboard: http://{host}:{port}/dashboard (Ctrl-C stops it)", flush=True)
    try:
        run_server(url, host=host, port=port)
    except KeyboardInterrupt:
        pass
    except OSError as err:
        raise UserError(
            f"--host {host} --port {port}: cannot listen ({err.strerror}); pick another port"
        ) from None
