"""Which content type a request is: ``content_type(text)``, for a proxy or client in front of a router.

Why: ``tuner export --per-type`` serves one configuration per content type behind one
llama-server router; the request's ``model`` field picks it. Traffic that mixes types
needs someone to pick, and the research suggests content marks do: code, JSON shape,
arithmetic, long passages, prose. This is that pick as a small, pure function (no
proxy server): call it on the prompt, then send the request to ``STUDY-TYPE`` if that
section exists, else to ``STUDY`` (the pooled winner).

The rules, first match wins (each name is a built-in suite of ``tuner.measurement.workload``, ``agent``
that of ``chat-agent``):

- ``agent``: a tool's output handed back to the model: a line starting ``Tool NAME(...) returned:``,
  ``Observation:`` (ReAct) or ``<tool_response>``; in a chat request, also any message of role ``tool``
  or an assistant message carrying ``tool_calls`` (the OpenAI tool-call shape);
- ``json``: JSON asked for or shown: ``JSON:``/``as a JSON``/``json.dumps``, an object
  with a quoted key (``{"name":``), or a text ending in an open ``{`` or ``[``;
- ``math``: a ``Q:`` with digits and an arithmetic word or sign, or a Python ``>>>``
  expression (an evaluation, not a program);
- ``code-edit``: code marks (as ``code``) and an unindented line that asks to change it,
  starting with an editing verb (``Change``, ``Edit``, ``Modify``, ``Rename``, ``Rewrite``,
  ``Update``, ``Refactor``, ``Fix``, ``Replace``) and a word;
- ``code``: code marks: a line starting ``def``/``class``/``import``/``from .. import``/
  ``#include``, a docstring quote, several indented lines ending in ``:`` or ``)``, or
  braces together with semicolons;
- ``docqa``: a long passage (as ``summarize``) with a line starting ``Question:``;
- ``summarize``: an ask to summarize, or a long passage (at least 5 lines or 350 characters);
- ``prose``: everything else.

Its accuracy on the built-in suites' prompts is ``accuracy()`` (printed by
``tuner export --per-type``, asserted in tests/test_per_type.py). Heuristics misfire on
prompts unlike these: measure on your own traffic before relying on it.
"""

from __future__ import annotations

import re
from pathlib import Path

from tuner.measurement.workload import RAW_SUITES, load_workload

_JSON = re.compile(r"\bJSON\s*:|\bas an? JSON\b|\bjson\.(dumps|loads)\b|\{\s*\"[^\"\n]+\"\s*:", re.IGNORECASE)
_MATH_WORDS = re.compile(
    r"[-+*/=]|\b(plus|minus|times|divided|sum|how many|how much|next|number)\b", re.IGNORECASE
)
_CODE_LINE = re.compile(r"^\s*(def |class |import |from \S+ import |#include|async def |@\w+)", re.MULTILINE)
_SUMMARIZE = re.compile(r"\bsummar(y|ize|ise)\b|\btl;?dr\b", re.IGNORECASE)
_EDIT = re.compile(r"^(Change|Edit|Modify|Rename|Rewrite|Update|Refactor|Fix|Replace) \w", re.MULTILINE)
_QUESTION = re.compile(r"^\s*Question:", re.MULTILINE)
_TOOL_OUTPUT = re.compile(r"^\s*(Tool \w+\(.*\) returned:|Observation:|<tool_response>)", re.MULTILINE)


def content_type(text: str) -> str:
    """One of the built-in suite names (``agent`` for ``chat-agent``): agent, json, math, code-edit, code, docqa,
    summarize or prose."""
    if _TOOL_OUTPUT.search(text):
        return "agent"
    stripped = text.strip()
    if _JSON.search(text) or stripped.endswith(("{", "[")):
        return "json"
    if stripped.startswith(">>>") or (
        re.search(r"^\s*Q:", text, re.MULTILINE) and re.search(r"\d", text) and _MATH_WORDS.search(text)
    ):
        return "math"
    lines = text.splitlines()
    indented_code = sum(
        1 for line in lines if line.startswith(("    ", "\t")) and line.rstrip().endswith((":", ")"))
    )
    if (
        _CODE_LINE.search(text)
        or '"""' in text
        or indented_code >= 2
        or ("{" in text and "}" in text and text.count(";") >= 2)
    ):
        return "code-edit" if _EDIT.search(text) else "code"
    long_passage = len([line for line in lines if line.strip()]) >= 5 or len(stripped) >= 350
    if long_passage and _QUESTION.search(text):
        return "docqa"
    if _SUMMARIZE.search(text) or long_passage:
        return "summarize"
    return "prose"


def section_name(name: str) -> str:
    """A preset section (router model) name: ``name`` with what an INI section cannot hold replaced; here, with
    the classifier, because a type's section is ``section_name(STUDY-TYPE)``."""
    return re.sub(r"[^A-Za-z0-9_.-]", "-", name)


def request_type(body: dict) -> str:
    """The content type of a request body: ``/completion``'s ``prompt``, or an OpenAI chat request's
    last user message (what this turn asks for; the earlier turns are context); a chat that hands a tool's result
    back (a ``tool`` message, an assistant's ``tool_calls``) is ``agent`` whatever its last message says."""
    messages = body.get("messages")
    if isinstance(messages, list):
        if any(isinstance(m, dict) and (m.get("role") == "tool" or m.get("tool_calls")) for m in messages):
            return "agent"
        users = [m.get("content") for m in messages if isinstance(m, dict) and m.get("role") == "user"]
        text = users[-1] if users and isinstance(users[-1], str) else ""
    else:
        prompt = body.get("prompt")
        text = prompt if isinstance(prompt, str) else ""
    return content_type(text)


def accuracy(suites: tuple[str, ...] = RAW_SUITES) -> tuple[int, int, list[tuple[str, str, str]]]:
    """(correct, total, misses as (prompt id, its suite, the guess)) over the built-in suites' prompts."""
    workload = load_workload(list(suites), base_dir=Path("."))
    misses = [(p.id, p.suite, guess) for p in workload.prompts if (guess := content_type(p.text)) != p.suite]
    return len(workload.prompts) - len(misses), len(workload.prompts), misses


def describe_accuracy() -> str:
    correct, total, misses = accuracy()
    text = (
        f"tuner.decisions.route.content_type: {correct} of {total} built-in prompts classified as their suite"
    )
    return text + (
        "" if not misses else "; missed: " + ", ".join(f"{i} ({s} taken for {g})" for i, s, g in misses)
    )
