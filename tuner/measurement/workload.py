"""The prompts a trial measures: built-in suites and user suites, all in one YAML format.

A suite file looks like::

    description: what the suite is for   # optional
    prompts:
      - id: add            # optional, defaults to SUITE-N; unique across the workload
        text: "Q: What is 40 + 2?\\nA:"
        expected:          # optional; used by the answer-quality scorer
          - {kind: contains, value: "42"}

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

BUILTIN_SUITES = ("code", "summarize", "prose", "math", "json")
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
    id: str
    suite: str
    text: str
    expected: tuple[Expectation, ...] = ()
    source: str = field(default="", compare=False)  # where it is defined, e.g. "long.yaml: prompts[0]"


@dataclass(frozen=True)
class Workload:
    prompts: tuple[Prompt, ...]

    @property
    def suites(self) -> tuple[str, ...]:
        """Suite names in the order they were given."""
        return tuple(dict.fromkeys(p.suite for p in self.prompts))

    def digest(self) -> str:
        """A hash of what is measured and scored: suites, ids, texts and expected answers.
        An edited prompt file changes it, so a resumed study can refuse to mix the two."""
        payload = [[p.suite, p.id, p.text, [[e.kind, e.value] for e in p.expected]] for p in self.prompts]
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
    unknown = sorted(set(item) - {"id", "text", "expected"})
    if unknown:
        raise UserError(f"{where}: unknown field(s) {', '.join(map(str, unknown))}; use id, text, expected")
    text = item.get("text")
    if not isinstance(text, str) or not text.strip():
        raise UserError(f"{where}.text: missing or empty; every prompt needs its text")
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
    )


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


def too_long(workload: Workload, ctx_size: int, n_predict: int, count_tokens) -> list[tuple[Prompt, int]]:
    """(prompt, its tokens) for every prompt that does not leave room for ``n_predict`` tokens in
    ``ctx_size`` (llama-server refuses a prompt that fills its context, and stops generating one token
    short of it). Only prompts long enough in bytes to possibly not fit are tokenized (``count_tokens``)."""
    found = []
    for prompt in workload.prompts:
        if len(prompt.text.encode()) + TOKENS_PER_BYTE_SLACK + n_predict + 1 <= ctx_size:
            continue
        tokens = count_tokens(prompt.text)
        if tokens + n_predict + 1 > ctx_size:
            found.append((prompt, tokens))
    return found


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
