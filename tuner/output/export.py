"""Export a study's deployment (`tuner export STUDY`) for production.

Which trial is deployed, with what verdict and policy, per content type and per load class, is
decided first, as one value (``tuner.decisions.export_choice.decide``: the policies, the finalist race, the
baseline as the default). This module writes that value, under ``reports/STUDY/export/``: ``serve.sh`` (the exact command,
``shlex``-quoted, host and port from ``LLAMA_ARG_HOST``/``LLAMA_ARG_PORT``, default
127.0.0.1:8080), ``config.json`` and ``config.yaml``, and the study's section in the
shared ``reports/models-preset.ini`` for one ``llama-server --models-preset`` router
(``tuner.output.preset`` keeps each section's earlier versions: ``tuner preset history|rollback``).
The exported command adds ``--temp T``: the tuned temperature becomes the server's
default (clients may still send their own).
"""

from __future__ import annotations

import getpass
import json
import math
import re
import shlex
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import pandas as pd
import yaml

from tuner import figure_text
from tuner.decisions.export_choice import sentinel_speedup
from tuner.decisions.per_type import PerTypeResultJson
from tuner.decisions.race import RaceResult
from tuner.decisions.route import describe_accuracy, section_name
from tuner.decisions.trial_selection import decision, race_policy, thread_notes
from tuner.errors import UserError
from tuner.knobs.config import method_of
from tuner.knobs.registry import SOURCE_QUANT
from tuner.machine.fingerprint import COMPARABILITY_KEYS
from tuner.measurement.launch import ServerCommand, cpu_mask
from tuner.output.analysis import best_per_suite, complete
from tuner.output.files import write_atomic
from tuner.output.preset import NUMACTL_NOTE, merge_preset, merge_sections
from tuner.storage.records import StudyRecord, TrialRecord

INI_UNSAFE = re.compile(r"[;#\r\n]")  # llama.cpp's INI parser ends a value at a comment or newline


# ------------------------------------------------------------------ the exported record


@dataclass(frozen=True)
class Export:
    """The chosen configuration and its evidence: one record behind every file export writes."""

    study: str
    trial: int
    policy: str
    config: dict
    metrics: dict
    argv: list[str]  # production command without --host/--port
    command: ServerCommand  # the trial's structured command, for the preset section
    per_content_type: list[dict]
    llama_cpp: dict
    machine: dict
    race: RaceResult | None = None
    per_type: PerTypeResultJson | None = None  # the per-type race (the pooled export's), else None
    section_name: str = ""  # the router model name; default the study's (per-type: STUDY-TYPE)
    threads_how: tuple[str, ...] = ()  # how threads and threads-batch were chosen (deployment.thread_notes)
    target: dict | None = (
        None  # a study of target variants: the file run, its digest, its KLD (``target_of``)
    )

    @property
    def section(self) -> str:
        """The preset section (router model) name: the study name (or ``section_name``), INI-safe."""
        return section_name(self.section_name or self.study)

    def to_dict(self) -> dict:
        out = asdict(self)
        del out["command"]  # "command" below is the same, as one line
        out["command"] = shlex.join(self.argv)
        out["preset_section"] = self.section
        out["decision"] = decision(self.race)
        safe = figure_text.json_safe(out)
        assert isinstance(safe, dict), "json_safe keeps a dict a dict"
        return safe


def production_argv(argv: list[str], temperature: float) -> list[str]:
    """The trial's command with the tuned temperature as the server's default."""
    return argv if "--temp" in argv else [*argv, "--temp", f"{temperature:g}"]


def build_export(record: StudyRecord, trial: TrialRecord, frame: pd.DataFrame, policy: str) -> Export:
    assert trial.metrics is not None and trial.command is not None, (
        "an exported trial is complete: it has metrics and the command it was launched with"
    )
    fp = record.fingerprint
    return Export(
        study=record.name,
        trial=trial.number,
        policy=policy,
        config=trial.config.as_dict(),
        metrics={**asdict(trial.metrics), "speedup": sentinel_speedup(trial, frame)},
        argv=production_argv(trial.argv, trial.config.temperature),
        command=trial.command,
        per_content_type=per_suite_rows(frame),
        llama_cpp={"commit": fp.get("llama_commit"), "build_flags": fp.get("llama_build_flags")},
        machine={k: fp.get(k) for k in COMPARABILITY_KEYS if not k.startswith("llama_")},
        threads_how=thread_notes(record, trial, frame),
        target=target_of(record, trial, frame),
    )


def target_of(record: StudyRecord, trial: TrialRecord, frame: pd.DataFrame) -> dict | None:
    """For a study of target variants: which target file the trial runs (path, sha256, how it was made), how far
    it is from the source (mean KLD, same top token) and what speculation adds on it (the trial's recorded rate
    over the best target alone on the same variant, threads and NUMA policy); None for a study without."""
    if not record.target_variants:
        return None
    quant = trial.config.target_quant or SOURCE_QUANT
    made = record.target_variants.get(quant, {})
    done = complete(frame)
    alone = done[
        (done["family"] == "none")
        & (done["target_quant"] == quant)
        & (done["threads"] == trial.config.threads)
        & (done["numa"] == trial.config.numa)
    ]["tokens_per_second"]
    rate = trial.metrics.tokens_per_second if trial.metrics else None
    return {
        "quant": quant,
        "path": made.get("path", record.target.get("path")),
        "sha256": made.get("sha256"),
        "source": made.get("source", record.target.get("path")),
        "source_sha256": made.get("source_sha256"),
        "make": shlex.join(made["command"]) if made.get("command") else None,
        "mean_kld": trial.scores.get("mean_kld", 0.0),
        "same_top": trial.scores.get("same_top", 1.0),
        "speculation_adds": rate / alone.max()
        if trial.config.speculative and rate and not alone.empty
        else None,
    }


def target_lines(export: Export) -> list[str]:
    """What serve.sh and the preset say of the target file: the variant, its digest and distance from the source,
    what speculation adds on it and the llama-quantize command that makes it again."""
    target = export.target
    if target is None:
        return []
    adds = target.get("speculation_adds")
    lines = [
        f"Target: {target['quant']} ({target['path']}"
        + (f", sha256 {target['sha256']}" if target.get("sha256") else "")
        + f"): mean KL divergence {target['mean_kld']:.4f} from the source, same top token at "
        f"{target['same_top']:.1%} of positions (quality.text_file)"
    ]
    if adds is not None:
        lines.append(f"Speculation on it: x{adds:.2f} over this variant alone (recorded, one launch each)")
    if target.get("make"):
        lines.append(f"Made with: {target['make']} (the output is the path above)")
    return lines


def per_suite_rows(frame: pd.DataFrame) -> list[dict]:
    """Each content type's recorded best (``best_per_suite``) as JSON-ready rows; none for one type."""
    suites = best_per_suite(frame)
    if len(suites) < 2:
        return []
    return [{k: _plain(v) for k, v in row.items()} for row in suites.to_dict(orient="records")]


def _plain(value):
    """pandas/numpy scalars and NA as JSON-ready Python values."""
    if value is None or value is pd.NA or (isinstance(value, float) and math.isnan(value)):
        return None
    return value.item() if hasattr(value, "item") else value


# ------------------------------------------------------------------ writing


def shell_script(export: Export) -> str:
    metrics = export.metrics
    lines = [
        "#!/bin/sh",
        f"# Generated by `tuner export` from study {export.study}, trial {export.trial}: {export.policy}.",
        f"# Recorded: {metrics['tokens_per_second']:.1f} tokens/s, x{metrics.get('speedup', 1.0):.2f} over the "
        f"baseline, acceptance {metrics.get('acceptance', 0.0):.2f}, quality {metrics.get('quality', 0.0):.3f}.",
    ]
    if export.race is not None:
        lines.append(f"# Raced at export: {export.race.figure()}.")
        lines.append(f"# Race verdict: {export.race.verdict}.")
        lines.append(f"# What it may lose: {export.race.loss_line()}.")
        if export.race.forecast:
            lines.append(f"# To settle it: {export.race.forecast}.")
    lines += [f"# {line}." for line in export.threads_how]
    lines += [f"# {line}." for line in target_lines(export)]
    lines += [
        f"# Measured on {export.machine.get('cpu_model')} with llama.cpp {export.llama_cpp.get('commit')}.",
        "# --temp sets the tuned temperature as the default; clients may send their own.",
        "# Usage: LLAMA_ARG_HOST=0.0.0.0 LLAMA_ARG_PORT=9000 ./serve.sh [more llama-server flags]",
        "set -eu",
        "exec "
        + shlex.join(export.argv)
        + ' --host "${LLAMA_ARG_HOST:-127.0.0.1}" --port "${LLAMA_ARG_PORT:-8080}" "$@"',
        "",
    ]
    return "\n".join(lines)


def preset_lines(export: Export) -> list[str]:
    """The study's `--models-preset` section: one ``key = value`` per llama-server option (``section_options``)."""
    comments, options = section_options(export.study, export.command, export.config.get("temperature", 0.0))
    comments = [
        f"; tuner export: study {export.study}, trial {export.trial} ({export.policy})",
        *(f"; {line}" for line in export.threads_how),
        *(f"; {line}" for line in target_lines(export)),
        *comments,
    ]
    return [f"[{export.section}]", *comments, *(f"{k} = {v}" for k, v in options.items())]


def section_options(
    study: str, command: ServerCommand, temperature: float
) -> tuple[list[str], dict[str, str]]:
    """A trial's command as a preset section's comments and options (what ``tuner verify`` compares a deployed
    section with).

    Built from the trial's structured command. A preset names options, not a command, so
    a numactl prefix cannot be kept: its CPUs become ``cpu-mask``/``cpu-strict``, and a
    memory policy is left as a comment (start the router under that numactl policy to keep it).
    """
    comments: list[str] = []
    options: dict[str, str] = {}
    if command.prefix:
        options["cpu-mask"] = cpu_mask(list(command.cpus))
        options["cpu-strict"] = "1"
        comments += [
            f"; {NUMACTL_NOTE} {opt}: start the router with it to keep that memory policy"
            for opt in command.prefix[1:]
            if not opt.startswith("--physcpubind=")
        ]
    pairs = [*command.options, *_pairs(command.extra), ("--temp", f"{temperature:g}")]
    for flag, value in pairs:
        key = flag.lstrip("-")
        if key == "numa" and value == "numactl" and command.prefix:
            continue  # the CPUs numactl chose are pinned by cpu-mask now
        if key in options:
            raise UserError(f"{study}: the command repeats --{key}; a preset holds one value per option")
        value = "true" if value is None else value
        if INI_UNSAFE.search(value):
            raise UserError(
                f"{study}: --{key} value {value!r} contains ; # or a newline, "
                "which the preset format cannot hold; rename the file or pass the flag on the command line"
            )
        options[key] = value
    return comments, options


def _pairs(extra: tuple[str, ...]) -> list[tuple[str, str | None]]:
    """The study's extra_args as (flag, value) pairs: a flag takes the next token unless that is a flag."""
    pairs: list[tuple[str, str | None]] = []
    index = 0
    while index < len(extra):
        if not extra[index].startswith("-"):
            raise UserError(
                f"llama_cpp.extra_args: {extra[index]!r} is not an option; a preset cannot hold it"
            )
        has_value = index + 1 < len(extra) and not _is_option(extra[index + 1])
        pairs.append((extra[index], extra[index + 1] if has_value else None))
        index += 2 if has_value else 1
    return pairs


def _is_option(token: str) -> bool:
    if not token.startswith("-"):
        return False
    try:
        float(token)
    except ValueError:
        return True
    return False  # a negative number is a value


def router_script(pooled: Export, per_type: list[Export], preset_path: Path) -> str:
    """``serve-router.sh``: one llama-server in router mode on the shared preset."""
    names = [pooled.section, *(e.section for e in per_type)]
    binary = pooled.command.binary if pooled.command else "llama-server"
    lines = [
        "#!/bin/sh",
        f"# Generated by `tuner export` from study {pooled.study}: one llama-server in router mode",
        f'# on {preset_path}, one configuration per section. The request\'s "model" field picks it:',
        f"#   {pooled.section}: the pooled winner (trial {pooled.trial}), for any content",
        *(f"#   {e.section}: {_type_note(e) if e.per_type else e.policy}" for e in per_type),
        "# The preset may hold other studies' sections too; each is served under its own name.",
        "# Usage: LLAMA_ARG_HOST=0.0.0.0 LLAMA_ARG_PORT=9000 ./serve-router.sh [more llama-server flags]",
        "set -eu",
        "exec "
        + shlex.join([binary, "--models-preset", str(preset_path.resolve()), "--models-max", str(len(names))])
        + ' --host "${LLAMA_ARG_HOST:-127.0.0.1}" --port "${LLAMA_ARG_PORT:-8080}" "$@"',
        "",
    ]
    return "\n".join(lines)


def proxy_script(pooled: Export, preset_path: Path) -> str:
    """``serve-proxy.sh``: ``tuner serve`` in front of the router it starts, one endpoint for mixed traffic."""
    tuner = Path(sys.executable).parent / "tuner"
    argv = [
        str(tuner) if tuner.is_file() else "tuner",
        "serve",
        pooled.study,
        "--preset",
        str(preset_path.resolve()),
    ]
    if pooled.command is not None and Path(pooled.command.binary).is_absolute():
        argv += ["--bin-dir", str(Path(pooled.command.binary).parent)]
    lines = [
        "#!/bin/sh",
        f"# Generated by `tuner export` from study {pooled.study}: one OpenAI-compatible endpoint (tuner serve) in",
        "# front of llama-server's router, which it starts on the preset (as serve-router.sh does) and stops on exit.",
        "# Each /v1/chat/completions, /v1/completions and /completion request is classified and sent to its",
        f"# content type's section, else to {pooled.section}; a request naming one of the study's sections keeps it.",
        "# Usage: TUNER_SERVE_HOST=0.0.0.0 TUNER_SERVE_PORT=9000 ./serve-proxy.sh [more tuner serve flags]",
        "set -eu",
        "exec "
        + shlex.join(argv)
        + ' --host "${TUNER_SERVE_HOST:-127.0.0.1}" --port "${TUNER_SERVE_PORT:-8080}" "$@"',
        "",
    ]
    return "\n".join(lines)


def service_unit(pooled: Export, proxy: Path) -> str:
    """``llama-tuner-STUDY.service``: the proxy and the router it starts as one systemd service (SIGTERM to
    ``tuner serve`` stops the router; the rest of the unit's processes go with its control group)."""
    name = f"llama-tuner-{pooled.section}"
    return "\n".join(
        [
            f"# Generated by `tuner export` from study {pooled.study}: tuner serve and its llama-server router.",
            f"# Install: sudo cp {name}.service /etc/systemd/system/ && sudo systemctl daemon-reload "
            f"&& sudo systemctl enable --now {name}",
            "[Unit]",
            f"Description=llama-tuner study {pooled.study}: one endpoint per content type (tuner serve + router)",
            "After=network-online.target",
            "Wants=network-online.target",
            "",
            "[Service]",
            "Type=simple",
            f"User={getpass.getuser()}",
            "Environment=TUNER_SERVE_HOST=127.0.0.1",
            "Environment=TUNER_SERVE_PORT=8080",
            f"ExecStart={proxy.resolve()}",
            "Restart=on-failure",
            "RestartSec=5",
            "TimeoutStopSec=30",
            "",
            "[Install]",
            "WantedBy=multi-user.target",
            "",
        ]
    )


def _type_note(export: Export) -> str:
    per_type = export.per_type
    assert per_type is not None, "only a per-type export has a content type to note"
    result = next(t for t in per_type["types"] if export.section.endswith("-" + section_name(t["suite"])))
    draft_max = export.config.get("draft_max") if export.config.get("spec_type", "none") != "none" else 0
    return (
        f"{result['suite']} (trial {export.trial}, {method_of(export.config)}, K={draft_max}): "
        f"{result['held_out_tokens_per_second']:.1f} tokens/s on held-out {result['suite']} prompts, "
        f"x{result['gain']:.2f} over the pooled winner [{result['gain_low']:.2f}, {result['gain_high']:.2f}]"
    )


def race_note(export: Export) -> str:
    """The race's word on the pooled winner for ROUTER.md: what it may lose, or that it is the baseline."""
    if export.race is None:
        return " (not raced: its figures are one measurement)"
    if export.race.baseline_deployed:
        return f": {race_policy(export.race, '')}"
    return f" ({'decided' if export.race.decided else 'undecided race'}: {export.race.loss_line()})"


def client_note(pooled: Export, per_type: list[Export]) -> str:
    """``ROUTER.md``: how a client picks a configuration."""
    sections = [pooled.section, *(e.section for e in per_type)]
    example = per_type[0].section if per_type else pooled.section
    return "\n".join(
        [
            f"# Serving study {pooled.study} per content type",
            "",
            "One endpoint for any client (the OpenAI client, curl, a chat front end): `./serve-proxy.sh` "
            "(`tuner serve`: it starts the router below, classifies each request as below and sets "
            f"`model` for it; `/metrics` counts requests and tokens per section and type). As a service: "
            f"`llama-tuner-{pooled.section}.service` beside it.",
            "",
            "Start the router alone: `./serve-router.sh` (one llama-server, one child server per configuration, started on "
            "first use). Every request names its configuration in the `model` field (POST endpoints), or the `model` "
            "query parameter (GET endpoints such as `/props?model=NAME`):",
            "",
            f"- `{pooled.section}`: the pooled winner (trial {pooled.trial}), for any content{race_note(pooled)}",
            *(f"- `{e.section}`: {_type_note(e)}" for e in per_type),
            *(
                [
                    f"- no content type's own winner beat the pooled winner on its held-out prompts beyond the noise: "
                    f"every type is served by `{pooled.section}` ("
                    + "; ".join(f"{t['suite']}: {t['why']}" for t in (pooled.per_type or {}).get("types", []))
                    + ")"
                ]
                if not per_type and pooled.per_type
                else []
            ),
            "",
            "```sh",
            "curl -s http://127.0.0.1:8080/v1/completions -H 'Content-Type: application/json' \\",
            f'  -d \'{{"model": "{example}", "prompt": "def add(a, b):", "max_tokens": 64}}\'',
            "```",
            "",
            "Mixed traffic without `tuner serve`: classify each request (a `/completion` body's prompt, or a chat "
            "request's last user "
            "message), then fall back to the pooled section:",
            "",
            "```python",
            "from tuner.decisions.route import request_type",
            f"SECTIONS = {sections!r}",
            f'name = f"{pooled.section}-{{request_type(body)}}"',
            f"model = name if name in SECTIONS else {pooled.section!r}",
            "```",
            "",
            describe_accuracy() + ".",
            "",
            "The configurations share the machine: under concurrent traffic their servers compete for the same cores "
            "and memory bandwidth, unlike when they were measured one at a time.",
            "",
        ]
    )


def write_export(
    export: Export,
    out_dir: Path,
    preset_path: Path,
    per_type: list[Export] | None = None,
    by_load: Sequence[Export] = (),
    verdict: str = "",
) -> list[Path]:
    """The pooled export's files and its preset section; with ``per_type`` exports (and ``by_load``, the
    STUDY-cN sections), their sections too (one merge), ``serve-router.sh``, ``serve-proxy.sh`` (``tuner serve``
    in front of it), its systemd unit and ``ROUTER.md``."""
    record = export.to_dict()
    script = write_atomic(out_dir / "serve.sh", shell_script(export), mode=0o755)
    json_path = write_atomic(out_dir / "config.json", json.dumps(record, indent=2) + "\n")
    yaml_path = write_atomic(out_dir / "config.yaml", yaml.safe_dump(record, sort_keys=False))
    if per_type is None:
        merge_preset(preset_path, export.section, preset_lines(export), export.study, export.trial)
        return [script, json_path, yaml_path, preset_path]
    exports = (export, *per_type, *by_load)
    merge_sections(
        preset_path,
        {e.section: preset_lines(e) for e in exports},
        {e.section: (e.study, e.trial) for e in exports},
    )
    router = write_atomic(
        out_dir / "serve-router.sh", router_script(export, [*per_type, *by_load], preset_path), mode=0o755
    )
    proxy = write_atomic(out_dir / "serve-proxy.sh", proxy_script(export, preset_path), mode=0o755)
    unit = write_atomic(out_dir / f"llama-tuner-{export.section}.service", service_unit(export, proxy))
    note = write_atomic(
        out_dir / "ROUTER.md", client_note(export, per_type) + load_note(export, by_load, verdict)
    )
    return [script, json_path, yaml_path, preset_path, router, proxy, unit, note]


def load_note(pooled: Export, by_load: Sequence[Export], verdict: str = "") -> str:
    """``ROUTER.md``'s part on load: which STUDY-cN section to run for how many simultaneous users."""
    if not by_load:
        return ""
    lines = [
        "",
        "## By load: how many users at once",
        "",
        *([verdict[0].upper() + verdict[1:] + ".", ""] if verdict else []),
        "Each `-cN` section is the configuration that served the most tokens/s in all at N simultaneous users, "
        + (
            "raced at that load (N slots, N clients at once, launched afresh in paired rounds against the baseline: "
            "the figure, verdict and loss bound are the race's)"
            if any(e.race is not None for e in by_load)
            else "(its best recorded figure, one launch)"
        )
        + ", with N slots. Run the section of the load you expect; between "
        "two classes, the larger one (a slot left idle costs memory, a missing one queues a request):",
        "",
    ]
    lines += [
        f"- `{e.section}`: up to {e.section.rsplit('-c', 1)[1]} simultaneous user(s): trial {e.trial}, "
        f"{method_of(e.config)} ({e.policy})"
        for e in by_load
    ]
    return "\n".join([*lines, ""]) + "\n"
