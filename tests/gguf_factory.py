"""Write small, real GGUF files with chosen metadata for tests (via gguf's GGUFWriter).

A few hundred tokens and a tensor or two: enough for the tuner's metadata and
compatibility logic to see exactly what a real model would show it, in milliseconds.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGMLQuantizationType, GGUFWriter, LlamaFileType, TokenType
from gguf.quants import quantize

DEFAULT_VOCAB_SIZE = 320


def spm_tokens(n: int = DEFAULT_VOCAB_SIZE) -> list[str]:
    """A llama/SentencePiece-style vocab: <unk> <s> </s>, the 256 byte tokens, then pieces."""
    head = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    return (head + [f"\u2581w{i}" for i in range(n)])[:n]


def spm_token_types(tokens: Sequence[str]) -> list[int]:
    kinds = {"<unk>": TokenType.UNKNOWN, "<s>": TokenType.CONTROL, "</s>": TokenType.CONTROL}
    return [int(kinds.get(t, TokenType.BYTE if t.startswith("<0x") else TokenType.NORMAL)) for t in tokens]


def bpe_tokens(n: int = DEFAULT_VOCAB_SIZE) -> list[str]:
    """A GPT-2-style vocab: printable byte characters, then words; the last is <|endoftext|>."""
    words = [chr(c) for c in range(33, 127)] + [f"\u0120w{i}" for i in range(n)]
    return words[: n - 1] + ["<|endoftext|>"]


def write_gguf(
    path: str | Path,
    *,
    architecture: str = "llama",
    name: str | None = "tiny",
    tokenizer_model: str = "llama",
    tokenizer_pre: str | None = None,
    tokens: Sequence[str] | None = None,
    token_types: Sequence[int] | None = None,
    scores: Sequence[float] | None = None,
    merges: Sequence[str] | None = None,
    bos_id: int | None = 1,
    eos_id: int | None = 2,
    add_bos: bool | None = None,
    add_eos: bool | None = None,
    context_length: int | None = 256,
    block_count: int | None = 1,
    embedding_length: int | None = 8,
    expert_count: int | None = None,
    expert_used_count: int | None = None,
    ssm: bool = False,
    file_type: int | None = LlamaFileType.ALL_F32,
    tensors: Mapping[str, np.ndarray | tuple[np.ndarray, GGMLQuantizationType]] | None = None,
    extra_kv: Mapping[str, int | str | bool] | None = None,
    nextn: bool = False,
) -> Path:
    """Write a GGUF at ``path`` and return the path.

    ``None`` leaves a key out, so tests can exercise llama.cpp's defaults. Tokens default
    to an SPM vocab for ``tokenizer_model="llama"`` and a BPE vocab (with a merge list,
    which llama.cpp requires) for ``"gpt2"``. ``tensors`` defaults to one small f32
    tensor; pass a dict of numpy arrays (f32/f16 are stored as such), or of
    ``(f32 array, GGMLQuantizationType)`` pairs to store the data quantized. ``nextn`` adds the
    last block's ``nextn.eh_proj`` tensor, by which llama.cpp finds an MTP head (draft-mtp).
    """
    path = Path(path)
    writer = GGUFWriter(path, architecture)
    if name is not None:
        writer.add_name(name)
    if file_type is not None:
        writer.add_file_type(int(file_type))
    if context_length is not None:
        writer.add_context_length(context_length)
    if block_count is not None:
        writer.add_block_count(block_count)
    if embedding_length is not None:
        writer.add_embedding_length(embedding_length)
    if expert_count is not None:
        writer.add_expert_count(expert_count)
    if expert_used_count is not None:
        writer.add_expert_used_count(expert_used_count)
    if ssm:
        writer.add_ssm_conv_kernel(4)
        writer.add_ssm_inner_size(16)
        writer.add_ssm_state_size(16)

    writer.add_tokenizer_model(tokenizer_model)
    if tokenizer_pre is not None:
        writer.add_tokenizer_pre(tokenizer_pre)
    is_bpe = tokenizer_model == "gpt2"
    if tokens is None:
        tokens = bpe_tokens() if is_bpe else spm_tokens()
    writer.add_token_list(list(tokens))
    if token_types is None and not is_bpe:
        token_types = spm_token_types(tokens)
    if token_types is not None:
        writer.add_token_types(list(token_types))
    if scores is None and not is_bpe:
        scores = [-float(i) for i in range(len(tokens))]
    if scores is not None:
        writer.add_token_scores(list(scores))
    if merges is None and is_bpe:
        merges = ["\u0120 w"]
    if merges is not None:
        writer.add_token_merges(list(merges))
    if bos_id is not None:
        writer.add_bos_token_id(bos_id)
    if eos_id is not None:
        writer.add_eos_token_id(eos_id)
    if add_bos is not None:
        writer.add_add_bos_token(add_bos)
    if add_eos is not None:
        writer.add_add_eos_token(add_eos)
    for key, val in (extra_kv or {}).items():
        _add_value(writer, key, val)

    if tensors is None:
        tensors = {"output_norm.weight": np.ones(embedding_length or 8, dtype=np.float32)}
    if nextn:
        tensors = {
            **tensors,
            f"blk.{(block_count or 1) - 1}.nextn.eh_proj.weight": np.ones((8, 16), dtype=np.float32),
        }
    for tensor_name, data in tensors.items():
        if isinstance(data, tuple):
            values, qtype = data
            writer.add_tensor(tensor_name, quantize(values, qtype), raw_dtype=qtype)
        else:
            writer.add_tensor(tensor_name, data)

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _add_value(writer: GGUFWriter, key: str, val: Any) -> None:
    if isinstance(val, bool):
        writer.add_bool(key, val)
    elif isinstance(val, int):
        writer.add_uint32(key, val)
    else:
        writer.add_string(key, str(val))
