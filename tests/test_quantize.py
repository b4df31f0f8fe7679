"""Quantized drafts: study entries, the variant cache, provenance, and clear errors before any trial."""

from dataclasses import replace
from pathlib import Path

import pytest
import yaml
from gguf_factory import write_gguf

from benchmarks.replay import replay_record
from tuner.errors import UserError
from tuner.machine.topology import read_topology
from tuner.models.gguf_info import read_model_info
from tuner.models.quantize import QuantizeRequest, ensure_variant, source_digest
from tuner.prepare.fitted_space import check_models_and_space
from tuner.storage.records import StudyRecord, changes
from tuner.studyfile.spec import load_spec

ONE_NODE = read_topology(Path(__file__).parent / "data" / "sysfs" / "one-node-2core")


def write_study(tmp_path: Path, drafts: list) -> Path:
    path = tmp_path / "study.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "name": "q",
                "target": "target.gguf",
                "drafts": drafts,
                "search_space": {"overrides": {"spec_type": ["none", "draft-simple"]}},
            }
        )
    )
    return path


def test_a_draft_entry_asks_for_variants_and_the_target_may_be_its_own_source(tmp_path):
    write_gguf(tmp_path / "target.gguf")
    write_gguf(tmp_path / "draft.gguf")
    spec = load_spec(
        write_study(tmp_path, ["draft.gguf", {"path": "target.gguf", "quantize": ["q8_0", "Q4_0"]}])
    )
    assert spec.drafts == (tmp_path / "draft.gguf",)
    assert [(q.source.name, q.type) for q in spec.quantize] == [
        ("target.gguf", "Q8_0"),
        ("target.gguf", "Q4_0"),
    ]
    assert spec.draft_names() == ("draft", "target-Q8_0", "target-Q4_0")
    # the variants are offered as draft choices, checked like any draft (same vocabulary: compatible)
    quantized = {q.name: tmp_path / "target.gguf" for q in spec.quantize}
    _, drafts, space = check_models_and_space(spec, ONE_NODE, None, quantized)
    assert list(drafts) == ["draft", "target-Q8_0", "target-Q4_0"]
    assert space.domains["draft"].values == ("draft", "target-Q8_0", "target-Q4_0")


@pytest.mark.parametrize(
    "entry, message",
    [
        ({"path": "target.gguf"}, "quantize: expected a non-empty list"),
        ({"path": "target.gguf", "quantize": []}, "quantize: expected a non-empty list"),
        ({"path": "missing.gguf", "quantize": ["Q8_0"]}, "missing.gguf does not exist"),
        ({"path": "target.gguf", "quantize": ["Q8_0"], "typo": 1}, "typo"),
        ({"path": "target.gguf", "quantize": ["Q8_0", "q8_0"]}, "two drafts share a name"),
    ],
)
def test_bad_draft_entries_are_one_line_errors(tmp_path, entry, message):
    write_gguf(tmp_path / "target.gguf")
    with pytest.raises(UserError) as err:
        load_spec(write_study(tmp_path, [entry]))
    assert message in str(err.value) and "drafts" in str(err.value) and "\n" not in str(err.value)


def test_the_source_digest_is_hashed_once_per_path_size_and_mtime(tmp_path, monkeypatch):
    model = tmp_path / "m.gguf"
    model.write_bytes(b"x" * 1000)
    first = source_digest(model, tmp_path / "cache")
    monkeypatch.setattr("hashlib.sha256", lambda *a: pytest.fail("hashed again"))
    assert source_digest(model, tmp_path / "cache") == first


def test_provenance_is_part_of_what_makes_two_studies_comparable():
    base = replay_record("s", {}, ("tokens_per_second",))
    made = {"source": "/m/t.gguf", "source_sha256": "ab" * 32, "type": "Q8_0", "command": ["llama-quantize"]}
    with_variant = replace(base, quantized_drafts={"t-Q8_0": made})
    assert changes(base, base) == []
    assert changes(base, with_variant) == [
        "quantized drafts t-Q8_0 differs (the study has none, this run has it)"
    ]
    other_source = replace(base, quantized_drafts={"t-Q8_0": {**made, "source_sha256": "cd" * 32}})
    assert any(
        c.startswith("quantized drafts t-Q8_0 differs") and "cdcd" in c
        for c in changes(with_variant, other_source)
    )
    # a record stored before the field existed reads as "no quantized drafts"
    old = base.to_json()
    del old["quantized_drafts"]
    assert StudyRecord.from_json(old).quantized_drafts == {}


@pytest.mark.llama
def test_a_variant_is_made_once_then_taken_from_the_cache(synthetic_models, llama_bin_dir, tmp_path):
    source = synthetic_models.path("target")
    assert read_model_info(source).file_type == "F16"  # so the first variant needs no --allow-requantize
    request = QuantizeRequest(source, "Q8_0")
    made = ensure_variant(request, llama_bin_dir, cache=tmp_path, source_file_type="F16")
    assert made.made and made.path.is_file() and made.path.parent == tmp_path
    assert made.path.name == f"{made.provenance['source_sha256'][:16]}-Q8_0.gguf"
    assert made.provenance["command"][1:] == [
        str(source.resolve()),
        str(made.path),
        "Q8_0",
    ]  # F16 source: no requantize
    assert not list(tmp_path.glob("*.tmp.gguf"))
    mtime = made.path.stat().st_mtime_ns
    again = ensure_variant(request, llama_bin_dir, cache=tmp_path, source_file_type="F16")
    assert not again.made and again.path == made.path and again.path.stat().st_mtime_ns == mtime
    assert again.provenance == made.provenance
    requantized = ensure_variant(
        QuantizeRequest(made.path, "Q4_0"), llama_bin_dir, cache=tmp_path, source_file_type="Q8_0"
    )
    assert "--allow-requantize" in requantized.provenance["command"]


@pytest.mark.llama
@pytest.mark.parametrize(
    "qtype, message",
    [
        ("Q9_9", "is not one llama-quantize accepts; use one of"),
        ("IQ2_XXS", "cannot quantize target.gguf to IQ2_XXS: this quantization requires an imatrix"),
    ],
)
def test_a_variant_that_cannot_be_made_is_one_clear_line(
    synthetic_models, llama_bin_dir, tmp_path, qtype, message
):
    with pytest.raises(UserError) as err:
        ensure_variant(
            QuantizeRequest(synthetic_models.path("target"), qtype),
            llama_bin_dir,
            cache=tmp_path,
            source_file_type="F16",
        )
    assert message in str(err.value) and "\n" not in str(err.value)
    assert not list(tmp_path.glob("*.gguf"))
