"""`tuner dashboard`: notes with each trial's command line, and optuna-dashboard serving the study."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import optuna
import pytest
from optuna_dashboard import get_note

import browser
from fake_llama_server import get_json, wait_for_json
from study_factory import make_study
from study_factory import no_llama_process_left_behind  # noqa: F401  (overrides conftest's machine-wide check)
from tuner.dashboard import annotate
from tuner.paths import REPO_ROOT
from tuner.runner import free_port


@pytest.fixture(scope="module")
def storage(tmp_path_factory):
    url = f"sqlite:///{tmp_path_factory.mktemp('storage') / 'studies.db'}"
    make_study(url, "demo")
    return url


def test_annotate_names_objectives_and_notes_every_trial_once(storage):
    assert annotate(storage) == 12  # the study note and one note per finished trial
    assert annotate(storage) == 0  # nothing changed: nothing rewritten
    study = optuna.load_study(study_name="demo", storage=storage)
    assert study.metric_names == ["tokens_per_second", "acceptance", "quality"]
    assert "best feasible**: trial 2, 95.0 tokens/s, x1.90" in get_note(study)
    note = get_note(optuna.trial.Trial(study, study.trials[2]._trial_id))
    assert "95.0 tokens/s, x1.90 over the baseline, acceptance 0.62, quality 1.000: feasible" in note
    assert "```sh\n" in note and "/opt/llama/bin/llama-server --model /srv/models/target.gguf" in note
    assert "--spec-draft-n-max 8 --host 127.0.0.1 --port 8080\n```" in note
    failed = get_note(optuna.trial.Trial(study, study.trials[10]._trial_id))
    assert "**failed**: out_of_memory" in failed


@pytest.mark.slow
def test_dashboard_serves_the_study_over_http_and_in_a_browser(storage, tmp_path):
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    with open(tmp_path / "dashboard.log", "wb") as log:
        proc = subprocess.Popen([sys.executable, "-m", "tuner.cli", "dashboard", "--storage", storage, "--port", str(port)],
                                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=REPO_ROOT,
                                start_new_session=True)
    try:
        studies = wait_for_json(proc, f"{base}/api/studies", 60, "tuner dashboard")["study_summaries"]
        assert [s["study_name"] for s in studies] == ["demo"]
        study_id = studies[0]["study_id"]
        detail = get_json(f"{base}/api/studies/{study_id}")
        assert detail["objective_names"] == ["tokens_per_second", "acceptance", "quality"]
        assert len(detail["trials"]) == 11
        assert "llama-server --model" in detail["trials"][2]["note"]["body"]
        assert {"argv", "metrics", "per_suite_tokens_per_second"} <= {a["key"] for a in detail["trials"][2]["user_attrs"]}

        root = browser.render(f"{base}/dashboard/studies/{study_id}", screenshot="dashboard-demo.png", budget_ms=10000)
        text = root.all_text()
        assert "demo (id=" in text and "Pareto Front" in text and "tokens_per_second" in text
        pareto = root.find_all("svg", "main-svg")[0]  # the first plot on the study page
        points = sum(len(t.find_all("path", "point")) for t in pareto.parent.find_all("g", "trace"))
        assert points == 10, "the Pareto plot should show every complete trial"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert "127.0.0.1" in (tmp_path / "dashboard.log").read_text()
