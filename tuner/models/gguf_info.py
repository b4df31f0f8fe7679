"""GGUF metadata, and whether a draft model can speculate for a target (`tuner inspect`).

The search space is built from what the GGUF says (architecture, expert counts,
recurrent layers, vocab), so these rules mirror the pinned llama.cpp rather than
guessing: vocab type and BOS/EOS defaults follow ``src/llama-vocab.cpp``, the recurrent
and hybrid architectures ``src/llama-arch.cpp``, and draft compatibility
``common_speculative_are_compatible`` in ``common/speculative.cpp``. An incompatible
draft matters because llama.cpp does not fail on one: it serves without speculation.
The speculative types a GGUF announces follow ``common_speculative_types_from_gguf`` there.
The file itself is read by tuner.models.gguf_header, through the cache of tuner.models.gguf_cache.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from tuner.errors import UserError
from tuner.knobs.registry import ANNOUNCED_TYPES
from tuner.models.gguf_cache import read_header
from tuner.models.gguf_header import Header, Vocab

# common/speculative.cpp of the pinned llama.cpp.
SPEC_VOCAB_MAX_SIZE_DIFFERENCE = 128
SPEC_VOCAB_CHECK_START_TOKEN_ID = 5

# llm_arch_is_recurrent / llm_arch_is_hybrid in src/llama-arch.cpp (architecture names).
RECURRENT_ARCHITECTURES = frozenset({"mamba", "mamba2", "rwkv6", "rwkv6qwen2", "rwkv7", "arwkv7"})
HYBRID_ARCHITECTURES = frozenset(
    {
        "jamba",
        "falcon-h1",
        "plamo2",
        "granitehybrid",
        "lfm2",
        "lfm2moe",
        "nemotron_h",
        "nemotron_h_moe",
        "qwen3next",
        "kimi-linear",
        "bailingmoe3",
        "kimi-k3",
        "glm5-next",
        "qwen35",
        "qwen35moe",
        "qwen4exp",
        "deepseek4",
        "minimax-01",
    }
)

# tokenizer.ggml.model -> (llama_vocab_type, default bos id, default eos id, add_bos, add_eos)
# as llama_vocab::impl::load sets them before reading the GGUF's own keys.
_TOKENIZERS: dict[str, tuple[str, int | None, int | None, bool, bool]] = {
    "no_vocab": ("NONE", None, None, False, False),
    "none": ("NONE", None, None, False, False),
    "llama": ("SPM", 1, 2, True, False),
    "bert": ("WPM", 101, None, True, False),
    "gpt2": ("BPE", 11, 11, False, False),
    "hybriddna": ("BPE", 11, 11, False, False),
    "whitespace": ("BPE", 11, 11, False, False),
    "gemma4": ("BPE", None, None, False, False),
    "t5": ("UGM", None, 1, False, True),
    "rwkv": ("RWKV", None, None, False, False),
    "plamo2": ("PLAMO2", 1, 2, False, False),
    "test": ("TEST", None, None, False, False),
}
# BPE pre-tokenizers for which llama.cpp turns add_bos on, or has no BOS at all.
_BPE_PRE_ADD_BOS = frozenset(
    {
        "llama3",
        "llama-v3",
        "llama-bpe",
        "falcon3",
        "falcon-h1",
        "pixtral",
        "midm-2.0",
        "lfm2",
        "jina-v5-nano",
        "tekken",
        "chameleon",
    }
)
_BPE_PRE_NO_BOS = frozenset({"chatglm-bpe", "glm4", "glm5"})
# Pre-tokenizers of type GEMMA4: llama.cpp forces add_bos on even against the GGUF key.
_PRE_FORCE_ADD_BOS = frozenset({"gemma4", "granite-embed-multi-311m"})

_MIB = 1024 * 1024


@dataclass(frozen=True)
class ModelInfo:
    """What the tuner needs to know about one GGUF model, read once from its header."""

    path: Path
    file_size_bytes: int
    architecture: str
    name: str | None
    parameter_count: int  # sum of tensor element counts
    weights_bytes: int  # sum of tensor data bytes: what a decode step streams from memory
    expert_weights_bytes: int  # the MoE expert tensors' share (`*_exps.*`); a step reads used/count of it
    file_type: str | None  # general.file_type as a name, e.g. "Q4_K_M"
    dominant_tensor_type: str | None  # the ggml type holding the most bytes, e.g. "Q4_K"
    context_length: int | None
    block_count: int | None
    embedding_length: int | None
    vocab_model: str  # tokenizer.ggml.model
    vocab_pre: str | None  # tokenizer.ggml.pre
    vocab_type: str  # llama_vocab_type: NONE, SPM, BPE, WPM, UGM, RWKV, PLAMO2, TEST
    vocab_size: int  # tokens llama.cpp loads (length of tokenizer.ggml.tokens)
    bos_token_id: int | None  # None: llama.cpp's LLAMA_TOKEN_NULL
    eos_token_id: int | None
    add_bos: bool  # llama.cpp's effective value, its default when the key is absent
    add_eos: bool
    expert_count: int | None
    expert_used_count: int | None
    recurrent_kind: str | None  # "recurrent", "hybrid" or None (plain transformer)
    speculative_types: tuple[str, ...]  # the --spec-type values its GGUF announces, e.g. draft-mtp
    chat_template: str | None  # tokenizer.chat_template (Jinja), None when the model has none
    vocab: Vocab = field(repr=False, compare=False)  # token texts as llama.cpp stores them
    # K and V elements the KV cache holds per token, all layers (0: recurrent, or not said): its memory
    kv_elements_per_token: int = 0

    @property
    def is_moe(self) -> bool:
        return bool(self.expert_count)

    @property
    def expert_override_key(self) -> str | None:
        """The key `--override-kv KEY=int:N` must name to change the active experts."""
        return f"{self.architecture}.expert_used_count" if self.is_moe else None

    @property
    def is_recurrent(self) -> bool:
        return self.recurrent_kind is not None

    @property
    def quantization(self) -> str | None:
        return self.file_type or self.dominant_tensor_type

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready fields (the token texts left out)."""
        return {
            "path": str(self.path),
            "file_size_bytes": self.file_size_bytes,
            "architecture": self.architecture,
            "name": self.name,
            "parameter_count": self.parameter_count,
            "weights_bytes": self.weights_bytes,
            "expert_weights_bytes": self.expert_weights_bytes,
            "file_type": self.file_type,
            "dominant_tensor_type": self.dominant_tensor_type,
            "quantization": self.quantization,
            "context_length": self.context_length,
            "block_count": self.block_count,
            "embedding_length": self.embedding_length,
            "vocab_model": self.vocab_model,
            "vocab_pre": self.vocab_pre,
            "vocab_type": self.vocab_type,
            "vocab_size": self.vocab_size,
            "bos_token_id": self.bos_token_id,
            "eos_token_id": self.eos_token_id,
            "add_bos": self.add_bos,
            "add_eos": self.add_eos,
            "is_moe": self.is_moe,
            "expert_count": self.expert_count,
            "expert_used_count": self.expert_used_count,
            "expert_override_key": self.expert_override_key,
            "is_recurrent": self.is_recurrent,
            "recurrent_kind": self.recurrent_kind,
            "speculative_types": list(self.speculative_types),
        }


@dataclass(frozen=True)
class Compatibility:
    """Whether llama.cpp will speculate with this draft; ``reasons`` say why not.

    ``warnings`` do not stop speculation but change what it costs (e.g. a recurrent
    target, which the pinned server speculates on with state checkpoints).
    """

    ok: bool
    reasons: tuple[str, ...]
    warnings: tuple[str, ...] = ()


class _Metadata:
    """A header's metadata read key by key, each wrong type a one-line UserError naming the file."""

    def __init__(self, path: Path, header: Header):
        self.path, self.header = path, header

    def value(self, key: str) -> Any:
        if key in self.header.array_keys:
            raise UserError(f"{self.path}: metadata {key} is an array, expected a single value")
        return self.header.metadata.get(key)

    def integer(self, key: str) -> int | None:
        raw = self.value(key)
        if raw is None:
            return None
        if isinstance(raw, bool) or not isinstance(raw, int):
            raise UserError(f"{self.path}: metadata {key} is {raw!r}, expected an integer")
        return raw


@dataclass(frozen=True)
class _Tokenizer:
    """The vocab and its special tokens as the pinned llama.cpp loads them."""

    model: str
    pre: str | None
    type: str
    vocab: Vocab
    bos: int | None
    eos: int | None
    add_bos: bool
    add_eos: bool


def read_model_info(path: str | Path) -> ModelInfo:
    """Read a GGUF's header (cached); any unreadable or malformed file is a one-line UserError."""
    path = Path(path)
    header = read_header(path)
    meta = _Metadata(path, header)
    arch = _architecture(meta)
    tok = _tokenizer(meta, arch)
    tensor_bytes = header.tensor_bytes
    block_count = meta.integer(f"{arch}.block_count")
    return ModelInfo(
        path=path,
        file_size_bytes=header.file_size_bytes,
        architecture=arch,
        name=meta.value("general.name"),
        parameter_count=header.parameter_count,
        weights_bytes=sum(tensor_bytes.values()),
        expert_weights_bytes=header.expert_weights_bytes,
        file_type=header.file_type,
        dominant_tensor_type=max(tensor_bytes, key=tensor_bytes.__getitem__) if tensor_bytes else None,
        context_length=meta.integer(f"{arch}.context_length"),
        block_count=block_count,
        embedding_length=meta.integer(f"{arch}.embedding_length"),
        vocab_model=tok.model,
        vocab_pre=tok.pre,
        vocab_type=tok.type,
        vocab_size=len(tok.vocab),
        bos_token_id=tok.bos,
        eos_token_id=tok.eos,
        add_bos=tok.add_bos,
        add_eos=tok.add_eos,
        expert_count=meta.integer(f"{arch}.expert_count"),
        expert_used_count=meta.integer(f"{arch}.expert_used_count"),
        recurrent_kind=_recurrent_kind(arch, header.keys),
        speculative_types=_announced_types(arch, block_count, header.spec_tensors),
        chat_template=template
        if isinstance(template := meta.value("tokenizer.chat_template"), str)
        else None,
        vocab=tok.vocab,
        kv_elements_per_token=0 if _recurrent_kind(arch, header.keys) else _kv_elements(meta, arch, block_count),
    )


def _kv_elements(meta: _Metadata, arch: str, layers: int | None) -> int:
    """K and V elements per token over all layers, from the attention sizes llama.cpp reads (heads for K/V,
    their key and value lengths, which default to the embedding over the heads); 0 where a size is not a
    single number (per-layer arrays) or missing."""
    try:
        heads = meta.integer(f"{arch}.attention.head_count")
        kv_heads = meta.integer(f"{arch}.attention.head_count_kv") or heads
        embedding = meta.integer(f"{arch}.embedding_length")
        key = meta.integer(f"{arch}.attention.key_length")
        value = meta.integer(f"{arch}.attention.value_length")
    except UserError:
        return 0
    if not (layers and heads and kv_heads and (embedding or (key and value))):
        return 0
    default = (embedding or 0) // heads
    return layers * kv_heads * ((key or default) + (value or default))


def _architecture(meta: _Metadata) -> str:
    """general.architecture: every per-architecture key is named after it; without it, not a model."""
    arch = meta.value("general.architecture")
    if not isinstance(arch, str) or not arch:
        raise UserError(f"{meta.path}: no general.architecture key; not a llama.cpp model GGUF")
    return arch


def _tokenizer(meta: _Metadata, arch: str) -> _Tokenizer:
    """The tokenizer model's defaults (``_TOKENIZERS``), then the pre-tokenizer's and the GGUF's own keys,
    in llama_vocab::impl::load's order: draft compatibility compares exactly these."""
    vocab_model = meta.value("tokenizer.ggml.model")
    if vocab_model is None:
        raise UserError(f"{meta.path}: no tokenizer.ggml.model key; llama.cpp cannot load it as a model")
    if vocab_model not in _TOKENIZERS:
        raise UserError(
            f"{meta.path}: unknown tokenizer.ggml.model {vocab_model!r}; the pinned llama.cpp refuses to load it"
        )
    vocab_type, bos, eos, add_bos, add_eos = _TOKENIZERS[vocab_model]
    vocab_pre = meta.value("tokenizer.ggml.pre")
    if vocab_model == "gemma4":
        vocab_pre = "gemma4"  # llama.cpp overrides the pre-tokenizer for this model

    vocab = _vocab(meta.path, meta.header.vocab, vocab_type, meta.integer(f"{arch}.vocab_size"))
    if vocab_type == "BPE" and vocab_pre in _BPE_PRE_ADD_BOS:
        add_bos = True
    if vocab_type == "BPE" and vocab_pre in _BPE_PRE_NO_BOS:
        bos = None
    tok = _Tokenizer(vocab_model, vocab_pre, vocab_type, vocab, bos, eos, add_bos, add_eos)
    return _special_tokens(meta, tok) if vocab_type != "NONE" else tok


def _special_tokens(meta: _Metadata, tok: _Tokenizer) -> _Tokenizer:
    """The GGUF's BOS/EOS ids and add flags over the defaults (llama.cpp reads none for a vocab-less model)."""
    bos = _special_id(tok.bos, meta.integer("tokenizer.ggml.bos_token_id"), len(tok.vocab))
    eos = _special_id(tok.eos, meta.integer("tokenizer.ggml.eos_token_id"), len(tok.vocab))
    add_bos, add_eos = tok.add_bos, tok.add_eos
    if meta.value("tokenizer.ggml.add_bos_token") is not None:
        add_bos = bool(meta.value("tokenizer.ggml.add_bos_token"))
    if meta.value("tokenizer.ggml.add_eos_token") is not None:
        add_eos = bool(meta.value("tokenizer.ggml.add_eos_token"))
    if tok.type == "BPE" and tok.pre in _PRE_FORCE_ADD_BOS:
        add_bos = True
    return replace(tok, bos=bos, eos=eos, add_bos=add_bos, add_eos=add_eos)


def check_draft_compatibility(target: ModelInfo, draft: ModelInfo) -> Compatibility:
    """The checks of the pinned ``common_speculative_are_compatible``, all of them reported.

    llama.cpp stops at the first failing check; the verdict is the same, but listing
    every failure tells the user whether a different draft of the same family would do.
    """
    reasons: list[str] = []
    if target.vocab_type != draft.vocab_type:
        reasons.append(
            f"vocab type differs: target {target.vocab_type} ({target.vocab_model}), "
            f"draft {draft.vocab_type} ({draft.vocab_model})"
        )
    for label, add_field, id_field in (
        ("BOS", "add_bos", "bos_token_id"),
        ("EOS", "add_eos", "eos_token_id"),
    ):
        t_add, d_add = getattr(target, add_field), getattr(draft, add_field)
        t_id, d_id = getattr(target, id_field), getattr(draft, id_field)
        if t_add != d_add or (t_add and t_id != d_id):
            reasons.append(
                f"{label} differs: target {add_field}={t_add} id={t_id}, draft {add_field}={d_add} id={d_id}"
            )
    size_diff = abs(target.vocab_size - draft.vocab_size)
    if size_diff > SPEC_VOCAB_MAX_SIZE_DIFFERENCE:
        reasons.append(
            f"vocab sizes differ by {size_diff} (target {target.vocab_size}, "
            f"draft {draft.vocab_size}; llama.cpp allows {SPEC_VOCAB_MAX_SIZE_DIFFERENCE})"
        )
    else:  # llama.cpp compares texts only once the sizes are close
        token_id = target.vocab.first_mismatch(draft.vocab, SPEC_VOCAB_CHECK_START_TOKEN_ID)
        if token_id is not None:
            reasons.append(
                f"token {token_id} differs: target {target.vocab.text(token_id)!r}, draft {draft.vocab.text(token_id)!r}"
            )
    warnings = [
        f"{role} is a {info.recurrent_kind} model ({info.architecture}): the pinned llama-server "
        "speculates on it by checkpointing its state, which costs memory and time per draft"
        for role, info in (("target", target), ("draft", draft))
        if info.is_recurrent
    ]
    return Compatibility(ok=not reasons, reasons=tuple(reasons), warnings=tuple(warnings))


def format_model_info(info: ModelInfo) -> str:
    """Aligned ``key: value`` lines for a person reading the terminal."""
    if info.is_moe:
        experts = (
            f"{info.expert_count} total, {info.expert_used_count} used; change with "
            f"--override-kv {info.expert_override_key}=int:N"
        )
    else:
        experts = "none (dense)"
    quant = info.quantization or "unknown"
    if info.file_type and info.dominant_tensor_type and info.dominant_tensor_type != info.file_type:
        quant += f" (most bytes in {info.dominant_tensor_type} tensors)"
    rows = [
        ("model", str(info.path)),
        ("architecture", info.architecture + (f" ({info.name})" if info.name else "")),
        ("file size", f"{info.file_size_bytes / _MIB:.1f} MiB"),
        ("parameters", f"{_human_count(info.parameter_count)} ({info.parameter_count})"),
        ("weights", f"{info.weights_bytes / _MIB:.1f} MiB"),
        ("quantization", quant),
        ("context length", _or_unknown(info.context_length)),
        ("layers", _or_unknown(info.block_count)),
        ("vocab", f"{info.vocab_type} ({info.vocab_model}), {info.vocab_size} tokens"),
        ("BOS", _special_text(info.bos_token_id, info.add_bos)),
        ("EOS", _special_text(info.eos_token_id, info.add_eos)),
        ("MoE experts", experts),
        ("recurrent", f"yes ({info.recurrent_kind})" if info.is_recurrent else "no"),
        ("speculative types", _speculative_text(info.speculative_types)),
    ]
    width = max(len(key) for key, _ in rows) + 1
    return "\n".join(f"{key + ':':<{width}} {val}" for key, val in rows)


def format_compatibility(draft: ModelInfo, check: Compatibility) -> str:
    line = f"draft {draft.path}: " + (
        "compatible" if check.ok else "INCOMPATIBLE: " + "; ".join(check.reasons)
    )
    return line + "".join(f"; warning: {w}" for w in check.warnings)


def _vocab(path: Path, read: Vocab | None, vocab_type: str, arch_vocab_size: int | None) -> Vocab:
    """Token texts as llama.cpp keeps them: empty ones renamed, blanks for vocab-less models."""
    if vocab_type == "NONE":
        return Vocab.blank(arch_vocab_size or 0)
    if read is None:
        raise UserError(f"{path}: no tokenizer.ggml.tokens key; llama.cpp cannot load its vocab")
    return read.with_empty_renamed()


def _special_id(default: int | None, from_key: int | None, n_tokens: int) -> int | None:
    """llama.cpp's rule: defaults outside the vocab become NULL; out-of-range keys are ignored."""
    if default is not None and default >= n_tokens:
        default = None
    if from_key is None or not 0 <= from_key < n_tokens:
        return default
    return from_key


def _recurrent_kind(arch: str, keys: tuple[str, ...]) -> str | None:
    """llama.cpp decides by architecture; SSM/WKV keys also catch architectures newer than it."""
    if arch in RECURRENT_ARCHITECTURES:
        return "recurrent"
    if arch in HYBRID_ARCHITECTURES:
        return "hybrid"
    if any(key.startswith((f"{arch}.ssm.", f"{arch}.wkv.")) for key in keys):
        return "recurrent"
    return None


def _announced_types(arch: str, block_count: int | None, spec_tensors: tuple[str, ...]) -> tuple[str, ...]:
    """``common_speculative_types_from_gguf``: MTP when the last block has an ``nextn.eh_proj`` tensor;
    a dflash sidecar is draft-dspark with a Markov head, else draft-dflash. An eagle3 sidecar is
    named by its architecture, which that function does not read: llama.cpp needs --spec-type for it."""
    if arch == "dflash":
        return ("draft-dspark",) if "markov_w1.weight" in spec_tensors else ("draft-dflash",)
    if arch == "eagle3":
        return ("draft-eagle3",)
    if block_count and f"blk.{block_count - 1}.nextn.eh_proj.weight" in spec_tensors:
        return ("draft-mtp",)
    return ()


def _speculative_text(types: tuple[str, ...]) -> str:
    """What each announced type means for a study: offered on this target, or a draft-side sidecar."""
    if not types:
        return "none announced"
    return ", ".join(
        f"{t} (its own head; a study may search it)"
        if t in ANNOUNCED_TYPES
        else f"{t} (a draft-side sidecar; not searched by the tuner)"
        for t in types
    )


def _human_count(count: int) -> str:
    for unit, scale in (("B", 10**9), ("M", 10**6), ("K", 10**3)):
        if count >= scale:
            return f"{count / scale:.2f}{unit}"
    return str(count)


def _special_text(token_id: int | None, added: bool) -> str:
    return f"id {'none' if token_id is None else token_id}, {'added' if added else 'not added'}"


def _or_unknown(value: int | None) -> str:
    return "unknown" if value is None else str(value)
