"""``tuner workload import``: what an operator served, as prompt-suite files the tuner measures.

Why: the built-in suites are guesses at a server's traffic; a study tuned on the requests it
really serves picks the configuration that pays there. This reads a JSON-lines log (or a JSON
array) of OpenAI chat requests (plain or batch), ShareGPT conversations or SPEED-Bench rows and
writes suite files in ``tuner.measurement.workload``'s format: per conversation, ``messages``
(the conversation up to its first user message) and ``turns`` (the later user messages). The
logged assistant replies are dropped: the tuner generates each reply on the configuration it
measures, as llama.cpp's speed_bench does.

Sampling (``--sample N``) is seeded and stratified by content type (the row's ``category``, else
``tuner.decisions.route.content_type`` of its first user message), with at least
``SPLIT_MIN_PROMPTS`` per type where the type has that many, so each type keeps a held-out split.

Privacy: prompt texts never appear in a message or an error; rows are named by id and line.
"""

from __future__ import annotations

import json
import random
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from tuner.decisions.route import content_type
from tuner.errors import UserError
from tuner.measurement.workload import HELD_OUT_MIN, SPLIT_MIN_PROMPTS
from tuner.output.files import write_atomic

OPENAI_ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}
SHAREGPT_ROLES = {
    "system": "system",
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "assistant": "assistant",
}
CHAT_URL = "/chat/completions"
SOURCE_ID_FIELDS = ("custom_id", "question_id", "id")
MAX_ID_CHARS = 80
SHOWN_CHARS = 40  # at most this much of anything a log holds goes into a message
NOT_A_ROW = "not a chat request, ShareGPT conversation or SPEED-Bench row"


class _Bad(Exception):
    """A row that cannot be imported; the caller adds the file and line."""


@dataclass(frozen=True)
class Row:
    """One conversation to replay: its context, its later user turns, its content type."""

    id: str
    type: str
    messages: tuple[tuple[str, str], ...]  # (role, content), ending with a user message
    turns: tuple[str, ...]
    line: int  # in the source: the line, or the array item

    def entry(self) -> dict:
        entry: dict = {"id": self.id, "messages": [{"role": r, "content": c} for r, c in self.messages]}
        if self.turns:
            entry["turns"] = list(self.turns)
        return entry


@dataclass
class Reading:
    """What a traffic file held: rows in file order, rows per format, lines skipped per reason."""

    rows: list[Row] = field(default_factory=list)
    formats: Counter = field(default_factory=Counter)
    skipped: Counter = field(default_factory=Counter)


def _shown(value: object) -> str:
    text = str(value)
    return repr(text if len(text) <= SHOWN_CHARS else text[:SHOWN_CHARS] + "...")


def safe_id(value: object) -> str:
    """Letters, digits, '-' and '_' only (runs of anything else become one '-'), at most MAX_ID_CHARS."""
    return re.sub(r"[^A-Za-z0-9_-]+", "-", str(value)).strip("-")[:MAX_ID_CHARS].strip("-")


# ------------------------------------------------------------------ reading


def read_traffic(path: Path, name: str) -> Reading:
    """Every row of ``path``; one line per error, naming the file and line, and never a prompt's text."""
    try:
        text = Path(path).read_text(encoding="utf-8-sig")  # a BOM is not a row
    except OSError as err:
        raise UserError(
            f"{path}: cannot read the traffic file ({err.strerror}); pass a JSON-lines log"
        ) from None
    except UnicodeDecodeError as err:
        raise UserError(f"{path}: not UTF-8 text (at byte {err.start}); pass a JSON-lines log") from None
    reading = Reading()
    unit = "item" if text.lstrip().startswith("[") else "line"
    seen: set[str] = set()
    for number, obj in _objects(path, text, unit):
        if obj is None:
            reading.skipped["blank line"] += 1
            continue
        try:
            parsed = _parse(obj)
        except _Bad as err:
            raise UserError(f"{path}: {unit} {number}: {err}") from None
        if isinstance(parsed, str):
            reading.skipped[parsed] += 1
            continue
        fmt, source_id, category, messages, turns = parsed
        row_id = _unique(safe_id(source_id) if source_id is not None else "", f"{name}-{unit}-{number}", seen)
        kind = safe_id(category) if isinstance(category, (str, int)) and safe_id(category) else None
        first_user = next(c for r, c in messages if r == "user")
        reading.rows.append(Row(row_id, kind or content_type(first_user), messages, turns, number))
        reading.formats[fmt] += 1
    return reading


def _objects(path: Path, text: str, unit: str):
    """(number, object or None for a blank line) for a JSON array (items) or JSON lines."""
    if unit == "item":
        try:
            items = json.loads(text)
        except json.JSONDecodeError as err:
            raise UserError(
                f"{path}: line {err.lineno}: not valid JSON ({err.msg} at column {err.colno}); "
                "a file starting with '[' must be one JSON array"
            ) from None
        if not isinstance(items, list):
            raise UserError(f"{path}: expected a JSON array of requests or one JSON object per line")
        yield from enumerate(items, start=1)
        return
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            yield number, None
            continue
        try:
            yield number, json.loads(line)
        except json.JSONDecodeError as err:
            raise UserError(
                f"{path}: line {number}: not JSON ({err.msg} at column {err.colno}); "
                "each line must be one JSON object (a request, conversation or SPEED-Bench row)"
            ) from None


def _unique(source: str, fallback: str, seen: set[str]) -> str:
    candidate = source or fallback
    if candidate in seen:
        candidate = f"{source}-{fallback}" if source else fallback
    while candidate in seen:  # only a log with ids shaped like our fallbacks gets here
        candidate += "-x"
    seen.add(candidate)
    return candidate


def _parse(obj: object):
    """(format, source id, category, messages, turns), or the reason a row is skipped (a str)."""
    if not isinstance(obj, dict):
        return "not a JSON object"
    source_id = next((obj[k] for k in SOURCE_ID_FIELDS if obj.get(k) not in (None, "")), None)
    category = obj.get("category")
    if isinstance(obj.get("body"), dict):
        url = str(obj.get("url", CHAT_URL))
        if not url.rstrip("/").endswith(CHAT_URL):
            return f"batch request to {url[:SHOWN_CHARS]}"
        if "messages" not in obj["body"]:
            return "batch request without messages"
        fmt, pairs = "openai-batch", _openai_messages(obj["body"]["messages"], "body.messages")
    elif "messages" in obj:
        fmt, pairs = "openai", _openai_messages(obj["messages"], "messages")
    elif "conversations" in obj:
        fmt, pairs = "sharegpt", _sharegpt_messages(obj["conversations"])
    elif "turns" in obj:
        user_turns = _speed_bench_turns(obj["turns"])
        return "speed-bench", source_id, category, (("user", user_turns[0]),), tuple(user_turns[1:])
    elif "response" in obj and "custom_id" in obj:
        return "batch response (output file), not a request"
    elif "prompt" in obj:
        return "completion request (prompt, not messages)"
    else:
        return NOT_A_ROW
    if any(role == "user" and not content.strip() for role, content, _ in pairs):
        return "empty user message"
    messages, turns = conversation(pairs)
    return fmt, source_id, category, messages, turns


def _openai_messages(items: object, where: str) -> list[tuple[str, str, str]]:
    """(role, text, where) per message of an OpenAI request."""
    known = "system, user or assistant (tool and function messages are not replayed: leave such requests out of the log)"
    return _messages(items, where, ("role", "content"), OPENAI_ROLES, known)


def _sharegpt_messages(items: object) -> list[tuple[str, str, str]]:
    return _messages(items, "conversations", ("from", "value"), SHAREGPT_ROLES, "human, gpt or system")


def _messages(
    items: object, where: str, keys: tuple[str, str], roles: dict, known: str
) -> list[tuple[str, str, str]]:
    """(role, text, where) per message of a list of mappings, each naming its role and text by ``keys``."""
    role_key, text_key = keys
    if not isinstance(items, list):
        raise _Bad(f"{where}: must be a list of {{{role_key}, {text_key}}}")
    pairs = []
    for index, item in enumerate(items):
        at = f"{where}[{index}]"
        if not isinstance(item, dict):
            raise _Bad(f"{at}: must be a mapping with {role_key} and {text_key}")
        role = roles.get(item.get(role_key)) if isinstance(item.get(role_key), str) else None
        if role is None:
            raise _Bad(f"{at}.{role_key}: unknown role {_shown(item.get(role_key))}; use {known}")
        pairs.append((role, _text(item.get(text_key), f"{at}.{text_key}"), at))
    return pairs


def _speed_bench_turns(turns: object) -> list[str]:
    """A SPEED-Bench row's user turns: the first opens the conversation, each later one follows a reply."""
    if not isinstance(turns, list) or not turns:
        raise _Bad("turns: must be a non-empty list of strings (the user's turns)")
    for index, turn in enumerate(turns):
        if not isinstance(turn, str) or not turn.strip():
            raise _Bad(f"turns[{index}]: must be a non-empty string")
    return turns


def _text(content: object, where: str) -> str:
    """A message's text: a string, or the text parts of a list of parts joined by newlines."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise _Bad(f"{where}: must be a string or a list of text parts")
    texts = []
    for part_index, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind != "text" or not isinstance(part.get("text"), str):
            raise _Bad(
                f"{where}[{part_index}]: a part of type {_shown(kind) if kind else '(none)'}; only text parts "
                '({"type": "text", "text": ...}) can be replayed: leave such requests out of the log'
            )
        texts.append(part["text"])
    return "\n".join(texts)


def conversation(pairs: list[tuple[str, str, str]]) -> tuple[tuple, tuple]:
    """(messages, turns): the conversation up to its first user message(s), then each later run of user
    messages as one turn. Assistant replies after the first user message are dropped (regenerated)."""
    first = next((i for i, (role, _, _) in enumerate(pairs) if role == "user"), None)
    if first is None:
        raise _Bad("a conversation without a user message; each row needs one to replay")
    while first + 1 < len(pairs) and pairs[first + 1][0] == "user":
        first += 1
    messages = tuple((role, text) for role, text, _ in pairs[: first + 1] if role == "user" or text.strip())
    turns: list[str] = []
    pending: list[str] = []
    for role, text, where in pairs[first + 1 :]:
        if role == "system":
            raise _Bad(f"{where}: a system message after the first user message; put system messages first")
        if role == "user":
            pending.append(text)
        elif pending:
            turns.append("\n\n".join(pending))
            pending = []
    if pending:
        turns.append("\n\n".join(pending))
    return messages, tuple(turns)


# ------------------------------------------------------------------ sampling


def allocate(counts: dict[str, int], sample_size: int) -> dict[str, int]:
    """Rows to keep per type, summing to ``min(sample_size, total)``: in proportion to ``counts`` (largest
    remainders), and at least ``SPLIT_MIN_PROMPTS`` for every type that has that many, so each keeps a held-out split.
    Deterministic: ties go to the first type name."""
    total = sum(counts.values())
    if sample_size >= total:
        return dict(counts)
    floor = {t: SPLIT_MIN_PROMPTS if c >= SPLIT_MIN_PROMPTS else 0 for t, c in counts.items()}
    if sum(floor.values()) > sample_size:
        raise UserError(
            f"--sample {sample_size}: too few to keep {SPLIT_MIN_PROMPTS} prompts of each of the {sum(map(bool, floor.values()))} content "
            f"types that have that many; use --sample {sum(floor.values())} or more"
        )
    quota = {t: sample_size * c / total for t, c in counts.items()}
    keep = {t: min(counts[t], max(floor[t], int(quota[t]))) for t in counts}
    while sum(keep.values()) < sample_size:
        short = min((t for t in counts if keep[t] < counts[t]), key=lambda t: (keep[t] - quota[t], t))
        keep[short] += 1
    while sum(keep.values()) > sample_size:
        over = min((t for t in counts if keep[t] > floor[t]), key=lambda t: (quota[t] - keep[t], t))
        keep[over] -= 1
    return keep


def sample(rows: list[Row], sample_size: int | None, seed: int) -> list[Row]:
    """``sample_size`` rows, stratified by type (``allocate``), drawn with ``seed``; in file order. All without
    ``sample_size``."""
    if sample_size is None:
        return list(rows)
    by_type: dict[str, list[Row]] = {}
    for row in rows:
        by_type.setdefault(row.type, []).append(row)
    keep = allocate({t: len(r) for t, r in by_type.items()}, sample_size)
    chosen = {
        row.line
        for t, group in by_type.items()
        for row in random.Random(f"{seed}/{t}").sample(group, keep[t])
    }
    return [row for row in rows if row.line in chosen]


# ------------------------------------------------------------------ writing


class _Dumper(getattr(yaml, "CSafeDumper", yaml.SafeDumper)):  # type: ignore[misc]
    """Multi-line texts as literal blocks, as an operator would write them."""


_Dumper.add_representer(
    str,
    lambda dumper, data: dumper.represent_scalar(
        "tag:yaml.org,2002:str", data, style="|" if "\n" in data else None
    ),
)


def suite_text(rows: list[Row], description: str) -> str:
    return yaml.dump(
        {"description": description, "prompts": [row.entry() for row in rows]},
        Dumper=_Dumper,
        sort_keys=False,
        allow_unicode=True,
        width=1_000_000,
    )


# ------------------------------------------------------------------ the command


def import_traffic(path: Path, out: Path, sample_size: int | None, by_type: bool, seed: int) -> list[str]:
    """Read, sample and write; the summary's lines. Nothing is written unless everything read."""
    out = Path(out)
    if out.suffix not in (".yaml", ".yml") or not safe_id(out.stem):
        raise UserError(f"--out {out}: name a suite YAML file, e.g. suites/traffic.yaml")
    if sample_size is not None and sample_size < 1:
        raise UserError(f"--sample: must be at least 1, got {sample_size}")
    reading = read_traffic(Path(path), safe_id(out.stem))
    skipped = _skipped(reading)
    if not reading.rows:
        raise UserError(
            f"{path}: no usable rows ({sum(reading.skipped.values())} line(s) skipped: {skipped or 'an empty file'}); "
            "expected OpenAI chat requests, ShareGPT conversations or SPEED-Bench rows"
        )
    kept = sample(reading.rows, sample_size, seed)
    groups = _groups(kept, out, by_type)
    source = Path(path).name
    files = {
        target: suite_text(rows, _description(source, len(rows), len(reading.rows), kind, sample_size, seed))
        for target, (kind, rows) in groups.items()
    }
    stale = _stale_types(out, files) if by_type else []
    for target, text in files.items():  # only once everything read; each file whole or not at all
        write_atomic(target, text)
    for old in stale:
        old.unlink(missing_ok=True)
    removed = [
        f"removed {old}: a type this import did not find (an earlier import wrote it)" for old in stale
    ]
    return _summary(path, reading, kept, groups, sample_size, seed, by_type) + removed


def _skipped(reading: Reading) -> str:
    """The lines skipped, each reason with its count, for the summary and the error."""
    return ", ".join(f"{why} ({count})" for why, count in sorted(reading.skipped.items()))


IMPORTED = "by `tuner workload import`"  # in every suite file an import writes: what a re-import may replace


def _stale_types(out: Path, files: dict[Path, str]) -> list[Path]:
    """The ``--by-type`` suites of an earlier import into ``out`` whose type this one did not find: left,
    they would stay suites of a workload that no longer has them. Only files an import wrote (``IMPORTED``)."""
    stale = []
    for found in sorted(out.parent.glob(f"{out.stem}-*{out.suffix}")):
        try:
            text = found.read_text()
        except (OSError, UnicodeDecodeError):
            continue
        if found not in files and IMPORTED in text and safe_id(found.stem[len(out.stem) + 1 :]):
            stale.append(found)
    return stale


def _groups(rows: list[Row], out: Path, by_type: bool) -> dict[Path, tuple[str | None, list[Row]]]:
    if not by_type:
        return {out: (None, rows)}
    groups: dict[Path, tuple[str | None, list[Row]]] = {}
    for kind in sorted({row.type for row in rows}):
        target = out.with_name(f"{out.stem}-{kind}{out.suffix}")
        groups[target] = (kind, [row for row in rows if row.type == kind])
    return groups


def _description(
    source: str, kept: int, total: int, kind: str | None, sample_size: int | None, seed: int
) -> str:
    what = f"{kept} of {total} conversations" + (f" of type {kind}" if kind else "")
    sampled = sample_size is not None and sample_size < total
    drawn = f", a stratified sample (--sample {sample_size}, seed {seed})" if sampled else ""
    return (
        f"Imported from {source} {IMPORTED}: {what}{drawn}. The logged assistant replies "
        "are dropped: each is generated anew on the configuration measured."
    )


def _summary(path, reading: Reading, kept, groups, sample_size, seed, by_type: bool) -> list[str]:
    skipped = _skipped(reading)
    formats = ", ".join(f"{fmt} {count}" for fmt, count in sorted(reading.formats.items()))
    read, per_type = Counter(row.type for row in reading.rows), Counter(row.type for row in kept)
    lines = [
        f"read {path}: {len(reading.rows)} conversation(s) ({formats})"
        + (f"; skipped {skipped}" if skipped else ""),
        f"kept {len(kept)} of {len(reading.rows)}"
        + (f" (--sample {sample_size}, seed {seed})" if sample_size is not None else "")
        + ", per content type: "
        + ", ".join(f"{t} {per_type[t]}/{read[t]}" for t in sorted(read)),
    ]
    if sample_size is not None and sample_size > len(reading.rows):
        lines.append(f"note: --sample {sample_size} is more than the file holds; kept every conversation")
    lines += [f"wrote {target} ({len(rows)} prompt(s))" for target, (_, rows) in groups.items()]
    lines += _held_out_notes(groups, by_type)
    return lines


def _held_out_notes(groups, by_type: bool) -> list[str]:
    """Which suites get a tuning/held-out split (``workload.split``), and so a per-type winner."""
    short = {target: len(rows) for target, (_, rows) in groups.items() if len(rows) < SPLIT_MIN_PROMPTS}
    notes = [
        f"note: {target.stem}: {count} prompt(s), fewer than {SPLIT_MIN_PROMPTS} ({HELD_OUT_MIN} held out, 1 to "
        "tune on): no held-out split, so no per-type winner for it"
        for target, count in short.items()
    ]
    if len(short) < len(groups):
        notes.append(
            f"held out: the last max({HELD_OUT_MIN}, n // 3) prompts of each suite of {SPLIT_MIN_PROMPTS} or more "
            "(workload.split), to check a per-type winner on"
        )
    if not by_type:
        notes.append(
            "note: one suite is one content type to the tuner; --by-type writes one suite per type, for "
            "per-type winners"
        )
    return notes
