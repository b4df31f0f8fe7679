"""optuna-dashboard on the studies' storage (`tuner dashboard`, `make dashboard`).

Before serving, every study is annotated for a reader: objective names instead of
"Objective 0", a study note (target, machine, build, floor, baseline, best feasible),
and one note per trial with its exact llama-server command line (and the failure
reason of failed trials). Notes are written only when their text changed, so running
the dashboard again leaves the storage as it was. The server binds 127.0.0.1 by
default: the dashboard has no authentication and can rename or delete studies.
"""

from __future__ import annotations

import argparse
import shlex
import warnings

import optuna

from tuner.errors import UserError
from tuner.analysis import DEFAULT_OBJECTIVES, open_study, require_storage, strip_host_port
from tuner.spec import default_storage_url
from tuner.study import best_feasible

LOOPBACK = ("127.0.0.1", "localhost", "::1")


def study_note(study: optuna.Study) -> str:
    a = study.user_attrs
    target, fp = a.get("target") or {}, a.get("fingerprint") or {}
    quality = a.get("quality") or {}
    reference = a.get("reference") or {}
    lines = [
        f"## {study.study_name}",
        f"- **target**: {target.get('name') or target.get('path')} ({target.get('architecture')}, "
        f"{target.get('quantization')}, {(target.get('weights_bytes') or 0) / 1e9:.2f} GB)",
        f"- **machine**: {fp.get('cpu_model')}, {fp.get('physical_cores')} cores, NUMA nodes {fp.get('numa_nodes')}",
        f"- **llama.cpp**: {fp.get('llama_commit')} ({fp.get('llama_build_flags')})",
        f"- **quality**: {quality.get('scorer')} scorer, floor {quality.get('floor')} "
        "(a trial is feasible when its `constraint_quality` attr is <= 0)",
    ]
    if reference.get("tokens_per_second"):
        lines.append(f"- **baseline**: trial {reference.get('trial')}, {reference['tokens_per_second']:.1f} tokens/s")
    best = best_feasible(study)
    if best is not None:
        m = best.user_attrs["metrics"]
        lines.append(f"- **best feasible**: trial {best.number}, {m['tokens_per_second']:.1f} tokens/s, "
                     f"x{m.get('speedup', 1.0):.2f} over the baseline")
    lines += ["", f"`tuner report {study.study_name}` draws the fronts and the roofline; "
                  f"`tuner export {study.study_name}` writes the winner's launch script."]
    return "\n".join(lines)


def trial_note(trial: optuna.trial.FrozenTrial) -> str:
    a = trial.user_attrs
    lines = [f"**role**: {a.get('role', 'search')}"]
    m = a.get("metrics")
    if trial.state == optuna.trial.TrialState.COMPLETE and m:
        verdict = "feasible" if a.get("constraint_quality", 1.0) <= 0 else "below the quality floor"
        lines.append(f"{m['tokens_per_second']:.1f} tokens/s, x{m.get('speedup', 1.0):.2f} over the baseline, "
                     f"acceptance {m.get('acceptance', 0.0):.2f}, quality {m.get('quality', 0.0):.3f}: {verdict}"
                     + (" (noisy)" if a.get("noisy") else ""))
    if a.get("failure_reason"):
        lines.append(f"**failed**: {a['failure_reason']}: {a.get('failure_detail', '')}")
    if a.get("argv"):
        lines += ["", "```sh", shlex.join(strip_host_port(a["argv"])) + " --host 127.0.0.1 --port 8080", "```"]
    return "\n".join(lines)


def annotate(storage_url: str) -> int:
    """Objective names and notes on every study of the storage; returns the notes written."""
    from optuna_dashboard import get_note, save_note

    written = 0
    for name in optuna.get_all_study_names(storage_url):
        study = open_study(name, storage_url)
        objectives = list(study.user_attrs.get("objectives") or DEFAULT_OBJECTIVES)
        if len(objectives) == len(study.directions) and study.metric_names != objectives:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                study.set_metric_names(objectives)  # the dashboard's axis and column names
        note = study_note(study)
        if get_note(study) != note:
            save_note(study, note)
            written += 1
        for frozen in study.get_trials(deepcopy=False):
            if not frozen.state.is_finished():
                continue
            body = trial_note(frozen)
            trial = optuna.trial.Trial(study, frozen._trial_id)
            if get_note(trial) != body:
                save_note(trial, body)
                written += 1
    return written


def configure(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Serve optuna-dashboard on the studies' storage: every study, its Pareto front, each trial's "
        "attrs, and a note per trial with its exact llama-server command line."
    )
    parser.add_argument("--storage", default=None, help=f"Optuna storage URL (default: {default_storage_url()})")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default: 127.0.0.1; the dashboard has no login)")
    parser.add_argument("--port", type=int, default=8080, help="port (default: 8080)")
    parser.add_argument("--no-notes", action="store_true", help="serve as is, without writing notes into the storage")


def run(args: argparse.Namespace) -> int:
    from optuna_dashboard import run_server

    url = args.storage or default_storage_url()
    require_storage(url)
    if not 0 < args.port < 65536:
        raise UserError(f"--port: must be 1-65535, got {args.port}")
    if not args.no_notes:
        print(f"dashboard: {annotate(url)} notes updated", flush=True)
    if args.host not in LOOPBACK:
        print(f"dashboard: listening on {args.host}: anyone who can reach it can edit or delete studies", flush=True)
    print(f"dashboard: http://{args.host}:{args.port}/dashboard (Ctrl-C stops it)", flush=True)
    try:
        run_server(url, host=args.host, port=args.port)
    except KeyboardInterrupt:
        pass
    except OSError as err:
        raise UserError(f"--host {args.host} --port {args.port}: cannot listen ({err.strerror}); pick another port") from None
    return 0
