"""Target variants (``target: {path, quantize: [...]}``): the study field, the knob target_quant, the argv,
memory, and a real study on the synthetic target whose Q2_K is over the KLD ceiling."""

from __future__ import annotations

import inspect
from dataclasses import replace
from pathlib import Path

import pytest
import yaml
from gguf_factory import write_gguf

import tuner.measurement.server_process
from benchmarks.replay import replay_record
from tuner.errors import UserError
from tuner.knobs.config import TrialConfig
from tuner.studyfile.spec import DEFAULT_TARGET_MAX_KLD, load_spec


def write_study(tmp_path: Path, target, quality: dict | None = None) -> Path:
    write_gguf(tmp_path / "t.gguf")
    (tmp_path / "text.txt").write_text("some text " * 100)
    path = tmp_path / "study.yaml"
    quality = quality if quality is not None else {"scorer": "kld", "floor": 0.5, "text_file": "text.txt"}
    path.write_text(yaml.safe_dump({"name": "tq", "target": target, "quality": quality}))
    return path


def test_a_target_entry_lists_variants_and_the_kld_ceiling_defaults(tmp_path):
    spec = load_spec(write_study(tmp_path, {"path": "t.gguf", "quantize": ["q8_0", "Q4_K_M"]}))
    assert spec.target == tmp_path / "t.gguf"
    assert [(r.source.name, r.type) for r in spec.target_quantize] == [
        ("t.gguf", "Q8_0"),
        ("t.gguf", "Q4_K_M"),
    ]
    assert spec.quality.max_kld == DEFAULT_TARGET_MAX_KLD
    assert load_spec(write_study(tmp_path, "t.gguf")).target_quantize == ()  # a plain path: as before


def test_a_study_of_target_variants_without_quality_is_scored_by_kld_on_the_built_in_text(tmp_path):
    from tuner.measurement.quality import builtin_text
    from tuner.output.check_text import _quality_text

    path = tmp_path / "study.yaml"
    write_study(tmp_path, "t.gguf")
    path.write_text(yaml.safe_dump({"name": "tq", "target": {"path": "t.gguf", "quantize": ["Q8_0"]}}))
    quality = load_spec(path).quality
    assert (quality.scorer, quality.text_file, quality.max_kld) == (
        "kld",
        builtin_text(),
        DEFAULT_TARGET_MAX_KLD,
    )
    assert _quality_text(quality) == f"kld >= 0.95 (mean KLD <= 0.1) on the built-in text ({builtin_text()})"
    assert (
        builtin_text().is_file() and len(builtin_text().read_text().split()) > 1200
    )  # 8 windows of 128 tokens
    # a study that names its own text keeps it; a plain target keeps agreement
    assert load_spec(write_study(tmp_path, {"path": "t.gguf", "quantize": ["Q8_0"]})).quality.text_file == (
        tmp_path / "text.txt"
    )
    assert load_spec(write_study(tmp_path, "t.gguf", {})).quality.scorer == "agreement"


@pytest.mark.llama
def test_run_check_of_target_variants_without_quality_says_kld(
    synthetic_models, tmp_path, capsys, monkeypatch
):
    """`tuner run --check` of a study of target variants with no quality section: kld on the built-in text, which
    fills the scorer's windows on the synthetic target's tokenizer too."""
    from tuner.cli import main
    from tuner.machine.llama_build import binary
    from tuner.measurement.quality import builtin_text
    from tuner.measurement.workload import llama_tokenize_count

    monkeypatch.setenv("TUNER_STORAGE_DIR", str(tmp_path / "storage"))
    target = synthetic_models.path("target")
    path = tmp_path / "study.yaml"
    study = {"name": "tqcheck", "target": {"path": str(target), "quantize": ["Q8_0"]}, "drafts": []}
    path.write_text(yaml.safe_dump({**study, "storage": f"sqlite:///{tmp_path / 's.db'}"}))
    assert main(["run", str(path), "--check"]) == 0
    printed = capsys.readouterr().out
    assert f"quality kld >= 0.95 (mean KLD <= 0.1) on the built-in text ({builtin_text()})" in printed
    tokens = llama_tokenize_count(binary("llama-tokenize"), target, builtin_text().read_text())
    assert tokens >= 2 * 128 * 8


@pytest.mark.parametrize(
    "target, quality, message",
    [
        ({"path": "t.gguf", "quantize": ["IQ2_XS"]}, None, "needs an importance matrix"),
        ({"path": "t.gguf", "quantize": ["Q8_0", "q8_0"]}, None, "listed twice"),
        ({"path": "t.gguf", "quantize": []}, None, "non-empty list"),
        ({"path": "t.gguf", "quantize": ["source"]}, None, "names the source file itself"),
        ({"path": "t.gguf", "quantize": ["Q8_0"]}, {"scorer": "agreement"}, "quality.scorer: kld"),
    ],
)
def test_bad_target_entries_are_one_line_errors(tmp_path, target, quality, message):
    with pytest.raises(UserError) as err:
        load_spec(write_study(tmp_path, target, quality))
    assert message in str(err.value) and "\n" not in str(err.value) and "study.yaml" in str(err.value)


def test_the_space_offers_the_source_first_and_the_baseline_runs_it():
    from tuner.knobs.config import Choices, RawSpace
    from tuner.search.space import SpaceHost, SpaceTarget, baseline_config, resolve_space
    from tuner.studyfile.validate import Fields

    host = SpaceHost(physical_cores=2, logical_cpus=2, numa_policies=("none",), numa_nodes=(0,))
    fields = Fields(Path("s.yaml"), {})
    space = resolve_space(RawSpace({}), fields=fields, target=SpaceTarget(quants=("Q8_0", "Q4_0")), host=host)
    assert space.domains["target_quant"].values == ("source", "Q8_0", "Q4_0")
    assert baseline_config(space).target_quant == "source"
    plain = resolve_space(RawSpace({}), fields=fields, target=SpaceTarget(), host=host)
    assert "target_quant" not in plain.domains and baseline_config(plain).target_quant is None
    with pytest.raises(UserError, match="not one of the target's variants"):
        resolve_space(
            RawSpace({"target_quant": Choices(("Q2_K",))}),
            fields=fields,
            target=SpaceTarget(quants=("Q8_0",)),
            host=host,
        )


@pytest.mark.llama
def test_a_study_of_target_variants_measures_each_kld_and_never_deploys_one_over_the_ceiling(
    tmp_path, synthetic_models, capsys
):
    """The synthetic target (F16) with Q8_0 and Q2_K: each variant is a real llama-quantize file, launched as
    the trial's --model, scored by KLD from the source's logits; Q2_K is over the ceiling, so infeasible."""
    from tuner.models.quantize import file_sha256
    from tuner.output.analysis import report_data
    from tuner.output.export import build_export, target_lines
    from tuner.prepare import memory, prepare
    from tuner.progress import Progress
    from tuner.run.objective import StudyObjective
    from tuner.run.study_loop import open_study
    from tuner.storage import store

    text = tmp_path / "text.txt"
    text.write_text(inspect.getsource(tuner.measurement.server_process))
    path = tmp_path / "study.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "name": "variants",
                "target": {"path": str(synthetic_models.path("target")), "quantize": ["Q8_0", "Q2_K"]},
                "drafts": [str(synthetic_models.path("draft-large"))],
                "search_space": {
                    "overrides": {
                        "spec_type": ["none", "draft-simple"],
                        "draft_max": [4],
                        "threads": 1,
                        "temperature": 0.0,
                    }
                },
                "workload": {"suites": ["code"], "n_predict": 16},
                "measurement": {"warmup": 0, "repetitions": 1, "ctx_size": 512, "trial_timeout_s": 120},
                "quality": {"scorer": "kld", "floor": 0.2, "max_kld": 0.5, "text_file": str(text)},
                "storage": f"sqlite:///{tmp_path / 'studies.db'}",
                "sampler": {"name": "tpe", "prune": False},
            }
        )
    )
    ctx = prepare(load_spec(path), progress=Progress.quiet())
    q8, q2 = ctx.target_variants["Q8_0"], ctx.target_variants["Q2_K"]
    assert (
        q8.info.file_size_bytes < ctx.target.file_size_bytes
        and q2.info.file_size_bytes < q8.info.file_size_bytes
    )
    assert q8.sha256 == file_sha256(q8.variant.path)
    # the memory check counts the variant a configuration runs, not the source
    alone = TrialConfig(threads=1)
    weights = {
        q: memory.config_footprint(ctx, replace(alone, target_quant=q)).weights for q in ("source", "Q2_K")
    }
    assert weights == {"source": ctx.target.weights_bytes, "Q2_K": q2.info.weights_bytes}
    study = open_study(ctx)
    study.enqueue_trial(
        {"spec_type": "none", "target_quant": "source", "threads": 1}, user_attrs={store.ROLE: "baseline"}
    )
    for variant in ("Q8_0", "Q2_K"):
        study.enqueue_trial({"spec_type": "none", "target_quant": variant, "threads": 1})
    drafting = {"spec_type": "draft-simple", "draft": "draft-large", "draft_max": 4, "target_quant": "Q8_0"}
    study.enqueue_trial({**drafting, "threads": 1})
    study.optimize(StudyObjective(ctx, study, progress=Progress.quiet()), n_trials=4)
    source, eight, two, drafted = store.read_trials(study)
    assert [r.argv[r.argv.index("--model") + 1] for r in (source, eight, two)] == [
        str(ctx.spec.target.resolve()),
        str(q8.variant.path.resolve()),
        str(q2.variant.path.resolve()),
    ]
    assert source.scores["mean_kld"] == 0.0 and source.feasible
    assert 0.0 < eight.scores["mean_kld"] < two.scores["mean_kld"]  # measured, coarser is further
    assert two.scores["mean_kld"] > 0.5 and not two.feasible  # over max_kld: never deployed
    stored = store.read_study_record(study)
    assert stored.target_variants["Q2_K"]["sha256"] == q2.sha256
    assert stored.target_variants["Q8_0"]["command"][-1] == "Q8_0"
    # the report's front and the export's lines state each variant's distance from the source
    data = report_data(study, stored)
    front = data.variants
    assert list(zip(front["target_quant"], front["family"])) == [
        ("source", "none"),
        ("Q8_0", "none"),
        ("Q2_K", "none"),
        ("Q8_0", "draft"),
    ]
    assert list(front["feasible"]) == [True, True, False, drafted.feasible]
    assert list(front["mean_kld"])[:3] == [0.0, eight.scores["mean_kld"], two.scores["mean_kld"]]
    export = build_export(stored, drafted, data.trials, "chosen")
    assert export.target["sha256"] == q8.sha256 and export.target["quant"] == "Q8_0"
    assert (
        export.target["mean_kld"] == drafted.scores["mean_kld"] == eight.scores["mean_kld"]
    )  # one per model
    # what speculation adds on the variant: over the same variant alone, on the same threads
    adds = drafted.metrics.tokens_per_second / eight.metrics.tokens_per_second
    assert export.target["speculation_adds"] == pytest.approx(adds)
    lines = target_lines(export)
    assert any("llama-quantize" in line and "Q8_0" in line for line in lines)
    assert f"Speculation on it: x{adds:.2f} over this variant alone" in "\n".join(lines)
    # tuner verify checks the deployed file's digest before launching: the file as made passes, a changed one
    # (or a missing one) is one line with the command that makes it again
    from tuner.output.preset import DeployedSection
    from tuner.output.verify_run import Deployed, check_target_file

    def deployed(model: Path) -> Deployed:
        section = DeployedSection(tmp_path / "p.ini", "variants", {"model": str(model)}, {}, None, ())
        return Deployed(section, drafted.number, None, [], drafted.config.target_quant)

    check_target_file(stored, deployed(q8.variant.path))
    changed = tmp_path / "changed.gguf"
    data_bytes = bytearray(q8.variant.path.read_bytes())
    data_bytes[len(data_bytes) // 2] ^= 0xFF  # one byte of the weights flipped
    changed.write_bytes(bytes(data_bytes))
    for model in (changed, tmp_path / "missing.gguf"):
        with pytest.raises(UserError) as err:
            check_target_file(stored, deployed(model))
        assert "llama-quantize" in str(err.value) and "\n" not in str(err.value)
    # tuner doctor --study: the memory its largest configuration needs (the source, here), from the headers
    from tuner.output.doctor import print_doctor
    from tuner.prepare.memory import largest

    capsys.readouterr()
    print_doctor(Path("/"), False, "variants", ctx.spec.storage, as_json=False)
    assert (
        f"memory: the largest configuration of study variants needs {largest(ctx).text()}"
        in capsys.readouterr().out
    )


def test_a_study_stored_before_target_variants_resumes_and_other_variants_are_refused():
    from tuner.storage.records import StudyRecord, changes

    base = replay_record("s", {}, ("tokens_per_second",))
    old = base.to_json()
    del old["target_variants"]  # a record written before the field existed
    assert (
        StudyRecord.from_json(old).target_variants == {} and changes(StudyRecord.from_json(old), base) == []
    )
    made = {"source": "/m/t.gguf", "source_sha256": "ab" * 32, "type": "Q4_0", "sha256": "ef" * 32}
    with_variant = replace(base, target_variants={"Q4_0": made})
    assert changes(base, with_variant) == [
        "target variants Q4_0 differs (the study has none, this run has it)"
    ]


def test_doctors_memory_line_names_a_study_whose_models_are_not_here(tmp_path):
    from tuner.machine.topology import read_topology
    from tuner.output.doctor import _memory_line

    record = replace(
        replay_record("gone", {}, ("tokens_per_second",)),
        target={"path": str(tmp_path / "moved.gguf")},
        measurement={"ctx_size": 512},
    )
    line = _memory_line(record, read_topology())
    assert line.startswith("memory: study gone's models cannot be read here") and "moved.gguf" in line
