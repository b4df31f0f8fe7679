"""`tuner dashboard`: notes with each trial's command line, and optuna-dashboard serving the study,
on a study the real runner measured with the stand-in llama-server."""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys

import browser
import optuna
import pytest
from fake_llama_server import get_json, wait_for_json
from optuna_dashboard import get_note

from tuner.measurement.server_process import free_port
from tuner.output.dashboard import annotate
from tuner.paths import REPO_ROOT
from tuner.storage import store


def note_of(study: optuna.Study, number: int) -> str:
    return get_note(optuna.trial.Trial(study, study.trials[number]._trial_id))


def test_annotate_names_objectives_and_notes_every_trial_once(storage, demo):
    study = demo[0]
    records = store.read_trials(study)
    assert annotate(storage) == 1 + len(records)  # the study note and one note per finished trial
    assert annotate(storage) == 0  # nothing changed: nothing rewritten
    assert study.metric_names == ["tokens_per_second", "acceptance", "quality"]
    best = store.best_feasible(study)
    m = best.metrics
    assert (
        f"best feasible**: trial {best.number}, {m.tokens_per_second:.1f} tokens/s, x{m.speedup:.2f}"
    ) in get_note(study)
    note = note_of(study, best.number)
    assert (
        f"{m.tokens_per_second:.1f} tokens/s, x{m.speedup:.2f} over the baseline, acceptance {m.acceptance:.2f}, "
        "quality 1.000: feasible"
    ) in note
    assert f"```sh\n{shlex.join(best.argv)} --host 127.0.0.1 --port 8080\n```" in note
    hot = next(r for r in records if r.complete and not r.feasible)
    assert "below the quality floor" in note_of(study, hot.number)
    failed = next(r for r in records if r.state == "FAIL")
    assert "**failed**: out_of_memory" in note_of(study, failed.number)


@pytest.mark.slow
def test_dashboard_serves_the_study_over_http_and_in_a_browser(storage, demo, tmp_path):
    """The module's storage holds the demo study alone: the dashboard shows every study in it."""
    study = demo[0]
    records, best = store.read_trials(study), store.best_feasible(study)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    with open(tmp_path / "dashboard.log", "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tuner.cli", "dashboard", "--storage", storage, "--port", str(port)],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=REPO_ROOT,
            start_new_session=True,
        )
    try:
        studies = wait_for_json(proc, f"{base}/api/studies", 60, "tuner dashboard")["study_summaries"]
        assert [s["study_name"] for s in studies] == ["demo"]
        study_id = studies[0]["study_id"]
        detail = get_json(f"{base}/api/studies/{study_id}")
        assert detail["objective_names"] == ["tokens_per_second", "acceptance", "quality"]
        assert len(detail["trials"]) == len(records)
        shown = detail["trials"][best.number]
        assert shlex.join(best.argv) in shown["note"]["body"]
        assert {"record", "role"} <= {a["key"] for a in shown["user_attrs"]}  # the trial's record, as stored

        root = browser.render(
            f"{base}/dashboard/studies/{study_id}", screenshot="dashboard-demo.png", budget_ms=10000
        )
        text = root.all_text()
        assert "demo (id=" in text and "Pareto Front" in text and "tokens_per_second" in text
        pareto = root.find_all("svg", "main-svg")[0]  # the first plot on the study page
        points = sum(len(t.find_all("path", "point")) for t in pareto.parent.find_all("g", "trace"))
        assert points == sum(r.complete for r in records), "the Pareto plot should show every complete trial"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert "127.0.0.1" in (tmp_path / "dashboard.log").read_text()
