"""Workloads: the built-in suites load, user suites are validated with errors that name the field."""

from __future__ import annotations

import pytest

from tuner.errors import UserError
from tuner.measurement.workload import BUILTIN_SUITES, Expectation, load_workload


def test_builtin_suites_load_with_unique_ids_and_a_handful_of_prompts(tmp_path):
    workload = load_workload(list(BUILTIN_SUITES), tmp_path)
    assert workload.suites == BUILTIN_SUITES
    ids = [p.id for p in workload.prompts]
    assert len(ids) == len(set(ids))
    for suite in BUILTIN_SUITES:
        prompts = [p for p in workload.prompts if p.suite == suite]
        # raw suites: a handful of prompts; chat suites: three conversations (nine requests)
        assert (3 if suite.startswith("chat-") else 4) <= len(prompts) <= 6, suite
        # well under 400 tokens each; docqa's passages 300-800 tokens (its limit: 800 tokens of English)
        assert all(len(p.text) < (3400 if suite == "docqa" else 1600) for p in prompts), suite
    assert all(p.expected for p in workload.prompts if p.suite in ("math", "json"))
    assert any(e.kind == "regex" for p in workload.prompts if p.suite == "json" for e in p.expected)


def test_user_suite_relative_to_base_dir_next_to_builtins(tmp_path):
    (tmp_path / "suites").mkdir()
    (tmp_path / "suites" / "mine.yaml").write_text(
        "prompts:\n"
        "  - text: 'def add(a, b):'\n"
        "  - id: answer\n"
        "    text: 'What is 6 * 7?'\n"
        "    expected:\n"
        "      - {kind: contains, value: 42}\n"
    )
    workload = load_workload(["code", "suites/mine.yaml"], tmp_path)
    assert workload.suites == ("code", "mine")
    mine = [p for p in workload.prompts if p.suite == "mine"]
    assert [p.id for p in mine] == ["mine-1", "answer"]
    assert mine[1].expected == (Expectation("contains", "42"),)


@pytest.mark.parametrize(
    "content, message",
    [
        (
            "prompts: [{text: a, expected: [{kind: equals, value: x}]}]",
            "suites/my.yaml: prompts[0].expected[0].kind: unknown kind 'equals'; use exact, regex or contains",
        ),
        ("prompts: [{text: a}, {id: b}]", "suites/my.yaml: prompts[1].text: missing or empty"),
        ("prompts: [{id: x, text: a}, {id: x, text: b}]", "suites/my.yaml: prompt id 'x' is already used"),
        ("prompts: []", "suites/my.yaml: prompts: the suite is empty"),
        ("prompts: [{text: a", "suites/my.yaml: malformed YAML at line 1"),
        (
            "prompts: [{text: a, expected: [{kind: regex, value: '(unclosed'}]}]",
            "suites/my.yaml: prompts[0].expected[0].value: invalid regex",
        ),
        ("prompts: [{text: a, answer: b}]", "suites/my.yaml: prompts[0]: unknown field(s) answer"),
        ("- text: a", "suites/my.yaml: expected a mapping with a `prompts` list"),
    ],
)
def test_bad_user_suite_is_a_one_line_error_naming_file_and_field(tmp_path, content, message):
    (tmp_path / "suites").mkdir()
    (tmp_path / "suites" / "my.yaml").write_text(content)
    with pytest.raises(UserError) as err:
        load_workload(["suites/my.yaml"], tmp_path)
    assert str(err.value).startswith(message)
    assert "\n" not in str(err.value)


def test_missing_file_and_unknown_name(tmp_path):
    with pytest.raises(UserError, match=r"^suites/none.yaml: cannot read suite file"):
        load_workload(["suites/none.yaml"], tmp_path)
    with pytest.raises(UserError, match=r"^workload: unknown suite 'poetry'; use one of code, summarize"):
        load_workload(["poetry"], tmp_path)


def test_same_suite_twice_is_a_duplicate_id(tmp_path):
    with pytest.raises(UserError, match="already used in built-in suite code"):
        load_workload(["code", "code"], tmp_path)


@pytest.mark.parametrize(
    "kind, value, text, met",
    [
        ("exact", "42", "  42\n", True),
        ("exact", "42", "42 apples", False),
        ("contains", "42", "the answer is 42.", True),
        ("contains", "42", "forty-two", False),
        ("regex", r"^\s*\{", ' {"a": 1}', True),
        ("regex", r"\d{3}", "12", False),
    ],
)
def test_expectations(kind, value, text, met):
    assert Expectation(kind, value).met_by(text) is met
