"""Export a study's chosen configuration (`tuner export STUDY`) for production.

Selection policy (documented in ``--help``): among complete trials that meet the quality
floor (``constraint_quality <= 0``), optionally only those with acceptance at least
``--min-acceptance``,

* ``max-tps`` (default): the highest decode tokens/s;
* ``knee``: the knee of the tokens/s-against-quality front (``tuner.analysis.knee``),
  i.e. the best speed before quality starts to be paid for it;
* ``--trial N`` overrides both with one feasible trial.

Before anything is written the winner is re-measured against the baseline side by
side (both servers up, workload passes alternating A/B then B/A, a few rounds): a
study's figure can be luck, and one number confirmed on the spot is what an operator
trusts. The outputs, under ``reports/STUDY/export/``: ``serve.sh`` (the exact command,
``shlex``-quoted, host and port from ``LLAMA_ARG_HOST``/``LLAMA_ARG_PORT``, default
127.0.0.1:8080), ``config.json`` and ``config.yaml``, and the study's section in the
shared ``reports/models-preset.ini`` for one ``llama-server --models-preset`` router.
The exported command adds ``--temp T``: the tuned temperature becomes the server's
default (clients may still send their own).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shlex
import statistics
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import optuna
import pandas as pd
import yaml

from tuner.errors import UserError
from tuner.fingerprint import COMPARABILITY_KEYS
from tuner.topology import parse_cpu_list
from tuner.launch import cpu_mask
from tuner.paths import reports_dir, storage_dir
from tuner.analysis import best_per_suite, feasible, front_2d, knee, open_study, quality_floor, strip_host_port, trials_frame

POLICIES = {
    "max-tps": "highest tokens/s among trials that meet the quality floor",
    "knee": "knee of the tokens/s-against-quality front of trials that meet the quality floor",
}
PRESET_FILE = "models-preset.ini"
INI_UNSAFE = re.compile(r"[;#\r\n]")  # llama.cpp's INI parser ends a value at a comment or newline


# ------------------------------------------------------------------ choosing


def choose(study: optuna.Study, frame: pd.DataFrame, policy: str = "max-tps",
           min_acceptance: float | None = None, trial: int | None = None) -> tuple[int, str]:
    """The exported trial's number and why it was chosen; no candidate is a UserError."""
    if policy not in POLICIES:
        raise UserError(f"--policy: unknown policy {policy!r}; use one of {', '.join(POLICIES)}")
    name = study.study_name
    pool = feasible(frame)
    n_complete = int((frame["state"] == "COMPLETE").sum())
    if pool.empty:
        raise UserError(
            f"study {name!r} has no feasible trial ({n_complete} complete, none meets the quality floor "
            f"{quality_floor(study)}); run more trials or lower quality.floor in the study file"
        )
    if trial is not None:
        if trial not in set(pool["trial"]):
            raise UserError(f"--trial {trial}: not a complete trial of {name!r} that meets the quality floor; "
                            "pick one from the report's Pareto table")
        return trial, f"trial {trial} chosen with --trial"
    if min_acceptance is not None:
        best = pool["acceptance"].max()
        pool = pool[pool["acceptance"] >= min_acceptance]
        if pool.empty:
            raise UserError(f"--min-acceptance {min_acceptance:g}: no feasible trial of {name!r} reaches it "
                            f"(best feasible acceptance {best:.2f}); lower it")
    why = POLICIES[policy] + (f", acceptance >= {min_acceptance:g}" if min_acceptance is not None else "")
    if policy == "knee":
        return knee(front_2d(pool, "quality")), why
    return int(pool.sort_values("tokens_per_second", ascending=False)["trial"].iloc[0]), why


# ------------------------------------------------------------------ the exported record


@dataclass(frozen=True)
class Confirmation:
    """The winner re-measured against the baseline, alternating, on this host now."""

    rounds: int
    winner_tokens_per_second: list[float]  # one pooled rate per round
    baseline_tokens_per_second: list[float]
    speedup: float  # median winner / median baseline
    recorded_speedup: float
    noise: float  # relative spread of the ratio: both sides' round-to-round CVs combined
    drafted: int  # tokens the winner drafted while confirming (0: speculation was off)

    @property
    def falls_short(self) -> bool:
        return self.speedup < self.recorded_speedup * (1.0 - self.noise)


@dataclass(frozen=True)
class Export:
    """The chosen configuration and its evidence: one record behind every file export writes."""

    study: str
    trial: int
    policy: str
    config: dict
    metrics: dict
    argv: list[str]  # production command without --host/--port
    per_content_type: list[dict]
    llama_cpp: dict
    machine: dict
    confirmation: Confirmation | None = None

    @property
    def section(self) -> str:
        """The preset section (router model) name: the study name, INI-safe."""
        return re.sub(r"[^A-Za-z0-9_.-]", "-", self.study)

    def to_dict(self) -> dict:
        out = asdict(self)
        out["command"] = shlex.join(self.argv)
        out["preset_section"] = self.section
        if self.confirmation is not None:
            out["confirmation"]["falls_short"] = self.confirmation.falls_short
        return out


def production_argv(argv: list[str], temperature: float) -> list[str]:
    """The trial's argv without --host/--port, with the tuned temperature as the default."""
    out = strip_host_port(argv)
    return out if "--temp" in out else [*out, "--temp", f"{temperature:g}"]


def build_export(study: optuna.Study, frame: pd.DataFrame, number: int, policy: str) -> Export:
    t = study.trials[number]
    config = t.user_attrs["config"]
    fp = study.user_attrs.get("fingerprint") or {}
    suites = best_per_suite(frame)
    per_suite = [] if len(suites) < 2 else [
        {k: _plain(v) for k, v in row.items()} for row in suites.to_dict(orient="records")]
    return Export(
        study=study.study_name,
        trial=number,
        policy=policy,
        config=config,
        metrics=t.user_attrs["metrics"],
        argv=production_argv(t.user_attrs["argv"], config.get("temperature", 0.0)),
        per_content_type=per_suite,
        llama_cpp={"commit": fp.get("llama_commit"), "build_flags": fp.get("llama_build_flags")},
        machine={k: fp.get(k) for k in COMPARABILITY_KEYS if not k.startswith("llama_")},
    )


def _plain(value):
    """pandas/numpy scalars and NA as JSON-ready Python values."""
    if value is None or value is pd.NA or (isinstance(value, float) and math.isnan(value)):
        return None
    return value.item() if hasattr(value, "item") else value


# ------------------------------------------------------------------ confirming


def baseline_trial(study: optuna.Study) -> optuna.trial.FrozenTrial:
    ref = (study.user_attrs.get("reference") or {}).get("trial")
    if ref is not None:
        return study.trials[ref]
    base = [t for t in study.trials if t.user_attrs.get("role") == "baseline" and t.user_attrs.get("argv")]
    if not base:
        raise UserError(f"study {study.study_name!r} has no baseline trial to confirm against; pass --no-confirm")
    return base[0]


def confirm(study: optuna.Study, export: Export, rounds: int, progress=print) -> Confirmation:
    """Re-measure the winner and the baseline, both up, passes alternating A/B then B/A."""
    from tuner.measure import MeasurementSettings, pooled_rate, run_workload
    from tuner.runner import LlamaServer, free_port
    from tuner.failures import TrialFailure
    from tuner.spec import load_spec
    from tuner.workload import load_workload

    spec_path = study.user_attrs.get("spec_path")
    if not spec_path or not Path(spec_path).is_file():
        raise UserError(f"study {study.study_name!r}: its study file {spec_path} is not here, so its workload "
                        "cannot be re-run; export on the study's host or pass --no-confirm")
    spec = load_spec(spec_path)
    workload = load_workload(list(spec.suites), spec.base_dir)
    stored = study.user_attrs.get("measurement") or {}
    known = MeasurementSettings.__dataclass_fields__
    settings = MeasurementSettings(**{k: v for k, v in stored.items() if k in known})
    base = baseline_trial(study)
    base_argv = strip_host_port(base.user_attrs["argv"])
    for argv in (export.argv, base_argv):
        if not Path(argv[0]).exists():
            raise UserError(f"{argv[0]}: not on this host; export on the study's host or pass --no-confirm")
    log_dir = storage_dir() / "logs" / study.study_name
    timeout = spec.measurement.trial_timeout_s
    winner_t = export.config.get("temperature", 0.0)
    base_t = base.user_attrs.get("config", {}).get("temperature", 0.0)
    rates: dict[str, list[float]] = {"winner": [], "baseline": []}
    drafted = 0
    try:
        with LlamaServer(export.argv, free_port(), log_dir / "confirm-winner.log",
                         ready_timeout_s=timeout, request_timeout_s=timeout) as winner, \
             LlamaServer(base_argv, free_port(), log_dir / "confirm-baseline.log",
                         ready_timeout_s=timeout, request_timeout_s=timeout) as baseline:
            sides = [("winner", winner, winner_t), ("baseline", baseline, base_t)]
            for r in range(rounds):
                for label, server, temperature in (sides if r % 2 == 0 else sides[::-1]):
                    round_settings = MeasurementSettings(
                        warmup=settings.warmup if r == 0 else 0, repetitions=1, n_predict=settings.n_predict,
                        seed=settings.seed, noise_cv=settings.noise_cv)
                    samples = run_workload(server, workload, round_settings, temperature)
                    rates[label].append(pooled_rate(samples))
                    if label == "winner":
                        drafted += sum(s.draft_n for s in samples)
                progress(f"confirm round {r + 1}/{rounds}: winner {rates['winner'][-1]:.1f} t/s, "
                         f"baseline {rates['baseline'][-1]:.1f} t/s")
    except TrialFailure as failure:
        raise UserError(f"confirmation failed: {failure}; see {log_dir}, or pass --no-confirm") from None
    speedup = statistics.median(rates["winner"]) / statistics.median(rates["baseline"])
    return Confirmation(
        rounds=rounds,
        winner_tokens_per_second=rates["winner"],
        baseline_tokens_per_second=rates["baseline"],
        speedup=speedup,
        recorded_speedup=export.metrics.get("speedup", 1.0),
        noise=math.hypot(_cv(rates["winner"]), _cv(rates["baseline"])),
        drafted=drafted,
    )


def _cv(values: list[float]) -> float:
    mean = statistics.fmean(values)
    return statistics.stdev(values) / mean if len(values) > 1 and mean > 0 else 0.0


# ------------------------------------------------------------------ writing


def shell_script(export: Export) -> str:
    m = export.metrics
    lines = [
        "#!/bin/sh",
        f"# Generated by `tuner export` from study {export.study}, trial {export.trial}: {export.policy}.",
        f"# Recorded: {m['tokens_per_second']:.1f} tokens/s, x{m.get('speedup', 1.0):.2f} over the baseline, "
        f"acceptance {m.get('acceptance', 0.0):.2f}, quality {m.get('quality', 0.0):.3f}.",
    ]
    if export.confirmation is not None:
        c = export.confirmation
        lines.append(f"# Confirmed at export: x{c.speedup:.2f} over the baseline in {c.rounds} alternating rounds.")
    lines += [
        f"# Measured on {export.machine.get('cpu_model')} with llama.cpp {export.llama_cpp.get('commit')}.",
        "# --temp sets the tuned temperature as the default; clients may send their own.",
        "# Usage: LLAMA_ARG_HOST=0.0.0.0 LLAMA_ARG_PORT=9000 ./serve.sh [more llama-server flags]",
        "set -eu",
        'exec ' + shlex.join(export.argv) + ' --host "${LLAMA_ARG_HOST:-127.0.0.1}" --port "${LLAMA_ARG_PORT:-8080}" "$@"',
        "",
    ]
    return "\n".join(lines)


def preset_lines(export: Export) -> list[str]:
    """The study's `--models-preset` section: one ``key = value`` per llama-server option.

    A preset names options, not a command, so a numactl prefix cannot be kept: its CPU
    list becomes ``cpu-mask``/``cpu-strict``, and a memory policy is left as a comment
    (start the router under that numactl policy to keep it).
    """
    argv = list(export.argv)
    comments = [f"; tuner export: study {export.study}, trial {export.trial} ({export.policy})"]
    options: dict[str, str] = {}
    if Path(argv[0]).name == "numactl":
        prefix = [argv.pop(0)]
        while argv and argv[0].startswith("-"):
            prefix.append(argv.pop(0))
        for opt in prefix[1:]:
            if opt.startswith("--physcpubind="):
                options["cpu-mask"] = cpu_mask(parse_cpu_list(opt.split("=", 1)[1]))
                options["cpu-strict"] = "1"
            else:
                comments.append(f"; tuned under numactl {opt}: start the router with it to keep that memory policy")
    flags = argv[1:]  # argv[0] is llama-server itself: the router runs its own binary
    i = 0
    while i < len(flags):
        flag = flags[i]
        if not flag.startswith("-"):
            raise UserError(f"{export.study}: cannot express {flag!r} of the command in a preset (not an option)")
        key = flag.lstrip("-")
        has_value = i + 1 < len(flags) and not _is_option(flags[i + 1])
        value = flags[i + 1] if has_value else "true"
        i += 2 if has_value else 1
        if key == "numa" and value == "numactl" and "cpu-mask" in options:
            continue  # the CPUs numactl chose are pinned by cpu-mask now
        if key in options:
            raise UserError(f"{export.study}: the command repeats --{key}; a preset holds one value per option")
        if INI_UNSAFE.search(value):
            raise UserError(f"{export.study}: --{key} value {value!r} contains ; # or a newline, "
                            "which the preset format cannot hold; rename the file or pass the flag on the command line")
        options[key] = value
    return [f"[{export.section}]", *comments, *(f"{k} = {v}" for k, v in options.items())]


def _is_option(token: str) -> bool:
    if not token.startswith("-"):
        return False
    try:
        float(token)
    except ValueError:
        return True
    return False  # a negative number is a value


def merge_preset(path: Path, section: str, lines: list[str]) -> None:
    """Replace (or add) one section of a shared preset file, keeping every other section."""
    preamble: list[str] = []
    sections: dict[str, list[str]] = {}
    current = None
    if path.exists():
        for line in path.read_text().splitlines():
            header = re.fullmatch(r"\s*\[\s*([^\]]*?)\s*\]\s*(?:[;#].*)?", line)
            if header:
                current = header.group(1)
                sections[current] = []
            if current is None:
                preamble.append(line)
            else:
                sections[current].append(line)
    if not any(re.match(r"\s*version\s*=", line) for line in preamble):
        preamble = ["version = 1", "; llama-server --models-preset FILE: one section per exported study (tuner export)",
                    *preamble]
    sections[section] = lines
    blocks = ["\n".join(block).strip("\n") for block in (preamble, *sections.values())]
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text("\n\n".join(b for b in blocks if b) + "\n")
    os.replace(tmp, path)


def write_export(export: Export, out_dir: Path, preset_path: Path) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    script = out_dir / "serve.sh"
    script.write_text(shell_script(export))
    script.chmod(0o755)
    record = export.to_dict()
    json_path = out_dir / "config.json"
    json_path.write_text(json.dumps(record, indent=2) + "\n")
    yaml_path = out_dir / "config.yaml"
    yaml_path.write_text(yaml.safe_dump(record, sort_keys=False))
    merge_preset(preset_path, export.section, preset_lines(export))
    return [script, json_path, yaml_path, preset_path]


# ------------------------------------------------------------------ command


def configure(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Export the chosen configuration of a study: serve.sh, config.json/.yaml and a section of the "
        "shared llama-server --models-preset file. Policies: "
        + "; ".join(f"{k}: {v}" for k, v in POLICIES.items())
        + ". The winner is first re-measured against the baseline, alternating, on this host."
    )
    parser.add_argument("study", help="study name in the storage, or a study file (studies/NAME.yaml)")
    parser.add_argument("--storage", help="Optuna storage URL (default: the study file's, else the shared SQLite file)")
    parser.add_argument("--policy", choices=tuple(POLICIES), default="max-tps", help="selection policy (default: max-tps)")
    parser.add_argument("--min-acceptance", type=float, help="only trials whose draft acceptance is at least this")
    parser.add_argument("--trial", type=int, help="export this feasible trial instead of applying a policy")
    parser.add_argument("--no-confirm", action="store_true", help="skip re-measuring the winner against the baseline")
    parser.add_argument("--rounds", type=int, default=3, help="confirmation rounds (default: 3)")
    parser.add_argument("--out", type=Path, help="output folder (default: reports/STUDY/export)")
    parser.add_argument("--preset", type=Path, help=f"shared preset file (default: reports/{PRESET_FILE})")


def run(args: argparse.Namespace) -> int:
    if args.rounds < 1:
        raise UserError(f"--rounds: must be >= 1, got {args.rounds}")
    study = open_study(args.study, args.storage)
    frame = trials_frame(study)
    number, why = choose(study, frame, args.policy, args.min_acceptance, args.trial)
    export = build_export(study, frame, number, why)
    m = export.metrics
    print(f"chosen: trial {number} ({why}): {m['tokens_per_second']:.1f} tokens/s, "
          f"x{m.get('speedup', 1.0):.2f} over the baseline (recorded)")
    if not args.no_confirm:
        if number == baseline_trial(study).number:
            print("confirm: the winner is the baseline itself; nothing to confirm")
        else:
            c = confirm(study, export, args.rounds)
            export = replace(export, confirmation=c)
            print(f"confirmed speedup: x{c.speedup:.2f} over the baseline (recorded x{c.recorded_speedup:.2f}, "
                  f"measured noise ±{c.noise:.0%}, {c.rounds} rounds)")
            if c.falls_short:
                print(f"WARNING: the confirmation falls short of the recorded speedup by more than the measured noise "
                      f"(x{c.speedup:.2f} against x{c.recorded_speedup:.2f}, noise ±{c.noise:.0%}): the study's figure "
                      "was optimistic, or the machine is busier now")
            if export.config.get("spec_type", "none") != "none" and c.drafted == 0:
                print("WARNING: the winner drafted nothing while confirming: speculation was off")
    for row in export.per_content_type:
        print(f"best on {row['suite']}: trial {row['trial']}, {row['method']}, K={row['draft_max']}, "
              f"T={row['temperature']}: {row['tokens_per_second']:.1f} tokens/s")
    out_dir = args.out or reports_dir() / study.study_name / "export"
    for path in write_export(export, out_dir, args.preset or reports_dir() / PRESET_FILE):
        print(f"wrote {path}")
    return 0
