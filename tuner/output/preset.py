"""The shared llama-server ``--models-preset`` file: sections merged in, their earlier versions kept and
put back (``tuner preset history|rollback``).

``tuner export`` writes each deployment as one section of a preset file every study shares
(``reports/models-preset.ini``). A write that changes a section first keeps what the section was in
``FILE.history.jsonl`` beside it: one version per line, numbered from 1, with the time (UTC), the
export that replaced it (study and trial) and the section's exact text (header to the next section),
or a marker that it did not exist. ``tuner preset rollback FILE SECTION [--to N]`` puts a version
back in place (by default the section's latest) and keeps the text it replaces as a new version, so
a rollback is undone by another. Every other section and the operator's own lines stay byte for byte. An
export that puts the ``version`` header above a file without one keeps what was there, and a rollback that
leaves nothing an export wrote takes the header off again: rolling back every export gives the file back.

Writers hold an exclusive lock on the file's folder (not the file: a write replaces it, lock and all)
around the read, the merge and both writes, so two exports at once each keep the other's section.
Each file is written whole or not at all (``write_atomic``): the history first, so that no change is
made without its record, then the preset; a failed preset write puts the history back.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
from collections.abc import Iterator
from dataclasses import asdict, dataclass, replace
from datetime import datetime, timezone
from pathlib import Path

from tuner.errors import UserError
from tuner.output.files import write_atomic, write_error

PRESET_FILE = "models-preset.ini"
PREAMBLE = (
    "version = 1\n; llama-server --models-preset FILE: one section per exported study (tuner export)\n\n"
)
_HEADER = re.compile(r"\s*\[\s*([^\]]*?)\s*\]\s*(?:[;#].*)?")
_ORIGIN = re.compile(r"; tuner export: study (.+?), trial (\d+)")
NUMACTL_NOTE = "tuned under numactl"  # an export's comment: the memory policy a preset cannot hold
_NUMACTL = re.compile(rf";\s*{NUMACTL_NOTE} (\S+):")
SHARED = "*"  # the section whose options llama-server's router applies under every other one

Blocks = list[tuple[str | None, str]]  # (section name, None for the preamble; its text as in the file)


@dataclass(frozen=True)
class Version:
    """What one section was before a write changed it."""

    section: str
    text: str | None  # the section's exact text, header to the next section; None: it did not exist
    time: str = ""  # UTC, ISO 8601
    study: str | None = None  # the export that replaced it, where an export did
    trial: int | None = None
    replaced_by: str = "export"  # or "rollback to N"
    separator: str = ""  # what adding the section appended to the block before it (its blank line)
    # the file's lines above its first section before the write that kept this version changed them (None: it did
    # not): an export adding the ``version`` header, a rollback taking it off or putting it back
    preamble: str | None = None
    number: int = 0  # its place in the history, from 1 (not stored: the line's)

    def replacer(self) -> str:
        if self.replaced_by == "export" and self.study is not None:
            return f"export of study {self.study}, trial {self.trial}"
        return self.replaced_by

    def held(self) -> str:
        if self.text is None:
            return "(no such section)"
        origin = _ORIGIN.search(self.text)
        return f"study {origin[1]}, trial {origin[2]}" if origin else "(not from an export)"


# ------------------------------------------------------------------ reading


def history_path(path: Path) -> Path:
    """Where a preset file's kept versions are: ``FILE.history.jsonl`` beside it."""
    return path.with_name(path.name + ".history.jsonl")


def read_history(path: Path) -> list[Version]:
    """The preset file's kept versions, oldest first (none when nothing was kept yet)."""
    hist = history_path(path)
    if not hist.exists():
        return []
    versions = []
    for number, line in enumerate(hist.read_text().splitlines(), 1):
        try:
            versions.append(Version(**json.loads(line), number=number))
        except (ValueError, TypeError) as err:
            raise UserError(f"{hist}:{number}: not a kept version ({err}); remove that line") from None
    return versions


def preset_sections(path: Path) -> list[str]:
    """The section names of a preset file, in order (none when it does not exist)."""
    if not path.exists():
        return []
    return [m.group(1) for line in path.read_text().splitlines() if (m := _HEADER.fullmatch(line))]


def preset_origins(path: Path) -> dict[str, str | None]:
    """Each section's name and the study whose export wrote it (its ``; tuner export: study`` comment; None: not
    from an export), the first copy of a name as a merge keeps it."""
    origins: dict[str, str | None] = {}
    for name, text in _blocks(path.read_text())[1:]:
        if name is not None and name not in origins:
            origin = _ORIGIN.search(text)
            origins[name] = origin[1] if origin else None
    return origins


def _blocks(text: str) -> Blocks:
    """The file as the preamble, then one block per section header: each block's lines as they are."""
    blocks: Blocks = []
    current: list[str] = []
    name: str | None = None
    for line in text.splitlines(keepends=True):
        header = _HEADER.fullmatch(line.rstrip("\r\n"))
        if header:
            blocks.append((name, "".join(current)))
            name, current = header.group(1), []
        current.append(line)
    blocks.append((name, "".join(current)))
    return blocks


def _existing(path: Path) -> str:
    if not path.is_file():
        raise UserError(
            f"{path}: no such preset file; name the file `tuner export` wrote its sections to "
            f"(by default reports/{PRESET_FILE})"
        )
    return path.read_text()


@dataclass(frozen=True)
class DeployedSection:
    """One section of a preset file as the router serves it: its own options over the shared ``[*]`` ones."""

    path: Path
    name: str
    options: dict[str, str]  # the section's own, in the file's order
    shared: dict[str, str]  # the ``[*]`` section's
    origin: tuple[str, int] | None  # (study, trial) an export wrote into it, from its comment
    numactl: tuple[str, ...]  # the numactl memory policy the export noted (a preset cannot hold it)

    @property
    def served(self) -> dict[str, str]:
        """What the router launches the section with: ``[*]``'s options, the section's own over them."""
        return {**self.shared, **self.options}


def read_section(path: Path, name: str) -> DeployedSection:
    """A preset file's section as deployed (its first copy, as a merge keeps it); a missing file or section, or a
    line that is not ``key = value``, is one line naming the file and the section."""
    blocks = _blocks(_existing(path))
    raw = next((text for n, text in blocks if n == name), None)
    if raw is None:
        names = [n for n, _ in blocks[1:] if n is not None and n != SHARED]  # after the preamble, all named
        raise UserError(
            f"{path}: no section [{name}] (its sections: {', '.join(names) or 'none'}); "
            "pass --section NAME, or --preset the file the study was exported to"
        )
    shared = next((text for n, text in blocks if n == SHARED), "")
    origin = _ORIGIN.search(raw)
    return DeployedSection(
        path,
        name,
        _options(path, name, raw),
        _options(path, SHARED, shared),
        (origin[1], int(origin[2])) if origin else None,
        tuple(_NUMACTL.findall(raw)),
    )


def _options(path: Path, name: str, raw: str) -> dict[str, str]:
    """A section's ``key = value`` lines (a value ends at ``;`` or ``#``, as llama.cpp's parser reads it)."""
    options: dict[str, str] = {}
    for line in raw.splitlines()[1:]:
        text = re.split(r"[;#]", line, maxsplit=1)[0].strip()
        if not text:
            continue
        key, sep, value = (part.strip() for part in text.partition("="))
        if not sep or not key:
            raise UserError(
                f"{path}: [{name}]: {line.strip()!r} is not `key = value`; fix or remove that line"
            )
        options[key] = value
    return options


# ------------------------------------------------------------------ writing


def merge_preset(
    path: Path, section: str, lines: list[str], study: str | None = None, trial: int | None = None
) -> list[Version]:
    """Replace (or add) one section of a shared preset file, keeping every other section."""
    return merge_sections(path, {section: lines}, {section: (study, trial)})


def merge_sections(
    path: Path, new: dict[str, list[str]], origins: dict[str, tuple[str | None, int | None]] | None = None
) -> list[Version]:
    """Replace (or add) several sections of a shared preset file in one write; the versions kept.

    Every other section, and the preamble, is kept byte for byte (its lines, blank lines and
    comments as they were). A replaced section keeps its place; one that appears more than once
    (a hand edit) keeps its first place and loses the copies, so no section is ever duplicated.
    New sections are appended in the given order. Each section the write changes is kept first as
    it was (``origins``: the study and trial exported into it, by section).
    """
    with _locked(path):
        text = path.read_text() if path.exists() else ""
        return _commit(path, *_merged(_blocks(text), new, origins or {}))


def _merged(
    blocks: Blocks, new: dict[str, list[str]], origins: dict[str, tuple[str | None, int | None]]
) -> tuple[Blocks, list[Version]]:
    """The blocks with ``new``'s sections in place (or appended), and what each changed one was."""
    preamble = _with_header(blocks[0][1])
    out: Blocks = [(None, preamble)]
    kept: list[Version] = []
    for name, raw in blocks[1:]:
        if name in new:
            if any(seen == name for seen, _ in out):
                continue
            text = _section_text(new[name], raw)
            if text != raw:
                study, trial = origins.get(name, (None, None))
                kept.append(Version(name, raw, study=study, trial=trial))
            raw = text
        out.append((name, raw))
    for name, lines in new.items():
        if not any(seen == name for seen, _ in out):
            study, trial = origins.get(name, (None, None))
            separator = _append(out, name, _section_text(lines, ""))
            kept.append(Version(name, None, study=study, trial=trial, separator=separator))
    if kept and preamble != blocks[0][1]:  # so that rolling back every export takes the header off again
        kept[0] = replace(kept[0], preamble=blocks[0][1])
    return out, kept


def _with_header(preamble: str) -> str:
    """The lines above the first section with llama-server's ``version`` line (``PREAMBLE`` above them where
    they have none)."""
    if any(re.match(r"\s*version\s*=", line) for line in preamble.splitlines()):
        return preamble
    return PREAMBLE + preamble


def _section_text(lines: list[str], replaced: str) -> str:
    """A section's lines, then the blank lines that followed the section it replaces."""
    stripped = replaced.rstrip("\r\n")
    return "\n".join(lines) + "\n" + replaced[len(stripped) :].replace("\r", "")[1:]


def _append(blocks: Blocks, name: str, text: str) -> str:
    """Add a section at the end, one blank line after the last block; what that added to the last."""
    last_name, last = blocks[-1]
    separator = _separator(last)
    blocks[-1] = (last_name, last + separator)
    blocks.append((name, text))
    return separator


def _separator(last: str) -> str:
    """What makes one blank line after ``last`` (nothing when it is empty or already ends in one)."""
    return "" if not last or last.endswith("\n\n") else ("\n" if last.endswith("\n") else "\n\n")


def _commit(path: Path, blocks: Blocks, kept: list[Version]) -> list[Version]:
    """The kept versions appended to the history, then the preset written; the kept versions, numbered."""
    hist = history_path(path)
    old = hist.read_text() if hist.exists() else None
    before = (old or "") + ("\n" if old and not old.endswith("\n") else "")
    start = len(before.splitlines())
    now = _now()
    kept = [replace(v, time=now, number=start + i) for i, v in enumerate(kept, 1)]
    if kept:
        stored = [{k: value for k, value in asdict(v).items() if k != "number"} for v in kept]
        write_atomic(hist, before + "".join(json.dumps(s) + "\n" for s in stored))
    try:
        write_atomic(path, "".join(raw for _, raw in blocks))
    except UserError:
        if kept:  # whole or nothing: no version of a change that was not made
            with contextlib.suppress(UserError, OSError):
                if old is None:
                    hist.unlink()
                else:
                    write_atomic(hist, old)
        raise
    return kept


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """An exclusive lock on the preset's folder for one read-merge-write: concurrent writers wait."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path.parent, os.O_RDONLY)
    except OSError as err:
        raise write_error(path, err) from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing drops the lock


def _now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


# ------------------------------------------------------------------ rolling back


def rollback(path: Path, section: str, to: int | None = None) -> tuple[Version, Version | None]:
    """Put ``section`` back as version ``to`` kept it (default: its latest version): that version, and
    the version this kept of what it replaced (None when the section already was so)."""
    _existing(path)  # before the lock, which would make the folder
    with _locked(path):
        blocks = _blocks(_existing(path))
        versions = read_history(path)
        target = _pick(path, versions, section, to)
        kept = _restore(blocks, target)
        if kept is None:
            return target, None
        preamble = blocks[0][1]
        blocks[0] = (None, _preamble(blocks, versions))
        if blocks[0][1] != preamble:
            kept = replace(kept, preamble=preamble)
        return target, _commit(path, blocks, [replace(kept, replaced_by=f"rollback to {target.number}")])[0]


def _preamble(blocks: Blocks, versions: list[Version]) -> str:
    """The lines above the first section after a rollback. Once every section with kept versions is back as its
    first version kept it, the file holds nothing an export wrote: the lines an export's header went above come
    back, so rolling back every export gives the file back byte for byte. Otherwise an export's section is in the
    file, and it keeps (or gets back, when a rollback is undone) the header an export gives it."""
    first: dict[str | None, str | None] = {}
    for version in versions:
        first.setdefault(version.section, version.text)
    current: dict[str | None, str] = {}
    for name, raw in blocks[1:]:
        current.setdefault(name, raw)
    before = next((v.preamble for v in versions if v.preamble is not None), None)
    # an export added the header, the lines stayed as it left them (not edited by hand since), no export is left
    if (
        before is not None
        and blocks[0][1] == _with_header(before)
        and all(current.get(name) == text for name, text in first.items())
    ):
        return before
    return _with_header(blocks[0][1])


def _pick(path: Path, versions: list[Version], section: str, to: int | None) -> Version:
    mine = [v for v in versions if v.section == section]
    if not mine:
        raise _no_versions(path, versions, section)
    if to is None:
        return mine[-1]
    listing = f"`tuner preset history {path} {section}` lists [{section}]'s"
    if not 1 <= to <= len(versions):
        raise UserError(f"--to {to}: {path} has kept versions 1 to {len(versions)}; {listing}")
    if versions[to - 1].section != section:
        raise UserError(
            f"--to {to}: version {to} of {path} is of section [{versions[to - 1].section}], not [{section}]; {listing}"
        )
    return versions[to - 1]


def _no_versions(path: Path, versions: list[Version], section: str) -> UserError:
    names = list(dict.fromkeys(v.section for v in versions))
    known = (
        f"the sections with kept versions are {', '.join(names)}"
        if names
        else "none of its sections has a kept version yet (an export keeps one each time it changes a section)"
    )
    return UserError(f"{path}: no kept version of section [{section}]; {known}")


def _restore(blocks: Blocks, target: Version) -> Version | None:
    """Put ``target``'s text in its section's place (first copy), removing it or adding it at the end as
    needed; what the section was (None when it already was so)."""
    at = next((i for i, (name, _) in enumerate(blocks) if name == target.section), None)
    if at is None:
        if target.text is None:
            return None
        return Version(target.section, None, separator=_append(blocks, target.section, target.text))
    current = blocks[at][1]
    if target.text is None:
        del blocks[at]
        name, last = blocks[-1]
        before = last[: len(last) - len(target.separator)]
        if at == len(blocks) and target.separator and _separator(before) == target.separator:
            blocks[-1] = (name, before)  # the blank line adding it put there, when it is still there
    elif target.text == current:
        return None
    else:
        ends = at == len(blocks) - 1 or target.text.endswith("\n")  # a section before another ends its line
        blocks[at] = (target.section, target.text if ends else target.text + "\n")
    return Version(target.section, current)


# ------------------------------------------------------------------ command


def history_lines(path: Path, section: str | None = None) -> list[str]:
    """``tuner preset history``: one row per kept version, oldest first."""
    _existing(path)
    versions = read_history(path)
    if section is not None:
        if not any(v.section == section for v in versions):
            raise _no_versions(path, versions, section)
        versions = [v for v in versions if v.section == section]
    if not versions:
        return [f"{path}: no kept versions yet; an export keeps a section's text each time it changes it"]
    rows = [("N", "time (UTC)", "section", "replaced by", "it held")]
    rows += [(str(v.number), v.time, v.section, v.replacer(), v.held()) for v in versions]
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    return [
        f"{path}: {len(versions)} kept version(s), oldest first; "
        f"`tuner preset rollback {path} SECTION --to N` puts one back",
        *("  ".join([*(cell.ljust(w) for cell, w in zip(row, widths)), row[-1]]) for row in rows),
    ]


def rollback_line(path: Path, target: Version, kept: Version | None) -> str:
    """What ``tuner preset rollback`` did, and how to undo it."""
    header = f"[{target.section}]"
    if kept is None:
        return f"{path}: {header} already is as version {target.number} kept it; nothing changed"
    done = (
        f"{header} removed (it did not exist before version {target.number})"
        if target.text is None
        else f"{header} put back as version {target.number} kept it ({target.time})"
    )
    return (
        f"{path}: {done}; what it replaced is kept as version {kept.number}: "
        f"`tuner preset rollback {path} {target.section}` undoes this"
    )
