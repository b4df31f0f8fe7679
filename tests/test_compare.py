"""`tuner compare`: two studies joined on identical configurations, as compare-llama-bench does.

The studies are measured by the real runner on the stand-in llama-server: A is the demo
study, B another build (FAKE_LLAMA_COMMIT) that decodes 10% faster (FAKE_LLAMA_SPEED), in
its own storage.
"""

from __future__ import annotations

import statistics

import pytest
from fake_llama_server import PINNED_COMMIT, demo_warm_start, run_study_file, write_demo_study

from tuner.cli import main
from tuner.errors import UserError
from tuner.output.compare import compare_studies, format_markdown
from tuner.storage import store

NEW_COMMIT = "deadbee"


@pytest.fixture(scope="module")
def b(tmp_path_factory):
    """The baseline and the first three demo configurations again on a build 10% faster,
    plus one configuration A did not measure."""
    folder = tmp_path_factory.mktemp("b")  # a storage of its own: `tuner compare` across two storages
    warm_start = [
        *demo_warm_start()[:3],
        {
            "spec_type": "ngram-simple",
            "draft_max": 8,
            "temperature": 0.0,
            "threads": demo_warm_start()[0]["threads"],
        },
    ]
    return run_study_file(
        write_demo_study(folder, f"sqlite:///{folder / 'studies.db'}", "b", warm_start),
        FAKE_LLAMA_COMMIT=NEW_COMMIT,
        FAKE_LLAMA_SPEED="1.1",
    )


def test_join_on_identical_configs_with_ratio_and_differing_keys(demo, b):
    c = compare_studies(*demo, *b)
    # only comparability keys count: the bin folder, free memory and load differ too but are provenance
    assert c.differing == [("llama_commit", PINNED_COMMIT, NEW_COMMIT)]
    complete_a = {r.config for r in store.read_trials(demo[0]) if r.complete}
    complete_b = {r.config for r in store.read_trials(b[0]) if r.complete}
    assert len(c.rows) == len(complete_a & complete_b) == 4  # the failed trial has no speed to join
    assert (c.only_a, c.only_b) == (len(complete_a - complete_b), 1)
    assert c.rows["ratio"].tolist() == pytest.approx([1.1] * 4)
    assert c.geomean_ratio == pytest.approx(1.1)
    top = max(
        (r for r in store.read_trials(demo[0]) if r.config in complete_b),
        key=lambda r: r.metrics.tokens_per_second,
    )
    assert c.rows.iloc[0][["spec_type", "draft_max", "tps_a"]].tolist() == [
        top.config.spec_type,
        top.config.draft_max,
        top.metrics.tokens_per_second,
    ]


def test_repeated_configs_are_reduced_to_their_median(demo, storage, tmp_path):
    """One configuration measured in three sessions of one study, each on a machine of another speed."""
    path = write_demo_study(
        tmp_path,
        storage,
        "repeats",
        warm_start=[],
        search_space={"overrides": {"spec_type": "none", "temperature": 0.0, "threads": 1}},
    )
    for trials, speed in ((1, "0.8"), (2, "1.0"), (3, "1.4")):
        repeats = run_study_file(path, trials, FAKE_LLAMA_SPEED=speed)
    # every reading of the one configuration the study stored: a trial per session, and any sentinel or busy
    # baseline's relaunch a loaded host brings
    readings = [r.metrics.tokens_per_second for r in store.read_trials(repeats[0]) if r.complete]
    assert len(readings) >= 3 and len(set(readings)) == 3  # three sessions, three speeds
    c = compare_studies(*repeats, *demo)
    assert "All comparability keys are equal" in format_markdown(c)
    same = next(r for r in store.read_trials(demo[0]) if r.config == store.read_trials(repeats[0])[0].config)
    assert c.rows[["tps_a", "tps_b", "n_a", "n_b"]].values.tolist() == [
        [statistics.median(readings), same.metrics.tokens_per_second, len(readings), 1]
    ]


def test_markdown_names_what_differs_and_only_the_varying_knobs(demo, b):
    lines = format_markdown(compare_studies(*demo, *b)).splitlines()
    assert lines[0] == "Comparing b (B) against demo (A)."
    assert (
        lines[1] == f"Fingerprint keys that differ: llama_commit: '{PINNED_COMMIT}' (A) vs '{NEW_COMMIT}' (B)"
    )
    header = next(line for line in lines if line.startswith("| "))
    assert (
        header == "| spec_type | draft_max | t/s A | t/s B | B/A | accept A | accept B |"
    )  # one draft: no column
    k8 = next(
        r for r in store.read_trials(b[0]) if r.config.draft_max == 8 and r.config.spec_type == "draft-simple"
    )
    tps_a = next(r.metrics.tokens_per_second for r in store.read_trials(demo[0]) if r.config == k8.config)
    assert (
        f"| draft-simple | 8 | {tps_a:.2f} | {k8.metrics.tokens_per_second:.2f} | 1.10 | "
        f"{k8.metrics.acceptance:.2f} | {k8.metrics.acceptance:.2f} |"
    ) in lines
    assert lines[-1] == "Geometric mean B/A over 4 configurations: 1.100"


def test_studies_of_other_prompts_are_refused_in_one_line(demo, storage, tmp_path, capsys):
    path = write_demo_study(tmp_path, storage, "reworded", warm_start=[])
    (tmp_path / "prose.yaml").write_text("prompts:\n  - {id: prose, text: It was a dark and stormy night}\n")
    reworded = run_study_file(path)
    with pytest.raises(UserError, match="workload") as refused:
        compare_studies(*demo, *reworded)
    assert "\n" not in str(refused.value) and ": workload (prompt texts) differs (A has " in str(
        refused.value
    )
    assert main(["compare", demo[1].spec_path, str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "workload (prompt texts) differs" in err


def test_compare_command_across_two_storages(demo, b, storage, capsys):
    assert main(["compare", demo[1].spec_path, b[1].spec_path]) == 0  # each study file names its storage
    out = capsys.readouterr().out
    assert f"llama_commit: '{PINNED_COMMIT}' (A) vs '{NEW_COMMIT}' (B)" in out
    assert "Geometric mean B/A over 4 configurations: 1.100" in out
    storage_b = store.resolve_ref(b[1].spec_path, None)[1]
    assert (
        main(["compare", "demo", "b", "--storage", storage, "--storage-b", storage_b, "--format", "csv"]) == 0
    )
    csv = capsys.readouterr().out.splitlines()
    assert csv[0].startswith("spec_type,draft,draft_max") and len(csv) == 1 + 4
