"""`tuner workload import`: request logs become suite files; bad input is one line and writes nothing."""

from __future__ import annotations

import json
import re
import time
from collections import Counter
from pathlib import Path

import pytest
import yaml

from tuner.cli import main
from tuner.errors import UserError
from tuner.measurement.workload import SPLIT_MIN_PROMPTS, parse_suite
from tuner.workload_import import allocate

SECRET = "TOP-SECRET-PAYROLL " + "the quarterly salary of every engineer is listed below " * 20
SAFE = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_")


def check_suite(path: Path) -> list[dict]:
    """The prompts of a written suite, as written, once the tuner's own reader accepts the file; ids made
    of letters, digits, '-' and '_', conversations ending with a user message."""
    prompts = parse_suite(path.read_text(), suite=path.stem, where=path.name)
    assert all(set(p.id) <= SAFE for p in prompts)
    assert all(p.chat and p.messages[-1][0] == "user" for p in prompts)
    return yaml.safe_load(path.read_text())["prompts"]


def jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def run(capsys, *argv) -> tuple[int, str, str]:
    code = main(["workload", "import", *map(str, argv)])
    out, err = capsys.readouterr()
    return code, out, err


def chat(*pairs, **extra) -> dict:
    return {"messages": [{"role": r, "content": c} for r, c in pairs], **extra}


# ------------------------------------------------------------------ the formats


def test_openai_requests_become_messages_and_later_user_turns(tmp_path, capsys):
    log = jsonl(
        tmp_path / "log.jsonl",
        [
            chat(
                ("system", "Be terse."),
                ("user", "Tell me about cats."),
                ("assistant", "LOGGED REPLY ONE"),
                ("user", [{"type": "text", "text": "And dogs?"}, {"type": "text", "text": "Briefly."}]),
                ("assistant", "LOGGED REPLY TWO"),
                ("user", "Thanks, and birds?"),
                model="m",
                temperature=0.2,
            ),
            "",
            chat(("developer", "Answer in French."), ("user", "Bonjour?"), id="chatcmpl-9/x"),
        ],
    )
    code, out, err = run(capsys, log, "--out", tmp_path / "suites" / "mine.yaml")
    assert (code, err) == (0, "")
    prompts = check_suite(tmp_path / "suites" / "mine.yaml")
    assert prompts == [
        {
            "id": "mine-line-1",
            "messages": [
                {"role": "system", "content": "Be terse."},
                {"role": "user", "content": "Tell me about cats."},
            ],
            "turns": ["And dogs?\nBriefly.", "Thanks, and birds?"],
        },
        {
            "id": "chatcmpl-9-x",
            "messages": [
                {"role": "system", "content": "Answer in French."},
                {"role": "user", "content": "Bonjour?"},
            ],
        },
    ]
    assert "LOGGED REPLY" not in (tmp_path / "suites" / "mine.yaml").read_text()
    assert out.splitlines()[0] == f"read {log}: 2 conversation(s) (openai 2); skipped blank line (1)"
    assert f"wrote {tmp_path / 'suites' / 'mine.yaml'} (2 prompt(s))" in out


def test_batch_lines_keep_their_custom_id_and_skip_other_endpoints(tmp_path, capsys):
    body = chat(("user", "def add(a, b):\n    return a + b\n# explain"), ("assistant", "adds"))
    log = jsonl(
        tmp_path / "batch.jsonl",
        [
            {
                "custom_id": "req-1",
                "method": "POST",
                "url": "/v1/chat/completions",
                "body": {**body, "model": "m"},
            },
            {"custom_id": "req-2", "method": "POST", "url": "/v1/embeddings", "body": {"input": "x"}},
            {"custom_id": "req-1", "method": "POST", "url": "/v1/chat/completions", "body": body},
            {"custom_id": "req-3", "response": {"status_code": 200}},
        ],
    )
    code, out, _ = run(capsys, log, "--out", tmp_path / "b.yaml")
    prompts = check_suite(tmp_path / "b.yaml")
    assert code == 0 and [p["id"] for p in prompts] == [
        "req-1",
        "req-1-b-line-3",
    ]  # a repeated id, made unique
    assert "turns" not in prompts[0]  # the final logged reply is not a turn
    assert out.splitlines()[0].endswith(
        "(openai-batch 2); skipped batch request to /v1/embeddings (1), batch response (output file), not a request (1)"
    )
    assert "code 2/2" in out.splitlines()[1]  # classified by route.content_type


def test_sharegpt_conversations_and_a_json_array(tmp_path, capsys):
    rows = [
        {
            "id": "sg 7",
            "conversations": [
                {"from": "system", "value": "You are kind."},
                {"from": "human", "value": "Q: What is 2 + 3?\nA:"},
                {"from": "gpt", "value": "5"},
                {"from": "human", "value": "And 4 + 4?"},
                {"from": "gpt", "value": "8"},
            ],
        },
        {"conversations": [{"from": "human", "value": "Hello there"}]},
    ]
    array = tmp_path / "share.json"
    array.write_text(json.dumps(rows, indent=2))
    code, out, _ = run(capsys, array, "--out", tmp_path / "s.yaml")
    assert code == 0
    assert check_suite(tmp_path / "s.yaml") == [
        {
            "id": "sg-7",
            "messages": [
                {"role": "system", "content": "You are kind."},
                {"role": "user", "content": "Q: What is 2 + 3?\nA:"},
            ],
            "turns": ["And 4 + 4?"],
        },
        {"id": "s-item-2", "messages": [{"role": "user", "content": "Hello there"}]},
    ]
    assert "(sharegpt 2)" in out and "math 1/1, prose 1/1" in out


def test_speed_bench_rows_keep_their_category_and_every_turn(tmp_path, capsys):
    log = jsonl(
        tmp_path / "speed.jsonl",
        [
            {
                "question_id": 81,
                "category": "writing",
                "turns": ["Write a blog post.", "Rewrite it in verse."],
            },
            {"question_id": 101, "category": "coding", "turns": ["Reverse a list."]},
        ],
    )
    code, out, _ = run(capsys, log, "--out", tmp_path / "sb.yaml", "--by-type")
    assert code == 0
    assert check_suite(tmp_path / "sb-writing.yaml") == [
        {
            "id": "81",
            "messages": [{"role": "user", "content": "Write a blog post."}],
            "turns": ["Rewrite it in verse."],
        }
    ]
    assert [p["id"] for p in check_suite(tmp_path / "sb-coding.yaml")] == ["101"]
    assert not (tmp_path / "sb.yaml").exists()
    assert "note: sb-coding: 1 prompt(s), fewer than 3" in out and "no per-type winner" in out


def test_a_re_import_by_type_removes_the_types_it_no_longer_finds_and_nothing_else(tmp_path, capsys):
    rows = [
        {"question_id": 81, "category": "writing", "turns": ["Write a blog post."]},
        {"question_id": 101, "category": "coding", "turns": ["Reverse a list."]},
    ]
    first = jsonl(tmp_path / "a.jsonl", rows)
    assert run(capsys, first, "--out", tmp_path / "sb.yaml", "--by-type")[0] == 0
    mine = tmp_path / "sb-mine.yaml"
    mine.write_text("prompts:\n  - id: x\n    text: my own suite\n")  # the operator's own file
    second = jsonl(tmp_path / "b.jsonl", rows[1:])  # writing is gone from the log
    code, out, _ = run(capsys, second, "--out", tmp_path / "sb.yaml", "--by-type")
    assert code == 0 and not (tmp_path / "sb-writing.yaml").exists()
    assert f"removed {tmp_path / 'sb-writing.yaml'}" in out
    assert (tmp_path / "sb-coding.yaml").exists() and mine.read_text().endswith("my own suite\n")


def test_by_type_writes_the_quoting_types_docqa_and_code_edit(tmp_path, capsys):
    """A question about a passage and an instruction to edit a function land in suites of their own."""
    passage = "The cache keeps the last hundred answers of the service.\n" * 6
    rows = [
        chat(("user", passage + "\nQuestion: How many answers does the cache keep?\nAnswer:")),
        chat(("user", "def area(w, h):\n    return w * h\n\nRename w to width. Write the whole function.\n")),
        chat(("user", "def area(w, h):\n")),
    ]
    code, _, _ = run(capsys, jsonl(tmp_path / "log.jsonl", rows), "--out", tmp_path / "t.yaml", "--by-type")
    assert code == 0
    written = {path.name for path in tmp_path.glob("t-*.yaml")}
    assert written == {"t-docqa.yaml", "t-code-edit.yaml", "t-code.yaml"}
    assert [p["messages"][0]["content"][:4] for p in check_suite(tmp_path / "t-code-edit.yaml")] == ["def "]


def test_texts_survive_the_yaml_round_trip(tmp_path, capsys):
    """Literal blocks for multi-line texts, quoting where YAML needs it: every text reads back as logged."""
    texts = [
        "line one\nline two\n",
        "  leading spaces\nthen\n\n\n",
        "trailing spaces   \nnext",
        "tabs\there\n\tand there",
        "windows\r\nline ends",
        "- looks: like yaml\n# and a comment",
        "unicode: héllo ✓ 日本",
        "'quotes' and \"double\" and \\backslash",
        "null",
        "123",
    ]
    log = jsonl(tmp_path / "t.jsonl", [chat(("user", t)) for t in texts])
    assert run(capsys, log, "--out", tmp_path / "t.yaml")[0] == 0
    assert [p["messages"][0]["content"] for p in check_suite(tmp_path / "t.yaml")] == texts


# ------------------------------------------------------------------ bad input: one line, nothing written


BAD = [
    (
        "not-json",
        [chat(("user", "fine")), "{oops"],
        "line 2: not JSON (Expecting property name enclosed in double quotes",
    ),
    (
        "no-user",
        [chat(("system", "x"), ("assistant", "y"))],
        "line 1: a conversation without a user message; each row needs one to replay",
    ),
    (
        "unknown-role",
        [chat(("user", "hi"), ("tool", "42"))],
        "line 1: messages[1].role: unknown role 'tool'; use system, user or assistant",
    ),
    (
        "sharegpt-role",
        [{"conversations": [{"from": "observation", "value": "x"}]}],
        "line 1: conversations[0].from: unknown role 'observation'; use human, gpt or system",
    ),
    (
        "list-role",
        [{"messages": [{"role": ["user"], "content": "x"}]}],
        "line 1: messages[0].role: unknown role \"['user']\"; use system, user or assistant",
    ),
    (
        "image-part",
        [chat(("user", [{"type": "text", "text": "see"}, {"type": "image_url", "image_url": {"url": "x"}}]))],
        "line 1: messages[0].content[1]: a part of type 'image_url'; only text parts",
    ),
    (
        "late-system",
        [chat(("user", "a"), ("assistant", "b"), ("system", "c"), ("user", "d"))],
        "line 1: messages[2]: a system message after the first user message; put system messages first",
    ),
    (
        "no-rows",
        [{"foo": 1}, "", {"prompt": "x"}, {"custom_id": "e", "url": "/v1/embeddings", "body": {}}],
        "no usable rows (4 line(s) skipped: batch request to /v1/embeddings (1), blank line (1), completion "
        "request (prompt, not messages) (1), not a chat request, ShareGPT conversation or SPEED-Bench row (1))",
    ),
    ("empty", [], "no usable rows (0 line(s) skipped: an empty file)"),
]


@pytest.mark.parametrize("lines, expected", [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_bad_input_is_one_line_and_writes_nothing(tmp_path, capsys, lines, expected):
    log = jsonl(tmp_path / "log.jsonl", lines)
    (tmp_path / "suites").mkdir()
    kept = tmp_path / "suites" / "old.yaml"
    kept.write_text("prompts: [{id: a, text: b}]\n")  # an earlier import, to be left as it was
    code, out, err = run(capsys, log, "--out", kept, "--by-type")
    assert code == 2 and out == ""
    assert err.startswith(f"tuner workload: error: {log}: {expected}") and err.count("\n") == 1, err
    assert sorted(p.name for p in (tmp_path / "suites").iterdir()) == ["old.yaml"]
    assert kept.read_text() == "prompts: [{id: a, text: b}]\n"


def test_a_bad_line_after_good_ones_writes_nothing(tmp_path, capsys):
    log = jsonl(tmp_path / "log.jsonl", [chat(("user", f"question {i}")) for i in range(50)] + ["{truncated"])
    code, _, err = run(capsys, log, "--out", tmp_path / "new" / "s.yaml")
    assert code == 2 and f"{log}: line 51: not JSON" in err
    assert not (tmp_path / "new").exists()


@pytest.mark.parametrize(
    "argv, expected",
    [
        (
            ["missing.jsonl", "--out", "s.yaml"],
            "missing.jsonl: cannot read the traffic file (No such file or directory); pass a JSON-lines log",
        ),
        (["log.jsonl", "--out", "s.txt"], "--out s.txt: name a suite YAML file, e.g. suites/traffic.yaml"),
        (["log.jsonl", "--out", "s.yaml", "--sample", "0"], "--sample: must be at least 1, got 0"),
    ],
)
def test_bad_arguments_are_one_line(tmp_path, capsys, monkeypatch, argv, expected):
    monkeypatch.chdir(tmp_path)
    jsonl(tmp_path / "log.jsonl", [chat(("user", "hi"))])
    code, _, err = run(capsys, *argv)
    assert code == 2 and err == f"tuner workload: error: {expected}\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["log.jsonl"]


def test_not_utf8_is_one_line(tmp_path, capsys):
    (tmp_path / "log.jsonl").write_bytes(b'{"messages": []}\n\xff\xfe')
    code, _, err = run(capsys, tmp_path / "log.jsonl", "--out", tmp_path / "s.yaml")
    assert (
        code == 2
        and err
        == f"tuner workload: error: {tmp_path / 'log.jsonl'}: not UTF-8 text (at byte 17); pass a JSON-lines log\n"
    )


# ------------------------------------------------------------------ sampling


def mixed_log(path: Path, counts: dict[str, int]) -> Path:
    """SPEED-Bench rows of the given categories, interleaved."""
    rows, i = [], 0
    pending = dict(counts)
    while any(pending.values()):
        for kind in counts:
            if pending[kind]:
                pending[kind] -= 1
                i += 1
                rows.append({"question_id": f"q{i}", "category": kind, "turns": [f"{kind} question {i}"]})
    return jsonl(path, rows)


def test_allocation_is_proportional_with_a_floor_for_types_that_can_be_split():
    counts = {"code": 600, "prose": 390, "json": 8, "math": 2}
    keep = allocate(counts, 100)
    assert sum(keep.values()) == 100
    assert keep["json"] == SPLIT_MIN_PROMPTS  # 0.8 by proportion, raised to a splittable suite
    assert keep["math"] == 0  # 0.2 by proportion; 2 rows could never be split anyway
    assert (keep["code"], keep["prose"]) in ((58, 39), (59, 38))
    assert allocate(counts, 2000) == counts
    assert allocate({"a": 3, "b": 3, "c": 3}, 9) == {"a": 3, "b": 3, "c": 3}
    with pytest.raises(
        UserError, match=r"^--sample 8: too few to keep 3 prompts of each of the 3 content types"
    ):
        allocate({"a": 3, "b": 3, "c": 3, "d": 2}, 8)
    for n in range(9, 1000, 37):  # always n in all, never more of a type than it has
        keep = allocate(counts, n)
        assert sum(keep.values()) == n and all(0 <= keep[t] <= counts[t] for t in counts)
        assert all(keep[t] >= SPLIT_MIN_PROMPTS for t in ("code", "prose", "json"))


def test_a_stratified_sample_by_type(tmp_path, capsys):
    log = mixed_log(tmp_path / "sb.jsonl", {"coding": 60, "writing": 36, "math": 4})
    code, out, _ = run(capsys, log, "--out", tmp_path / "s.yaml", "--sample", "20", "--by-type")
    assert code == 0
    written = {t: check_suite(tmp_path / f"s-{t}.yaml") for t in ("coding", "writing", "math")}
    assert {t: len(p) for t, p in written.items()} == {"coding": 11, "writing": 6, "math": 3}
    for kind, prompts in written.items():
        assert all(p["messages"][0]["content"].startswith(kind) for p in prompts)
        numbers = [int(p["id"][1:]) for p in prompts]
        assert numbers == sorted(numbers)  # file order, so the held-out split is the later rows
    assert (
        "kept 20 of 100 (--sample 20, seed 0), per content type: coding 11/60, math 3/4, writing 6/36" in out
    )
    assert "held out: the last max(2, n // 3) prompts" in out and "note:" not in out
    code, _, err = run(capsys, log, "--out", tmp_path / "t.yaml", "--sample", "8")
    assert code == 2 and "--sample 8: too few to keep 3 prompts of each of the 3 content types" in err
    assert "use --sample 9 or more" in err and not (tmp_path / "t.yaml").exists()
    code, out, _ = run(capsys, log, "--out", tmp_path / "all.yaml", "--sample", "500")
    assert code == 0 and len(check_suite(tmp_path / "all.yaml")) == 100
    assert "note: --sample 500 is more than the file holds; kept every conversation" in out


def test_the_same_seed_gives_the_same_bytes(tmp_path, capsys):
    log = mixed_log(tmp_path / "sb.jsonl", {"coding": 40, "writing": 40})
    for name in ("a", "b"):
        assert run(capsys, log, "--out", tmp_path / f"{name}.yaml", "--sample", "10", "--seed", "3")[0] == 0
    assert (tmp_path / "a.yaml").read_bytes() == (tmp_path / "b.yaml").read_bytes()
    run(capsys, log, "--out", tmp_path / "c.yaml", "--sample", "10", "--seed", "4")
    ids = {n: [p["id"] for p in check_suite(tmp_path / f"{n}.yaml")] for n in ("a", "c")}
    assert ids["a"] != ids["c"] and len(ids["c"]) == 10
    full = [p["id"] for p in check_suite(tmp_path / "a.yaml")]
    assert set(full) <= {f"q{i}" for i in range(1, 81)}  # ids come from the source, whatever the sample


# ------------------------------------------------------------------ privacy


def test_prompt_texts_never_reach_the_summary_or_an_error(tmp_path, capsys):
    log = jsonl(tmp_path / "log.jsonl", [chat(("system", SECRET), ("user", SECRET)), {"note": SECRET}])
    code, out, err = run(capsys, log, "--out", tmp_path / "s.yaml")
    assert code == 0 and "PAYROLL" not in out + err and "salary" not in out + err
    for bad in (
        [
            chat(("user", SECRET), ("assistant", SECRET), ("user", SECRET)),
            chat(("user", SECRET), (SECRET, "x")),
        ],
        [chat(("user", [{"type": SECRET, "text": SECRET}]))],
        [SECRET],
        ['{"messages": [{"role": "user", "content": "' + SECRET + '"}'],
        [{"conversations": [{"from": SECRET, "value": SECRET}]}],
    ):
        code, out, err = run(capsys, jsonl(tmp_path / "bad.jsonl", bad), "--out", tmp_path / "x.yaml")
        assert code == 2 and len(err) < 300 and "every engineer" not in out + err, err
        assert SECRET[:41] not in err  # at most a 40-character prefix of anything logged


# ------------------------------------------------------------------ the bar: a real-sized log, quickly


WORDS = "the server answered every request within the budget and the operator was pleased".split()


def openai_log(path: Path, n: int) -> Path:
    """n chat requests: code, JSON, arithmetic, summaries and prose; a third multi-turn; some batch lines."""
    rows = []
    for i in range(n):
        kind = i % 5
        if kind == 0:
            first = f"def handler_{i}(request):\n    return respond(request, {i})\n\nExplain this function."
        elif kind == 1:
            first = f'Return JSON: {{"id": {i}, "name": "item {i}"}} with one more field.'
        elif kind == 2:
            first = f"Q: What is {i} + {i * 3}?\nA:"
        elif kind == 3:
            first = "Summarize this:\n" + "\n".join(" ".join(WORDS[j % 7 :]) for j in range(8))
        else:
            first = f"Tell me something about request {i}."
        pairs = [("system", "You are a helpful assistant."), ("user", first)]
        if i % 3 == 0:
            pairs += [("assistant", "Sure. " * 40), ("user", f"Follow-up {i}: go on.")]
        row = chat(*pairs, model="served")
        if i % 4 == 0:
            row = {"custom_id": f"batch-{i}", "method": "POST", "url": "/v1/chat/completions", "body": row}
        rows.append(row)
    return jsonl(path, rows)


def speed_bench_file(path: Path, n: int) -> Path:
    """n SPEED-Bench-shaped rows: eight categories of two-turn questions, some long."""
    categories = ["coding", "math", "writing", "roleplay", "reasoning", "extraction", "stem", "humanities"]
    rows = [
        {
            "question_id": 100 * c + q,
            "category": category,
            "turns": [
                f"{category} question {q}: " + " ".join(WORDS) * (1 + q % 20),
                f"Now expand on point {q}.",
            ],
        }
        for c, category in enumerate(categories)
        for q in range(n // len(categories))
    ]
    return jsonl(path, rows)


@pytest.mark.parametrize("make, name", [(openai_log, "traffic"), (speed_bench_file, "speed")])
def test_a_thousand_line_log_imports_quickly(tmp_path, capsys, make, name):
    log = make(tmp_path / f"{name}.jsonl", 1000)
    start = time.perf_counter()
    code, out, _ = run(capsys, log, "--out", tmp_path / "suites" / f"{name}.yaml", "--by-type")
    elapsed = time.perf_counter() - start
    assert code == 0
    written = sorted((tmp_path / "suites").glob(f"{name}-*.yaml"))
    prompts = [p for path in written for p in check_suite(path)]
    lines = len(log.read_text().splitlines())
    assert len(prompts) == lines and len({p["id"] for p in prompts}) == lines
    if make is openai_log:
        assert [p.stem for p in written] == [
            f"traffic-{t}" for t in ("code", "json", "math", "prose", "summarize")
        ]
        assert Counter(len(p.get("turns", [])) for p in prompts) == {0: 666, 1: 334}
    start = time.perf_counter()
    run(capsys, log, "--out", tmp_path / "one" / f"{name}.yaml", "--sample", "200")
    sampled = time.perf_counter() - start
    assert len(check_suite(tmp_path / "one" / f"{name}.yaml")) == 200
    print(
        f"\n{name}: {lines} lines, {log.stat().st_size / 1e6:.1f} MB: {elapsed:.2f} s by type, {sampled:.2f} s sampled"
    )
    assert elapsed < 10


# ------------------------------------------------------------------ a study measures what was written


def test_a_study_on_an_imported_suite_passes_check(tmp_path, capsys, synthetic_models):
    openai_log(tmp_path / "traffic.jsonl", 60)
    assert (
        run(capsys, tmp_path / "traffic.jsonl", "--out", tmp_path / "suites" / "t.yaml", "--sample", "15")[0]
        == 0
    )
    study = {
        "name": "imported",
        "target": str(synthetic_models.path("target")),
        "search_space": {"overrides": {"spec_type": "none", "threads": 1}},
        "workload": {"suites": ["suites/t.yaml"], "n_predict": 16},
        "measurement": {"warmup": 0, "repetitions": 1, "ctx_size": 1024, "trial_timeout_s": 60},
        "storage": f"sqlite:///{tmp_path / 'studies.db'}",
        "budget": {"trials": 1},
    }
    (tmp_path / "study.yaml").write_text(yaml.safe_dump(study))
    assert main(["run", str(tmp_path / "study.yaml"), "--check"]) == 0
    checked = capsys.readouterr().out
    assert re.search(r'\bprompts"?:?\s+15\b', checked), (
        checked
    )  # all 15 read, whichever layout --check prints
    assert not (tmp_path / "studies.db").exists()
