"""`tuner compare`: two studies joined on identical configurations, as compare-llama-bench does."""

from __future__ import annotations

import dataclasses

import optuna
import pytest

from study_factory import FINGERPRINT, Row, demo_rows, make_study
from study_factory import no_llama_process_left_behind  # noqa: F401  (overrides conftest's machine-wide check)
from tuner.cli import main
from tuner.compare import compare_studies, format_markdown


def faster(rows: list[Row], factor: float) -> list[Row]:
    return [dataclasses.replace(r, tokens_per_second=r.tokens_per_second * factor) for r in rows]


def new_build() -> dict:
    return {**FINGERPRINT, "llama_commit": "abc1234", "hostname": "bench-2"}


def test_join_on_identical_configs_with_ratio_and_differing_keys():
    storage = optuna.storages.InMemoryStorage()
    a = make_study(storage, "a")
    extra = Row({"spec_type": "ngram-simple", "draft_max": 8, "temperature": 0.0, "numa": "none", "threads": 2}, 40.0)
    b = make_study(storage, "b", faster(demo_rows(), 1.1) + [extra], fingerprint=new_build())
    c = compare_studies(a, b)
    # only comparability keys count: the hostname differs too but is provenance
    assert c.differing == [("llama_commit", "0c1e570", "abc1234")]
    assert c.target_differs == []
    assert len(c.rows) == 10  # the 10 complete configurations; the failed trial has no speed
    assert (c.only_a, c.only_b) == (0, 1)
    assert c.rows["ratio"].tolist() == pytest.approx([1.1] * 10)
    assert c.geomean_ratio == pytest.approx(1.1)
    top = c.rows.iloc[0]
    assert (top["spec_type"], top["draft"], top["draft_max"], top["tps_a"]) == ("draft-simple", "draft-small", 8, 120.0)


def test_repeated_configs_are_reduced_to_their_median():
    storage = optuna.storages.InMemoryStorage()
    base = {"spec_type": "none", "temperature": 0.0, "numa": "none", "threads": 2}
    a = make_study(storage, "a", [Row(base, 50.0, role="baseline"), Row(base, 40.0), Row(base, 70.0)])
    b = make_study(storage, "b", [Row(base, 60.0, role="baseline")])
    c = compare_studies(a, b)
    assert c.rows[["tps_a", "tps_b", "n_a", "n_b"]].values.tolist() == [[50.0, 60.0, 3, 1]]


def test_markdown_names_what_differs_and_only_the_varying_knobs():
    storage = optuna.storages.InMemoryStorage()
    a = make_study(storage, "a")
    b = make_study(storage, "b", faster(demo_rows(), 0.5), fingerprint=new_build())
    text = format_markdown(compare_studies(a, b))
    lines = text.splitlines()
    assert lines[0] == "Comparing b (B) against a (A)."
    assert lines[1] == "Fingerprint keys that differ: llama_commit: '0c1e570' (A) vs 'abc1234' (B)"
    header = next(line for line in lines if line.startswith("| "))
    assert header == "| spec_type | draft | draft_max | temperature | numa | threads | t/s A | t/s B | B/A | accept A | accept B |"
    assert "| draft-simple | draft-small | 8 | 0 | none | 2 | 95.00 | 47.50 | 0.50 | 0.62 | 0.62 |" in lines
    assert lines[-1] == "Geometric mean B/A over 10 configurations: 0.500"


def test_equal_fingerprints_and_a_different_target_are_said():
    storage = optuna.storages.InMemoryStorage()
    a = make_study(storage, "a")
    b = make_study(storage, "b")
    text = format_markdown(compare_studies(a, b))
    assert "All comparability keys are equal" in text
    other = make_study(storage, "c", target={"path": "/srv/models/other.gguf", "weights_bytes": 5})
    assert "WARNING: the target differs (path" in format_markdown(compare_studies(a, other))


def test_compare_command_across_two_storages(tmp_path, capsys):
    url_a, url_b = (f"sqlite:///{tmp_path / name}" for name in ("a.db", "b.db"))
    make_study(url_a, "demo")
    make_study(url_b, "demo", faster(demo_rows(), 2.0), fingerprint={**FINGERPRINT, "cpu_model": "Intel Xeon 6980P"})
    assert main(["compare", "demo", "demo", "--storage", url_a, "--storage-b", url_b]) == 0
    out = capsys.readouterr().out
    assert "cpu_model: 'AMD EPYC 9654 96-Core Processor' (A) vs 'Intel Xeon 6980P' (B)" in out
    assert "Geometric mean B/A over 10 configurations: 2.000" in out
    assert main(["compare", "demo", "demo", "--storage", url_a, "--storage-b", url_b, "--format", "csv"]) == 0
    csv = capsys.readouterr().out.splitlines()
    assert csv[0].startswith("spec_type,draft,draft_max") and len(csv) == 11
