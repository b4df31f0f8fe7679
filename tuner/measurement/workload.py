"""The prompts a trial measures: built-in suites and user suites, all in one YAML format.

A suite file looks like::

    description: what the suite is for   # optional
    prompts:
      - id: add            # optional, defaults to SUITE-N; unique across the workload
        text: "Q: What is 40 + 2?\\nA:"
        expected:          # optional; used by the answer-quality scorer
          - {kind: contains, value: "42"}
      - id: fix-then-extend  # a chat entry: measured through /v1/chat/completions and the target's template
        messages:            # the conversation so far (system, user, assistant), ending with a user message
          - {role: system, content: "You are a careful Python reviewer."}
          - {role: user, content: "Write a function that parses a date."}
        turns:               # later user turns: each is sent with the earlier turns and this launch's replies
          - "It fails on 2024-02-30. Fix it."
          - "Now accept times too."

An entry holds ``text`` (a raw prompt to ``/completion``, the prompt cache off) or a conversation
(``messages`` and/or ``turns``; ``turns`` alone starts with a user message). A conversation is
measured turn by turn, as llama.cpp's own speed_bench does: each turn appends the user's message,
asks the server (prompt cache on, as a server that keeps its cache serves it), and appends the reply
it gave, so turn 2 and 3 measure speculation on text the conversation already holds.

Which suite suits which knob matters: prompt-lookup drafting only helps where the
output copies the input (summarization), a draft model only where it predicts the
target well (code, for the built-in synthetic family), and only prompts with expected
answers can score a temperature search.

Tuning and held-out prompts (``split``): a per-content-type winner is picked on some of a
type's prompts and checked on the others, so a winner that only fits the prompts it was
picked on shows up. The rule is positional and deterministic: the last
``max(HELD_OUT_MIN, n // 3)`` prompts of each suite, in the suite file's order, are held
out; the rest tune. A suite with fewer than ``SPLIT_MIN_PROMPTS`` prompts has no split
(it cannot keep one tuning prompt and two held-out ones), and gets no per-type entry.
"""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

import yaml

from tuner.errors import UserError

# raw prompts to /completion
RAW_SUITES = ("code", "summarize", "prose", "math", "json", "docqa", "code-edit")
CHAT_SUITES = ("chat-code", "chat-summarize", "chat-agent")  # multi-turn conversations
BUILTIN_SUITES = RAW_SUITES + CHAT_SUITES
ROLES = ("system", "user", "assistant")
# Chat templates the tuner ships (tuner/data/chat_templates/NAME.jinja), for targets whose GGUF has none.
BUILTIN_CHAT_TEMPLATES = ("gemma", "chatml")
EXPECTATION_KINDS = ("exact", "regex", "contains")
HELD_OUT_MIN = 2  # held-out prompts per suite, at least
SPLIT_MIN_PROMPTS = HELD_OUT_MIN + 1  # a suite needs one tuning prompt besides them


@dataclass(frozen=True)
class Expectation:
    """One condition on a completion's text."""

    kind: str  # "exact": equal after stripping whitespace; "regex": re.search; "contains": substring
    value: str

    def met_by(self, text: str) -> bool:
        if self.kind == "exact":
            return text.strip() == self.value.strip()
        if self.kind == "regex":
            return re.search(self.value, text) is not None
        return self.value in text


@dataclass(frozen=True)
class Prompt:
    """One entry of a suite: a raw prompt (``text``), or a conversation (``messages`` then ``turns``).

    For a conversation ``text`` is its first request's user message (what the content-type classifier
    reads); ``messages`` are (role, content) pairs ending with a user message."""

    id: str
    suite: str
    text: str
    expected: tuple[Expectation, ...] = ()
    source: str = field(default="", compare=False)  # where it is defined, e.g. "long.yaml: prompts[0]"
    messages: tuple[tuple[str, str], ...] = ()
    turns: tuple[str, ...] = ()

    @property
    def chat(self) -> bool:
        """Measured through /v1/chat/completions with the target's chat template."""
        return bool(self.messages)

    @property
    def n_turns(self) -> int:
        """Requests one measurement of this entry makes."""
        return 1 + len(self.turns)

    def conversation(self, replies: tuple[str, ...] | list[str] = ()) -> list[dict[str, str]]:
        """The messages of request ``len(replies) + 1``: the opening messages, then each earlier
        reply and the user turn that followed it (OpenAI's ``messages`` list)."""
        out = [{"role": r, "content": c} for r, c in self.messages]
        for reply, turn in zip(replies, self.turns):
            out += [{"role": "assistant", "content": reply}, {"role": "user", "content": turn}]
        return out


def builtin_chat_template(name: str) -> Path:
    """The file of a built-in chat template."""
    return Path(str(resources.files("tuner") / "data" / "chat_templates" / f"{name}.jinja"))


def request_key(prompt_id: str, turn: int) -> str:
    """One request's key among a trial's requests: the prompt id, and its turn from the second on."""
    return prompt_id if turn <= 1 else f"{prompt_id}#{turn}"


@dataclass(frozen=True)
class Workload:
    prompts: tuple[Prompt, ...]

    @property
    def chat(self) -> bool:
        """Some entry is a conversation: the server needs a chat template."""
        return any(p.chat for p in self.prompts)

    @property
    def requests_per_pass(self) -> int:
        return sum(p.n_turns for p in self.prompts)

    @property
    def suites(self) -> tuple[str, ...]:
        """Suite names in the order they were given."""
        return tuple(dict.fromkeys(p.suite for p in self.prompts))

    def digest(self) -> str:
        """A hash of what is measured and scored: suites, ids, texts and expected answers.
        An edited prompt file changes it, so a resumed study can refuse to mix the two."""
        payload = [
            [p.suite, p.id, p.text, [[e.kind, e.value] for e in p.expected]]
            + ([[list(m) for m in p.messages], list(p.turns)] if p.chat else [])
            for p in self.prompts
        ]
        return hashlib.sha256(json.dumps(payload).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Split:
    """One suite's prompt ids: those a per-type winner is picked on, and those it is checked on."""

    suite: str
    tuning: tuple[str, ...]
    held_out: tuple[str, ...]


def split(workload: Workload) -> tuple[dict[str, Split], dict[str, str]]:
    """(suite -> Split for every suite that can be split, suite -> why not for the others).

    Deterministic: the last ``max(HELD_OUT_MIN, n // 3)`` prompts of a suite of n prompts,
    in their order in the workload, are held out."""
    splits: dict[str, Split] = {}
    unsplit: dict[str, str] = {}
    for suite in workload.suites:
        ids = [p.id for p in workload.prompts if p.suite == suite]
        if len(ids) < SPLIT_MIN_PROMPTS:
            unsplit[suite] = (
                f"{len(ids)} prompt(s); a per-type winner needs at least {SPLIT_MIN_PROMPTS} "
                f"({HELD_OUT_MIN} held out, 1 to tune on)"
            )
            continue
        n_held = max(HELD_OUT_MIN, len(ids) // 3)
        splits[suite] = Split(suite, tuple(ids[:-n_held]), tuple(ids[-n_held:]))
    return splits, unsplit


def restrict(workload: Workload, prompt_ids: tuple[str, ...] | list[str] | set[str]) -> Workload:
    """The workload's prompts whose id is in ``prompt_ids``, in the workload's order."""
    keep = set(prompt_ids)
    return Workload(tuple(p for p in workload.prompts if p.id in keep))


def load_workload(suites: list[str], base_dir: Path) -> Workload:
    """Load suites by built-in name or by path (relative to ``base_dir``, the study file's folder)."""
    if not suites:
        raise UserError(
            "workload: no suites given; use any of " + ", ".join(BUILTIN_SUITES) + " or a suite file"
        )
    prompts: list[Prompt] = []
    seen: dict[str, str] = {}  # prompt id -> where it was defined
    for entry in suites:
        if not isinstance(entry, str):
            raise UserError(f"workload: suite {entry!r} is not a name or a path; quote it as a string")
        if entry in BUILTIN_SUITES:
            where = f"built-in suite {entry}"
            text = (resources.files("tuner") / "data" / "workloads" / f"{entry}.yaml").read_text()
            suite_prompts = parse_suite(text, suite=entry, where=where)
        else:
            path = Path(base_dir) / entry
            if path.suffix not in (".yaml", ".yml") and not path.exists():
                raise UserError(
                    f"workload: unknown suite '{entry}'; use one of {', '.join(BUILTIN_SUITES)} "
                    "or a path to a suite YAML file"
                )
            try:
                text = path.read_text()
            except OSError as err:
                raise UserError(
                    f"{entry}: cannot read suite file ({err.strerror}; relative to {base_dir})"
                ) from err
            except UnicodeDecodeError as err:
                raise UserError(
                    f"{entry}: not a text file (no UTF-8 at byte {err.start}); pass a suite YAML file"
                ) from None
            where = entry
            suite_prompts = parse_suite(text, suite=path.stem, where=where)
        for prompt in suite_prompts:
            if prompt.id in seen:
                raise UserError(
                    f"{where}: prompt id '{prompt.id}' is already used in {seen[prompt.id]}; ids must be unique"
                )
            seen[prompt.id] = where
        prompts.extend(suite_prompts)
    return Workload(prompts=tuple(prompts))


def parse_suite(text: str, suite: str, where: str) -> list[Prompt]:
    """Validate one suite file's content; every error names ``where`` and the field."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        at = f" at line {mark.line + 1}" if mark else ""
        raise UserError(f"{where}: malformed YAML{at}: {getattr(err, 'problem', None) or err}") from err
    if not isinstance(data, dict) or "prompts" not in data:
        raise UserError(f"{where}: expected a mapping with a `prompts` list")
    unknown = sorted(set(data) - {"prompts", "description"})
    if unknown:
        raise UserError(f"{where}: unknown field(s) {', '.join(unknown)}; use prompts (and description)")
    items = data["prompts"]
    if not isinstance(items, list) or not items:
        raise UserError(f"{where}: prompts: the suite is empty; add at least one prompt with a `text`")
    return [_parse_prompt(item, suite, f"{where}: prompts[{i}]", i) for i, item in enumerate(items)]


def _parse_prompt(item: object, suite: str, where: str, index: int) -> Prompt:
    if not isinstance(item, dict):
        raise UserError(f"{where}: expected a mapping with `text` (and optional `id`, `expected`)")
    unknown = sorted(set(item) - {"id", "text", "expected", "messages", "turns"})
    if unknown:
        raise UserError(
            f"{where}: unknown field(s) {', '.join(map(str, unknown))}; use id, text or messages/turns, expected"
        )
    messages: tuple[tuple[str, str], ...] = ()
    turns: tuple[str, ...] = ()
    if "messages" in item or "turns" in item:
        if "text" in item:
            raise UserError(
                f"{where}: both text and messages/turns; an entry is a raw prompt or a conversation"
            )
        messages, turns = _parse_conversation(item, where)
        text = messages[-1][1]
    else:
        raw_text = item.get("text")
        if not isinstance(raw_text, str) or not raw_text.strip():
            raise UserError(
                f"{where}.text: missing or empty; every prompt needs its text (or messages/turns)"
            )
        text = raw_text
    prompt_id = item.get("id", f"{suite}-{index + 1}")
    if not isinstance(prompt_id, str) or not prompt_id:
        raise UserError(f"{where}.id: must be a non-empty string")
    expected = item.get("expected", [])
    if not isinstance(expected, list):
        raise UserError(f"{where}.expected: must be a list of {{kind, value}}")
    return Prompt(
        id=prompt_id,
        suite=suite,
        text=text,
        expected=tuple(_parse_expectation(e, f"{where}.expected[{j}]") for j, e in enumerate(expected)),
        source=where,
        messages=messages,
        turns=turns,
    )


def _parse_conversation(item: dict, where: str) -> tuple[tuple[tuple[str, str], ...], tuple[str, ...]]:
    """(opening messages ending with a user message, later user turns) of a chat entry."""
    raw_messages = item.get("messages", [])
    raw_turns = item.get("turns", [])
    if not isinstance(raw_messages, list) or not isinstance(raw_turns, list):
        raise UserError(f"{where}: messages and turns must be lists")
    messages = []
    for position, message in enumerate(raw_messages):
        at = f"{where}.messages[{position}]"
        if not isinstance(message, dict) or set(message) != {"role", "content"}:
            raise UserError(f"{at}: expected a mapping with exactly `role` and `content`")
        if message["role"] not in ROLES:
            raise UserError(
                f"{at}.role: unknown role {str(message['role'])[:20]!r}; use one of {', '.join(ROLES)}"
            )
        if not isinstance(message["content"], str) or not message["content"].strip():
            raise UserError(f"{at}.content: missing or empty")
        messages.append((message["role"], message["content"]))
    for position, turn in enumerate(raw_turns):
        if not isinstance(turn, str) or not turn.strip():
            raise UserError(f"{where}.turns[{position}]: expected a non-empty string (a user message)")
    turns = list(raw_turns)
    if not messages or messages[-1][0] != "user":
        if not turns:
            raise UserError(
                f"{where}: the conversation has no user turn to answer; end messages with a user one"
            )
        messages.append(("user", turns.pop(0)))
    return tuple(messages), tuple(turns)


def _parse_expectation(item: object, where: str) -> Expectation:
    if not isinstance(item, dict) or set(item) != {"kind", "value"}:
        raise UserError(f"{where}: expected a mapping with exactly `kind` and `value`")
    kind, value = item["kind"], item["value"]
    if kind not in EXPECTATION_KINDS:
        raise UserError(f"{where}.kind: unknown kind '{kind}'; use exact, regex or contains")
    if not isinstance(value, (str, int, float)) or isinstance(value, bool):
        raise UserError(f"{where}.value: must be a string")
    value = str(value)
    if kind == "regex":
        try:
            re.compile(value)
        except re.error as err:
            raise UserError(f"{where}.value: invalid regex ({err})") from err
    return Expectation(kind=kind, value=value)


# A prompt of B UTF-8 bytes is at most B + 3 tokens in any llama.cpp vocabulary: every token
# spells at least one byte (byte fallback), plus BOS, a space prefix and EOS at most.
TOKENS_PER_BYTE_SLACK = 3


def too_long(
    workload: Workload, ctx_size: int, n_predict: int, count_tokens, template: str | None = None
) -> list[tuple[Prompt, int]]:
    """(prompt, its tokens) for every prompt that does not leave room for ``n_predict`` tokens in
    ``ctx_size`` (llama-server refuses a prompt that fills its context, and stops generating one token
    short of it). Only prompts long enough in bytes to possibly not fit are tokenized (``count_tokens``).

    A conversation is counted at its last request, rendered with the chat ``template``, with room for a
    reply of ``n_predict`` tokens after every turn (the earlier replies are in that request's context)."""
    found = []
    for prompt in workload.prompts:
        text = (
            render_chat(template, prompt.conversation([""] * len(prompt.turns)))
            if prompt.chat
            else prompt.text
        )
        room = n_predict * prompt.n_turns
        if len(text.encode()) + TOKENS_PER_BYTE_SLACK + room + 1 <= ctx_size:
            continue
        tokens = count_tokens(text)
        if tokens + room + 1 > ctx_size:
            found.append((prompt, tokens + n_predict * (prompt.n_turns - 1)))
    return found


def render_chat(template: str | None, messages: list[dict[str, str]]) -> str:
    """The text a chat template makes of ``messages`` with the generation prompt, as llama-server's
    ``--jinja`` renders it (Jinja in a sandbox; special tokens as their text, which llama-tokenize
    parses). Without a template, the contents joined: a lower bound."""
    if template is None:
        return "\n".join(m["content"] for m in messages)
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str) -> None:
        raise UserError(f"the chat template refused the conversation: {message}")

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = raise_exception
    try:
        return env.from_string(template).render(
            messages=messages, add_generation_prompt=True, bos_token="", eos_token=""
        )
    except UserError:
        raise
    except Exception as err:  # a template the sandbox cannot render: llama-server would refuse it too
        raise UserError(f"the chat template cannot be rendered ({type(err).__name__}: {err})") from None


def llama_tokenize_count(tokenizer: Path, model: Path, text: str, timeout_s: float = 300.0) -> int:
    """Tokens of ``text`` in ``model``'s own vocabulary, counted as llama-server counts a /completion
    prompt: by llama.cpp's llama-tokenize (vocabulary only, BOS as the model wants, special tokens parsed)."""
    proc = subprocess.run(
        [str(tokenizer), "-m", str(model), "--stdin", "--ids", "--log-disable"],
        input=text.encode(),
        capture_output=True,
        timeout=timeout_s,
    )
    lines = proc.stdout.decode(errors="replace").strip().splitlines()
    try:
        if proc.returncode != 0:
            raise ValueError(proc.returncode)
        return len(json.loads(lines[-1]))
    except (ValueError, IndexError):
        tail = (proc.stderr.decode(errors="replace").strip().splitlines() or ["no output"])[-1]
        raise UserError(
            f"{tokenizer}: cannot count the tokens of a prompt with {model.name} ({tail}); "
            "check the build (`make llama`)"
        ) from None
