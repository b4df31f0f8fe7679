"""The study files shipped in studies/ and `make bench` itself, as a user runs them.

Why: the default space gained n-gram knobs (ranges) and `make bench` broke on
studies/bench-grid.yaml ("a grid needs explicit choices") while no test read that file.
Here every study file is checked three ways:

- its every field parsed (``load_spec``) in a copy of the repository's layout whose absent
  models stand in as empty files: this runs for every study on every machine;
- ``tuner run STUDY --check`` (models read, space resolved for this machine, prompts counted
  in the target's tokens) where its models are here; skipped, naming the file and how to get
  it, only where one is absent (``$MODELS`` for the Qwen studies, ``tuner models gemma3-270m``);
- ``python -m benchmarks bench --quick``: every section of ``make bench`` on the default studies, each on its
  smallest input, sections 5 and 6 on bench-grid's target (a couple of minutes on two cores).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
import yaml

from tuner.cli import main
from tuner.paths import REPO_ROOT
from tuner.studyfile.spec import load_spec

STUDIES = sorted((REPO_ROOT / "studies").glob("*.yaml"))
_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}|\$([A-Za-z_][A-Za-z0-9_]*)")
HOW_TO_GET = {
    "MODELS": "set MODELS to the folder holding it (see the study file's header)",
    "gemma3-270m": "run `tuner models gemma3-270m` (the real-model extra)",
    "synthetic/scale": "run `tuner synthetic --scale`",
    "synthetic": "run `make models`",
}


def model_paths(study: Path) -> list[str]:
    """The target and draft paths as the study file writes them (``${VAR}`` unexpanded)."""
    data = yaml.safe_load(study.read_text())
    drafts = [d["path"] if isinstance(d, dict) else d for d in data.get("drafts") or []]
    target = data["target"]["path"] if isinstance(data["target"], dict) else data["target"]
    return [target, *drafts]


def expanded(raw: str, study: Path, env: dict) -> Path | None:
    """Where a model path points with ``env`` (None: a variable it names is not set)."""
    names = [a or b for a, b in _VAR.findall(raw)]
    if any(n not in env for n in names):
        return None
    path = Path(_VAR.sub(lambda m: env[m.group(1) or m.group(2)], raw)).expanduser()
    return path if path.is_absolute() else study.parent / path


def how_to_get(raw: str) -> str:
    return next((fix for key, fix in HOW_TO_GET.items() if key in raw), "put the file there")


def absent_models(study: Path) -> list[str]:
    """Each model of the study that is not on this machine, with how to get it."""
    absent = []
    for raw in model_paths(study):
        path = expanded(raw, study, dict(os.environ))
        if path is None or not path.is_file():
            absent.append(
                f"{raw} ({'a variable it names is not set' if path is None else 'absent'}; {how_to_get(raw)})"
            )
    return absent


def stand_in_layout(study: Path, root: Path, env: dict) -> Path:
    """A copy of the repository's layout under ``root``: every folder a study reaches by ``..`` linked,
    ``studies/`` and ``models/`` real folders (a study's ``..`` is its real parent), each model the study
    names linked when it is here and an empty stand-in file when not. Returns the study's copy."""
    root.mkdir()
    for entry in REPO_ROOT.iterdir():
        if entry.name not in ("studies", "models", ".git"):
            (root / entry.name).symlink_to(entry)
    (root / "studies").mkdir()
    for entry in study.parent.iterdir():
        if entry.is_dir():
            (root / "studies" / entry.name).symlink_to(entry)
    copy = root / "studies" / study.name
    copy.write_text(study.read_text())
    for raw in model_paths(study):
        where = expanded(raw, copy, env)
        real = expanded(raw, study, dict(os.environ))
        where.parent.mkdir(parents=True, exist_ok=True)
        if not where.exists():
            if real is not None and real.is_file():
                where.symlink_to(real)
            else:
                where.write_bytes(b"")
    return copy


@pytest.mark.parametrize("study", STUDIES, ids=lambda p: p.stem)
def test_every_field_of_every_study_file_parses_here_or_not_its_models(study, tmp_path, monkeypatch):
    """Everything ``load_spec`` checks (names, space file and overrides, suites, objectives, measurement,
    budget, sampler, race, warm start) on every machine; the models' contents are the next test's."""
    env = dict(os.environ)
    for name in {a or b for raw in model_paths(study) for a, b in _VAR.findall(raw)}:
        env[name] = str(tmp_path / f"env-{name}")  # stand-ins never go into a real models folder
        monkeypatch.setenv(name, env[name])
    copy = stand_in_layout(study, tmp_path / "repo", env)
    spec = load_spec(copy)
    assert spec.name == (yaml.safe_load(study.read_text()).get("name") or study.stem)
    assert spec.suites and spec.objectives and spec.budget_trials >= 1
    assert spec.target.name == Path(model_paths(study)[0]).name


@pytest.mark.llama
@pytest.mark.parametrize("study", STUDIES, ids=lambda p: p.stem)
def test_every_study_file_passes_check_where_its_models_are(study, llama_bin_dir, request, capsys):
    if any("models/synthetic/scale/" in raw for raw in model_paths(study)):
        request.getfixturevalue("scale_models")  # generated once, like `make study STUDY=scale`
    elif any("models/synthetic/" in raw for raw in model_paths(study)):
        request.getfixturevalue("synthetic_models")  # generated once, like `make models`
    absent = absent_models(study)
    if absent:
        pytest.skip(f"{study.name}: model file not on this machine: {absent[0]}")
    assert main(["run", str(study), "--check"]) == 0
    assert load_spec(study).name in capsys.readouterr().out  # the resolved space, named by its study
    if study.stem == "bench-grid":  # `make bench` records its whole space: every knob must be choices
        from benchmarks.grid import grid_configs
        from tuner.prepare import prepare

        assert len(grid_configs(prepare(load_spec(study)).space)) > 1


def test_bench_quick_runs_every_section_of_make_bench(synthetic_models, tmp_path, capsys):
    """`make bench`'s own studies, every section on its smallest input; sections 5 and 6 on bench-grid's target
    instead of scale-grid's 1.3 GB one (they took nine of this test's eleven minutes on two cores; the scale
    members belong in `make bench` and the studies, and scale-grid.yaml passes `--check` above)."""
    from benchmarks.cli import main as bench_main

    out = tmp_path / "bench"
    scale_grid = REPO_ROOT / "studies" / "bench-grid.yaml"
    assert bench_main(["bench", "--quick", "--scale-grid-study", str(scale_grid), "--out", str(out)]) == 0
    result = json.loads((out / "bench.json").read_text())
    sections = [
        "search",
        "search_operator",
        "search_held_out",
        "decisions",
        "launch_size",
        "overhead",
        "concurrency",
        "repeatability",
        "gguf_read",
        "scale_regime",
        "quantization",
        "serve",
    ]
    assert result["quick"] is True and set(sections) <= set(result)
    assert set(result["timings"]) >= {f"{s}_s" for s in sections} | {"total_s"}
    grid = (out / "grid-bench-grid.csv").read_text().splitlines()
    assert len(grid) > 2 and grid[1].startswith("none,")  # the baseline first, then its launch-mates
    assert result["search"]["configurations"] == len(grid) - 1
    assert result["overhead"]["rounds"] == 1 and result["overhead"]["n_predict"] == 8
    assert [c["users"] for c in result["concurrency"]["levels"]] == [1, 2, 4]
    assert len(result["repeatability"]["runs"]) == 2 and len(result["repeatability"]["holds"]) == 2
    assert [Path(f["path"]).name for f in result["gguf_read"]["files"]] == ["target.gguf"]
    assert len(result["launch_size"]["cells"]) == 9  # 1d: every launch and round spread of 1c's grid
    scale = result["scale_regime"]["suites"]  # 5: the scale target's sweep, per suite, the baseline first
    assert list(scale) == ["code", "prose", "summarize"]
    quick_suites = {p.name for p in out.glob("quick-*.yaml")}  # each content type's sweep on one prompt of it
    assert {"quick-prose.yaml", "quick-summarize.yaml"} <= quick_suites
    assert all(Path(s["table"]).read_text().splitlines()[1].startswith("none,") for s in scale.values())
    quant = result["quantization"]  # 6: the target's Q4_0 against its F16, two rounds in --quick
    assert quant["source"] == "target.gguf" and len(quant["ratios"]) == 2
    serve = result[
        "serve"
    ]  # 7: the proxy at 1 and 64 streaming clients, the classifier on every built-in suite
    assert [x["clients"] for x in serve["latency"]] == [1, 64, 64] and len(serve["accuracy"]) == 10
    md = (out / "bench.md").read_text()
    assert (
        md.startswith("# python -m benchmarks bench (--quick")
        and md.count("\n## ") == 12
        and "Whole bench:" in md
    )
