"""The package's shape: no import cycles, ARCHITECTURE.md names modules that exist, one record writer."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "tuner"


def module_name(path: Path) -> str:
    name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
    return name.removesuffix(".__init__")


def import_graph() -> dict[str, set[str]]:
    """Module -> tuner modules it imports, at module level or inside functions alike."""
    files = {module_name(f): f for f in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = {m: set() for m in files}
    for module, path in files.items():
        package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")
                    base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
                targets = [base] + [f"{base}.{a.name}" for a in node.names]
            else:
                continue
            graph[module] |= {t for t in targets if t in files and t != module}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    return found


def test_cycle_finder_finds_a_planted_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_tuner_has_no_import_cycle():
    assert cycles(import_graph()) == []


def test_architecture_names_only_modules_that_exist():
    text = (ROOT / "ARCHITECTURE.md").read_text()
    rows = re.findall(r"^\| `([^|]+)` \|", text, flags=re.MULTILINE)
    named = {name.strip("`/ ") for row in rows for name in re.split(r"`, `|`\s*,\s*`", row)}
    assert named, "no module table found"
    for name in named:
        path = PACKAGE / name
        assert path.with_suffix(".py").is_file() or (path / "__init__.py").is_file(), name


def test_only_the_store_touches_user_attrs():
    """Records are written and read through tuner.storage.store only. Exceptions: the heartbeat retry hands
    Optuna the attrs ``store.requeue_attrs`` made, and the journal a trial with ``store.record_attrs``;
    the outage wrapper names storage methods; the benchmark replay keys its simulated trials."""
    allowed = {
        "tuner/storage/store.py",
        "tuner/storage/coordination.py",
        "tuner/storage/journal.py",
        "tuner/storage/outage.py",
        "tuner/bench/replay.py",
    }
    offenders = [
        str(p.relative_to(ROOT))
        for p in PACKAGE.rglob("*.py")
        if re.search(r"user_attrs|set_user_attr", p.read_text()) and str(p.relative_to(ROOT)) not in allowed
    ]
    assert offenders == []


def stage_modules() -> list[str]:
    """Every module of ``tuner/`` and its stage subpackages (the synthetic family is named as a whole), as paths."""
    folders = [PACKAGE] + [
        d for d in PACKAGE.iterdir() if (d / "__init__.py").is_file() and d.name != "synthetic"
    ]
    return [
        str(p.relative_to(PACKAGE).with_suffix(""))
        for folder in folders
        for p in folder.glob("*.py")
        if p.stem != "__init__"
    ]


def test_architecture_names_every_module():
    """A module added without a line in ARCHITECTURE.md is a module nobody can find."""
    text = (ROOT / "ARCHITECTURE.md").read_text()
    unnamed = [m for m in stage_modules() if f"`{m}`" not in text]
    assert unnamed == []


def test_the_top_level_shows_stages_not_modules():
    """At most 15 modules directly in tuner/; every subpackage says in its __init__ what it offers."""
    top = [p for p in PACKAGE.glob("*.py")]
    assert len(top) <= 15, sorted(p.name for p in top)
    for folder in PACKAGE.iterdir():
        if (folder / "__init__.py").is_file():
            assert ast.get_docstring(ast.parse((folder / "__init__.py").read_text())), folder.name


def test_no_function_is_over_100_lines():
    long = [
        f"{p.relative_to(ROOT)}:{node.name} ({node.end_lineno - node.lineno + 1} lines)"
        for p in PACKAGE.rglob("*.py")
        for node in ast.walk(ast.parse(p.read_text()))
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        and node.end_lineno - node.lineno + 1 > 100
    ]
    assert long == []


def test_every_help_page_prints(capsys):
    """`tuner --help` and each command's --help exit 0 (a bare % in a help string once made the top page a
    traceback)."""
    from tuner.cli import SUBCOMMANDS, main

    for argv in [["--help"]] + [[name, "--help"] for name, _, _ in SUBCOMMANDS]:
        with pytest.raises(SystemExit) as done:
            main(argv)
        assert done.value.code == 0, argv
        assert "usage: tuner" in capsys.readouterr().out, argv


# The floors of tuner/, lowest first, as ARCHITECTURE.md draws them: a module imports only from its own
# floor or those below it. ``tuner`` is the package itself; the synthetic family sits beside the bench.
FLOORS = [
    ("tuner", "errors", "paths", "eta", "progress", "figures", "knobs"),
    ("machine",),
    ("models",),
    ("measurement",),
    ("studyfile",),
    ("storage",),
    ("decisions",),
    ("search",),
    ("context",),
    ("run",),
    ("output",),
    ("traffic", "synthetic", "bundle"),
    ("bench",),
    ("commands",),
    ("cli",),
]


def stage_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    floor = {stage: i for i, stages in enumerate(FLOORS) for stage in stages}
    return sorted(
        f"{m} -> {t}"
        for m, targets in graph.items()
        for t in targets
        if floor[stage_of(m)] < floor[stage_of(t)]
    )


def test_every_stage_has_a_floor():
    stages = {stage_of(m) for m in import_graph()}
    assert stages == {s for floor in FLOORS for s in floor}


def test_the_floor_finder_finds_a_planted_upward_import():
    assert upward_imports(
        {"tuner.storage.x": {"tuner.run.objective"}, "tuner.run.objective": {"tuner.storage.x"}}
    ) == ["tuner.storage.x -> tuner.run.objective"]


def test_imports_point_down_the_floors():
    """No lower stage imports a higher one (which also means no cycle among the folders)."""
    assert upward_imports(import_graph()) == []


def test_storage_and_decisions_take_what_they_need_as_arguments():
    offenders = [
        f"{m} -> {t}"
        for m, targets in import_graph().items()
        if stage_of(m) in ("storage", "decisions")
        for t in targets
        if t == "tuner.context" or stage_of(t) == "run"
    ]
    assert offenders == []


def test_only_the_commands_parse_arguments():
    """argparse is imported by tuner/cli.py and tuner/commands/ only: domain modules take typed parameters."""
    importers = []
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else []
            )
            if any(n.split(".")[0] == "argparse" for n in names):
                importers.append(str(path.relative_to(ROOT)))
                break
    offenders = [p for p in importers if p != "tuner/cli.py" and not p.startswith("tuner/commands/")]
    assert importers and offenders == []
