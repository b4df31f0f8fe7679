"""The package's shape: no import cycles, ARCHITECTURE.md names modules that exist, one record writer."""

from __future__ import annotations

import ast
import io
import re
import tokenize
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
        path = (ROOT if name.startswith("benchmarks") else PACKAGE) / name
        assert path.with_suffix(".py").is_file() or (path / "__init__.py").is_file(), name


def test_only_the_store_touches_user_attrs():
    """Records are written and read through tuner.storage.store only. Exceptions: the heartbeat retry hands
    Optuna the attrs ``store.requeue_attrs`` made, and the journal a trial with ``store.record_attrs``;
    the outage wrapper names storage methods."""
    allowed = {
        "tuner/storage/store.py",
        "tuner/storage/coordination.py",
        "tuner/storage/journal.py",
        "tuner/storage/outage.py",
    }
    offenders = [
        str(p.relative_to(ROOT))
        for p in PACKAGE.rglob("*.py")
        if re.search(r"user_attrs|set_user_attr", p.read_text()) and str(p.relative_to(ROOT)) not in allowed
    ]
    assert offenders == []


def imports_of(path: Path) -> set[str]:
    """Top-level names of every module ``path`` imports, at module level or inside functions."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            names.add(node.module.split(".")[0])
    return names


def test_the_product_never_imports_its_benchmarks():
    """benchmarks/ sits outside the installed package: an import of it from tuner/ breaks every installed tuner."""
    offenders = [str(p.relative_to(ROOT)) for p in PACKAGE.rglob("*.py") if "benchmarks" in imports_of(p)]
    assert offenders == []
    assert not (PACKAGE / "bench").exists()


def test_every_benchmark_module_is_named():
    """Each module of benchmarks/ has its line in ARCHITECTURE.md, as tuner/'s do."""
    text = (ROOT / "ARCHITECTURE.md").read_text()
    modules = [
        str(p.relative_to(ROOT).with_suffix(""))
        for p in (ROOT / "benchmarks").rglob("*.py")
        if p.stem not in ("__init__", "__main__")
    ]
    named = [m for m in modules if f"`{m}`" in text or f"`{m.rsplit('/', 1)[0]}/`" in text]
    assert modules and sorted(named) == sorted(modules)


def same_in_form(a: str, b: str) -> bool:
    """Two module names that differ only in form (deployed/deployment, launcher/launching): one word twice."""
    stem = lambda name: re.sub(r"(ment|ing|er|ed|ion|s)$", "", name)  # noqa: E731
    return a != b and stem(a) == stem(b)


def test_module_names_tell_rooms_apart():
    """One module per name: outside commands/ (named after their subcommands) no name twice in tuner/, no two names
    in one folder that differ only in form, and nothing named like a standard-library module."""
    import sys

    modules = [p for p in PACKAGE.rglob("*.py") if p.stem not in ("__init__", "__main__")]
    modules += [p for p in (ROOT / "benchmarks").rglob("*.py") if p.stem not in ("__init__", "__main__")]
    assert [str(p) for p in modules if p.stem in sys.stdlib_module_names] == []
    stems = [p.stem for p in modules if p.parent.name != "commands" and PACKAGE in p.parents]
    assert sorted({s for s in stems if stems.count(s) > 1}) == []
    for folder in {p.parent for p in modules}:
        names = sorted(p.stem for p in folder.glob("*.py"))
        assert [(a, b) for a in names for b in names if a < b and same_in_form(a, b)] == [], folder
    assert same_in_form("deployed", "deployment") and same_in_form("launcher", "launching")
    assert not same_in_form("export", "export_study")


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


# ---- the house's rules, each a finder over one file's source and a test over tuner/ ----

FUNCTION_LINES = 60
PARAMETERS = 7
ONE_LETTER_NAMES = 120


def sources() -> dict[str, str]:
    """Every module of tuner/ and of its benchmarks by its path from the repository root."""
    files = sorted(PACKAGE.rglob("*.py")) + sorted((ROOT / "benchmarks").rglob("*.py"))
    return {str(p.relative_to(ROOT)): p.read_text() for p in files}


def functions(source: str) -> list[ast.FunctionDef | ast.AsyncFunctionDef]:
    return [
        node
        for node in ast.walk(ast.parse(source))
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
    ]


def long_functions(source: str) -> list[str]:
    """Functions over ``FUNCTION_LINES`` lines, from the ``def`` line to the last, docstring included."""
    return [
        f"{node.name} ({node.end_lineno - node.lineno + 1} lines)"
        for node in functions(source)
        if node.end_lineno is not None and node.end_lineno - node.lineno + 1 > FUNCTION_LINES
    ]


def parameter_heavy(source: str) -> list[str]:
    """Functions taking more than ``PARAMETERS`` named parameters, positional and keyword-only alike (``self``
    and ``cls`` do not count, nor ``*args`` and ``**kwargs``): past that, the things that travel together
    belong in one settings object."""
    return [
        f"{node.name} ({count})"
        for node in functions(source)
        if (count := len(named_parameters(node))) > PARAMETERS
    ]


def named_parameters(node: ast.FunctionDef | ast.AsyncFunctionDef) -> list[str]:
    args = node.args
    every = args.posonlyargs + args.args + args.kwonlyargs
    return [a.arg for a in every if a.arg not in ("self", "cls")]


SCOPES_NOT_COUNTED = (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp, ast.Lambda)


def bound_names(node: ast.AST) -> list[str]:
    """Names a tree binds outside comprehensions and lambdas: assignment targets of every kind (plain,
    annotated, augmented, for, with ... as, walrus), exception names and function parameters."""
    if isinstance(node, SCOPES_NOT_COUNTED):
        return []
    names = []
    if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
        names.append(node.id)
    elif isinstance(node, ast.ExceptHandler) and node.name:
        names.append(node.name)
    elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        args = node.args
        every = args.posonlyargs + args.args + args.kwonlyargs + [a for a in (args.vararg, args.kwarg) if a]
        names.extend(a.arg for a in every)
    for child in ast.iter_child_nodes(node):
        names.extend(bound_names(child))
    return names


def one_letter_names(source: str) -> list[str]:
    """The one-letter names a module binds (``_``, the name for what is thrown away, not among them)."""
    return [n for n in bound_names(ast.parse(source)) if len(n) == 1 and n != "_"]


# A comment or docstring that dates itself: an issue number, a section of the benchmarks, a demo's figure, a
# research note by its file number, a design file the repository does not have.
HISTORY = re.compile(
    r"\bissue #?\d+"
    r"|\b(?:the|this|that) issue\b"
    r"|\bmake (?:bench|demo)(?:'s|:)? \d"
    r"|(?<![\w-])bench (?:section )?\d+[a-d]?\b"
    r"|\bbench(?:mark)? section \d"
    r"|\bsection \d+[a-d]? of (?:the )?(?:make )?bench"
    r"|\bsection (?-i:\d[a-e])\b"
    r"|(?-i:(?<![\w.])\d[a-e]'s)\b"
    r"|(?-i:\(\d[a-e]\))"
    r"|\bseeds? 0\d\d\b"
    r"|\bDESIGN\.md\b",
    flags=re.IGNORECASE,
)


def history_citations(source: str) -> list[str]:
    """Comments (``tokenize``) and docstrings (``ast.get_docstring``) that cite history: what a line says
    should be its reason, true today. Strings a program prints are not comments and are not read."""
    found = [
        f"line {token.start[0]}: {token.string.strip()}"
        for token in tokenize.generate_tokens(io.StringIO(source).readline)
        if token.type == tokenize.COMMENT and HISTORY.search(token.string)
    ]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node, clean=False)
            if doc and (match := HISTORY.search(doc)):
                found.append(f"line {getattr(node, 'lineno', 1)} docstring: ...{match.group(0)}...")
    return found


def test_the_rule_finders_find_planted_cases():
    long_body = "\n".join(f"    x{i} = {i}" for i in range(FUNCTION_LINES))
    assert long_functions(f"def short():\n    pass\n\n\ndef long():\n{long_body}\n") == [
        f"long ({FUNCTION_LINES + 1} lines)"
    ]
    assert parameter_heavy(
        "def eight(a, b, c, d, e, f, g, h): ...\n"
        "def seven(a, b, c, d, e, f, g, *args, **kwargs): ...\n"
        "def keywords(a, b, c, d, *, e, f, g, h): ...\n"
        "def only(a, /, b, c, d, e, f, g): ...\n"
        "class K:\n    def method(self, b, c, d, e, f, g, h): ...\n"
        "    @classmethod\n    def make(cls, b, c, d, e, f, g, h, i): ...\n"
    ) == ["eight (8)", "keywords (8)", "make (8)"]
    planted = (
        "a = 1\nb: int = 2\nc += 3\nfor d in []: pass\nwith open('x') as e: pass\n"
        "try: pass\nexcept OSError as f: pass\nif (g := 4): pass\ndef func(i, *j, k, **m): pass\n"
        "n, (o, p) = 1, (2, 3)\n_ = 5\nlonger = 6\nq.r = 7\ns[0] = 8\n"
        "[t for t in []]\n{u: 1 for u in []}\n(v for v in [])\nlambda w: w\n"
    )
    assert sorted(one_letter_names(planted)) == list("abcdefgijkmnop")
    assert history_citations(
        '"""Fixed for issue 12, see make bench 1c."""\n'
        "x = 1  # bench 1b showed it\n"
        "y = 2  # llama-bench 12 threads; Cochran's section 10.6\n"
        "z = 3  # a 3B's draft, 0.5B's cost; a (2D) array; seed 19 of 20; section 10.6b\n"
        "w = 4  # as 1c's workload\n"
        "v = 5  # the rates of section 1b (seed 003, DESIGN.md) and of (1d)\n"
        "def f():\n"
        '    """The issue\'s targets."""\n'
        '    print("rules (issue 22)")  # a printed caption is not a comment\n'
    ) == [
        "line 2: # bench 1b showed it",
        "line 5: # as 1c's workload",
        "line 6: # the rates of section 1b (seed 003, DESIGN.md) and of (1d)",
        "line 1 docstring: ...issue 12...",
        "line 7 docstring: ...The issue...",
    ]


def test_no_function_is_over_60_lines():
    assert [f"{path}:{f}" for path, text in sources().items() for f in long_functions(text)] == []


def test_no_function_takes_more_than_7_parameters():
    """Past seven, positional or keyword-only, what travels together is one settings object (a frozen
    dataclass)."""
    heavy = [f"{path}:{f}" for path, text in sources().items() for f in parameter_heavy(text)]
    assert heavy == []


def test_few_one_letter_names():
    """A name says what a thing is: one-letter names are for indices and formulas, and there are few."""
    names = {path: len(one_letter_names(text)) for path, text in sources().items()}
    count = sum(names.values())
    worst = sorted(names.items(), key=lambda item: -item[1])[:5]
    assert count < ONE_LETTER_NAMES, f"{count} one-letter names in tuner/ (most in {worst})"


def test_no_comment_cites_history():
    """No comment or docstring cites an issue number or a bench section: it says the reason in a sentence."""
    cited = [f"{path}: {c}" for path, text in sources().items() for c in history_citations(text)]
    assert cited == []


def test_every_help_page_prints(capsys):
    """`tuner --help` and each command's --help exit 0 (a bare % in a help string once made the top page a
    traceback)."""
    from benchmarks.cli import BENCHMARKS
    from tuner.cli import TUNER, main

    for line in (TUNER, BENCHMARKS):
        for argv in [["--help"]] + [[name, "--help"] for name, _, _ in line.subcommands]:
            with pytest.raises(SystemExit) as done:
                main(argv, line)
            assert done.value.code == 0, argv
            assert f"usage: {line.prog}" in capsys.readouterr().out, argv


def floors_in(text: str) -> list[tuple[str, ...]]:
    """The floors of tuner/, lowest first, from the numbered list under ARCHITECTURE.md's "## Floors": each
    item's names in backticks are one floor's stages. A module imports only from its own floor or those below."""
    section = re.search(r"^## Floors\n(.*?)(?=^## |\Z)", text, flags=re.MULTILINE | re.DOTALL)
    if section is None:
        return []
    return [
        tuple(re.findall(r"`([^`]+)`", line))
        for line in section.group(1).splitlines()
        if re.match(r"\d+\. ", line)
    ]


FLOORS = floors_in((ROOT / "ARCHITECTURE.md").read_text())


def test_the_floor_parser_reads_a_planted_list():
    text = "## Floors\n\nProse with `ignored`.\n\n1. `a`, `b`\n2. `c`\n\n## Modules\n\n1. `d`\n"
    assert floors_in(text) == [("a", "b"), ("c",)]
    assert floors_in("## Modules\n\n1. `a`\n") == []


def test_architecture_draws_the_floors_once():
    """The floors are read from ARCHITECTURE.md: found, and every stage on exactly one floor."""
    stages = [s for floor in FLOORS for s in floor]
    assert FLOORS and all(FLOORS), "no ## Floors list in ARCHITECTURE.md"
    assert len(stages) == len(set(stages)), stages


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


IMPORTED_MODULES = 15


def modules_imported(source: str, package: str, known: set[str]) -> set[str]:
    """The ``tuner.*`` modules a module's source imports from, at module level or inside functions alike:
    ``import a.b`` names ``a.b``; ``from a import b`` names ``a.b`` where that is a module, else ``a`` (a package
    counts where a name is taken from it, not again for each submodule taken through it). ``package``: the
    module's own package, for relative imports; ``known``: every module of ``tuner/``."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
            found |= {f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names}
    return {m for m in found if m.startswith("tuner.") and m in known}


def test_the_import_counter_reads_a_planted_module():
    known = {"tuner", "tuner.a", "tuner.b", "tuner.b.c", "tuner.b.d", "tuner.b.e"}
    source = (
        "import os\nfrom tuner import a\nfrom tuner.b import c, d\nfrom tuner.b import CONSTANT\n"
        "def f():\n    from tuner.b.d import y\n    import tuner.b.e\n    from .c import z\n"
    )
    assert modules_imported(source, "tuner.b", known) == {
        "tuner.a",
        "tuner.b",
        "tuner.b.c",
        "tuner.b.d",
        "tuner.b.e",
    }


def test_no_module_imports_from_more_than_15_modules():
    """A module that needs more than fifteen of the package's modules mixes concerns: each concern its own
    module, or the stage's ``__init__`` offering what the others take from it."""
    files = {module_name(f): f for f in PACKAGE.rglob("*.py")}
    heavy = []
    for module, path in files.items():
        package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
        count = len(modules_imported(path.read_text(), package, set(files)) - {module})
        if count > IMPORTED_MODULES:
            heavy.append(f"{module} ({count})")
    assert heavy == []


def test_storage_and_decisions_take_what_they_need_as_arguments():
    offenders = [
        f"{m} -> {t}"
        for m, targets in import_graph().items()
        if stage_of(m) in ("storage", "decisions")
        for t in targets
        if stage_of(t) in ("prepare", "run")
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
