"""Chat suites: conversations parsed, rendered with a template, counted against ctx_size, answered
through /v1/chat/completions turn by turn; the report's speedup by turn."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tuner.decisions.route import request_type
from tuner.errors import UserError
from tuner.measurement.failures import TrialFailure
from tuner.measurement.server_process import Completion
from tuner.measurement.workload import (
    BUILTIN_CHAT_TEMPLATES,
    CHAT_SUITES,
    Workload,
    builtin_chat_template,
    load_workload,
    parse_suite,
    render_chat,
    request_key,
    too_long,
)


def suite(*entries) -> str:
    return yaml.safe_dump({"prompts": list(entries)})


def test_a_conversation_is_its_opening_messages_then_user_turns():
    [p] = parse_suite(
        suite(
            {
                "id": "c",
                "messages": [{"role": "system", "content": "S"}, {"role": "user", "content": "U1"}],
                "turns": ["U2", "U3"],
            }
        ),
        "s",
        "s.yaml",
    )
    assert p.chat and p.n_turns == 3 and p.text == "U1"
    assert p.conversation() == [{"role": "system", "content": "S"}, {"role": "user", "content": "U1"}]
    assert [m["content"] for m in p.conversation(["R1", "R2"])] == ["S", "U1", "R1", "U2", "R2", "U3"]
    assert [m["role"] for m in p.conversation(["R1"])] == ["system", "user", "assistant", "user"]


def test_turns_alone_start_with_a_user_message():
    [p] = parse_suite(suite({"turns": ["first", "second"]}), "s", "s.yaml")
    assert p.messages == (("user", "first"),) and p.turns == ("second",) and p.id == "s-1"


@pytest.mark.parametrize(
    "entry, says",
    [
        ({"messages": [{"role": "robot", "content": "x"}]}, "messages[0].role: unknown role 'robot'"),
        ({"messages": [{"role": "system", "content": "x"}]}, "no user turn"),
        ({"text": "x", "turns": ["y"]}, "both text and messages/turns"),
        ({"turns": ["ok", ""]}, "turns[1]: expected a non-empty string"),
        ({"messages": [{"role": "user"}]}, "exactly `role` and `content`"),
    ],
)
def test_bad_conversations_are_one_line_each(entry, says):
    with pytest.raises(UserError) as err:
        parse_suite(suite(entry), "s", "chats.yaml")
    assert says in str(err.value) and "chats.yaml: prompts[0]" in str(err.value)
    assert "\n" not in str(err.value)


def test_the_digest_covers_the_turns():
    one = Workload(tuple(parse_suite(suite({"id": "c", "turns": ["a", "b"]}), "s", "s")))
    two = Workload(tuple(parse_suite(suite({"id": "c", "turns": ["a", "c"]}), "s", "s")))
    assert one.digest() != two.digest() and one.requests_per_pass == 2


def test_built_in_chat_suites_hold_multi_turn_conversations():
    w = load_workload(list(CHAT_SUITES), Path("."))
    assert w.chat and all(p.chat and p.n_turns >= 3 for p in w.prompts)
    assert {p.suite for p in w.prompts} == set(CHAT_SUITES)
    assert all(len([p for p in w.prompts if p.suite == s]) >= 3 for s in CHAT_SUITES)  # a held-out split


def test_the_gemma_template_renders_as_gemma_and_refuses_a_broken_order():
    template = builtin_chat_template("gemma").read_text()
    text = render_chat(
        template,
        [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello"},
            {"role": "user", "content": "Again"},
        ],
    )
    assert text == (
        "<start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\nHello<end_of_turn>\n"
        "<start_of_turn>user\nAgain<end_of_turn>\n<start_of_turn>model\n"
    )
    with pytest.raises(UserError, match="roles must alternate"):
        render_chat(template, [{"role": "assistant", "content": "x"}])
    assert set(BUILTIN_CHAT_TEMPLATES) == {p.stem for p in builtin_chat_template("gemma").parent.iterdir()}


def test_a_conversation_must_fit_at_its_last_turn_with_its_replies():
    """Three turns of n_predict 50: the last request holds two replies and needs room for a third."""
    [p] = parse_suite(suite({"id": "long", "turns": ["a" * 100, "b" * 100, "c" * 100]}), "s", "s")
    w = Workload((p,))
    count = len  # one token a character: the rendered text's length
    rendered = len(render_chat(None, p.conversation(["", ""])))
    assert too_long(w, rendered + 3 * 50 + 1, 50, count) == []
    [(prompt, tokens)] = too_long(w, rendered + 3 * 50, 50, count)
    assert prompt.id == "long" and tokens == rendered + 2 * 50


def chat_body(content="def f():", **timings):
    t = {"predicted_n": 10, "predicted_ms": 100.0, "predicted_per_second": 100.0, "prompt_n": 5}
    return {
        "choices": [{"message": {"role": "assistant", "content": content}, "finish_reason": "length"}],
        "usage": {"prompt_tokens_details": {"cached_tokens": 7}},
        "timings": {**t, "prompt_ms": 3.0, "draft_n": 4, "draft_n_accepted": 3, **timings},
    }


def test_a_chat_answer_carries_llama_cpp_timings_and_its_text_as_bytes():
    c = Completion.from_chat(chat_body("né"))
    assert (c.predicted_n, c.draft_n, c.draft_n_accepted, c.cached_n) == (10, 4, 3, 7)
    assert c.tokens == tuple("né".encode()) and c.stop_type == "limit"
    with pytest.raises(TrialFailure, match="chat/completions answered HTTP 200 with no result"):
        Completion.from_chat({"choices": []})


def test_request_keys_and_the_router_read_chat_requests():
    assert request_key("p", 0) == request_key("p", 1) == "p" and request_key("p", 3) == "p#3"
    body = {
        "messages": [
            {"role": "user", "content": "Tell me a story"},
            {"role": "assistant", "content": "Once"},
            {"role": "user", "content": "import os\n\ndef walk(path):\n"},
        ]
    }
    assert request_type(body) == "code"
    assert request_type({"prompt": "Summarize this text: ..."}) == "summarize"


def test_repeated_output_counts_words_that_complete_a_run_the_output_already_made():
    from tuner.measurement.quality import repeated_output

    loop = "The series will be a 10-episode series. " * 3  # 7 words, three times
    # 18 four-word runs; from the 8th on each one repeats the run 7 words before it: 11 of 18
    assert repeated_output([loop]) == pytest.approx(11 / 18)
    assert repeated_output(["one two three four five six"]) == 0.0
    assert repeated_output(["too short", ""]) == 0.0


def test_the_report_compares_each_familys_best_with_the_baseline_turn_by_turn():
    import pandas as pd

    from tuner.knobs.config import TrialConfig
    from tuner.output.turns import speedup_by_turn
    from tuner.storage.records import Metrics, TrialRecord

    def record(number, role, config, rates, drafted=0, accepted=0):
        samples = tuple(
            {
                "prompt_id": "c",
                "turn": t,
                "repetition": 0,
                "predicted_n": 100,
                "predicted_ms": 1000 * 100 / r,
                "draft_n": drafted,
                "draft_n_accepted": accepted,
                "prompt_ms": 5.0 * t,
                "cached_n": 10 * (t - 1),
            }
            for t, r in enumerate(rates, start=1)
        )
        return TrialRecord(
            number, "COMPLETE", role, config, metrics=Metrics(sum(rates), 0, 1, 1), samples=samples
        )

    records = [
        record(0, "baseline", TrialConfig(), [100, 100, 100]),
        record(1, "search", TrialConfig(spec_type="ngram-mod", draft_max=8), [110, 150, 200], 10, 8),
        record(2, "search", TrialConfig(spec_type="ngram-simple", draft_max=4), [105, 120, 130], 10, 5),
        record(3, "sentinel", TrialConfig(), [80, 100, 100]),
    ]
    frame = pd.DataFrame(
        [
            {
                "trial": r.number,
                "family": r.config.family,
                "feasible": True,
                "tokens_per_second": sum(s["predicted_n"] * 1000 / s["predicted_ms"] for s in r.samples),
                "method": r.config.spec_type,
            }
            for r in records
        ]
    )
    table = speedup_by_turn(records, frame)
    assert list(table["trial"]) == [1, 1, 1] and list(table["turn"]) == [1, 2, 3]  # lookup's best: trial 1
    assert list(table["baseline_tokens_per_second"]) == [90, 100, 100]  # median of baseline and sentinel
    assert [round(x, 3) for x in table["speedup"]] == [round(110 / 90, 3), 1.5, 2.0]
    assert list(table["acceptance"]) == [0.8] * 3 and list(table["cached_tokens"]) == [0, 10, 20]
