"""The raw facts of a GGUF header the tuner reads, without a Python object per token.

gguf's GGUFReader makes numpy views for every element of every metadata array: a
262k-token vocabulary (texts, scores, types) costs it over 20 s. `_bulk_reader` keeps
gguf as the parser but reads each array whole: numbers as one view, strings by walking
their length prefixes once. The token texts stay two arrays (bytes and ends), compared
vectorized. What the facts mean to llama.cpp is decided in tuner.models.gguf_info; this module
only reads, so its result can be cached per file (tuner.models.gguf_cache).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np

from tuner.errors import UserError

_GGUF_MAGIC = b"GGUF"
_STRING_PREFIX = 8  # a GGUF string is a uint64 length, then its bytes
# Tensor names by which a GGUF announces a speculative head (common_speculative_types_from_gguf):
# an MTP head in a block's nextn tensors, DSpark's Markov head in a dflash sidecar.
_SPEC_TENSOR_SUFFIX = ".nextn.eh_proj.weight"
_SPEC_TENSOR_NAMES = frozenset({"markov_w1.weight"})


@dataclass(frozen=True, eq=False)
class Vocab:
    """Token texts back to back in ``data``; text ``i`` ends at ``ends[i]``, starts where ``i-1`` ends."""

    data: np.ndarray  # uint8
    ends: np.ndarray  # int64, non-decreasing, ends[-1] == len(data)

    @classmethod
    def blank(cls, count: int) -> Vocab:
        """``count`` empty texts: what llama.cpp keeps for a model without a vocabulary."""
        return cls(np.zeros(0, dtype=np.uint8), np.zeros(count, dtype=np.int64))

    def __len__(self) -> int:
        return len(self.ends)

    def text(self, token_id: int) -> str:
        return self.data[self._start(token_id):self.ends[token_id]].tobytes().decode("utf-8")

    def lengths(self) -> np.ndarray:
        return np.diff(self.ends, prepend=0)

    def with_empty_renamed(self) -> Vocab:
        """llama.cpp's load renames an empty text to ``[EMPTY_<id>]``; real vocabularies rarely have one."""
        empty = np.flatnonzero(self.lengths() == 0)
        if not empty.size:
            return self
        names = [f"[EMPTY_{i}]".encode() for i in empty]
        sizes = np.array([len(n) for n in names], dtype=np.int64)
        starts = np.array([self._start(int(i)) for i in empty], dtype=np.int64)
        data = np.insert(self.data, np.repeat(starts, sizes), np.frombuffer(b"".join(names), dtype=np.uint8))
        lengths = self.lengths()
        lengths[empty] = sizes
        return Vocab(data, np.cumsum(lengths))

    def first_mismatch(self, other: Vocab, start: int) -> int | None:
        """The first id from ``start`` below both sizes whose texts differ, else None.

        Texts of equal length up to the first length mismatch line up byte for byte,
        so one array comparison finds the first differing byte, hence its token.
        """
        stop = min(len(self), len(other))
        if start >= stop:
            return None
        differing_length = np.flatnonzero(self.lengths()[start:stop] != other.lengths()[start:stop])
        if differing_length.size:
            stop = start + int(differing_length[0])
        first, other_first = self._start(start), other._start(start)
        size = self._start(stop) - first
        differing_byte = np.flatnonzero(self.data[first:first + size] != other.data[other_first:other_first + size])
        if differing_byte.size:
            return int(np.searchsorted(self.ends, first + int(differing_byte[0]), side="right"))
        return stop if differing_length.size else None

    def _start(self, token_id: int) -> int:
        return int(self.ends[token_id - 1]) if token_id > 0 else 0


@dataclass(frozen=True, eq=False)
class Header:
    """What one GGUF file says, before any llama.cpp rule is applied."""

    file_size_bytes: int
    metadata: dict[str, Any]  # every single-valued key: str, int, float or bool
    array_keys: tuple[str, ...]  # keys holding arrays (their values are not kept)
    vocab: Vocab | None  # tokenizer.ggml.tokens; None when the key is absent
    file_type: str | None  # general.file_type as gguf names it, e.g. "Q4_K_M"
    parameter_count: int  # sum of tensor element counts
    tensor_bytes: dict[str, int]  # ggml type name -> bytes of tensor data
    expert_weights_bytes: int  # the MoE expert tensors' share (`*_exps.*`)
    spec_tensors: tuple[str, ...]  # the tensor names announcing a speculative head, not every name

    @property
    def keys(self) -> tuple[str, ...]:
        return (*self.metadata, *self.array_keys)


def parse_header(path: Path) -> Header:
    """Read ``path``'s header; any unreadable or malformed file is a one-line UserError."""
    reader = _open_reader(path)
    metadata: dict[str, Any] = {}
    array_keys: list[str] = []
    vocab = None
    for key, field in reader.fields.items():
        if key.startswith("GGUF."):  # the reader's own entries: version and counts
            continue
        if key == "tokenizer.ggml.tokens":
            vocab = _vocab(path, field)
        if field.types[0].name == "ARRAY":
            array_keys.append(key)
            continue
        try:
            metadata[key] = field.contents()
        except UnicodeDecodeError as err:
            raise UserError(f"{path}: metadata {key} holds invalid UTF-8 ({err})") from None
    tensor_bytes: dict[str, int] = {}
    for tensor in reader.tensors:
        tensor_bytes[tensor.tensor_type.name] = tensor_bytes.get(tensor.tensor_type.name, 0) + int(tensor.n_bytes)
    return Header(
        file_size_bytes=path.stat().st_size,
        metadata=metadata,
        array_keys=tuple(array_keys),
        vocab=vocab,
        file_type=_file_type_name(path, metadata.get("general.file_type")),
        parameter_count=sum(int(t.n_elements) for t in reader.tensors),
        tensor_bytes=tensor_bytes,
        expert_weights_bytes=sum(int(t.n_bytes) for t in reader.tensors if "_exps." in t.name),
        spec_tensors=tuple(t.name for t in reader.tensors
                           if t.name.endswith(_SPEC_TENSOR_SUFFIX) or t.name in _SPEC_TENSOR_NAMES),
    )


def _open_reader(path: Path) -> Any:
    """A bulk GGUFReader over ``path``, with every way of failing turned into a UserError."""
    if path.is_dir():
        raise UserError(f"{path}: is a directory; pass a .gguf model file")
    try:
        with path.open("rb") as fh:
            magic = fh.read(4)
    except FileNotFoundError:
        raise UserError(f"{path}: no such file; pass a .gguf model") from None
    except OSError as err:
        raise UserError(f"{path}: cannot read ({err.strerror or err})") from None
    if magic != _GGUF_MAGIC:
        what = "empty file" if not magic else f"bad magic {magic!r}"
        raise UserError(f"{path}: not a GGUF file ({what}); pass a .gguf model")
    try:
        return _bulk_reader()(path)
    except Exception as err:  # the reader fails in many ways on truncated or corrupt input
        raise UserError(f"{path}: truncated or corrupt GGUF ({type(err).__name__}: {err})") from None


@cache
def _bulk_reader() -> type:
    """GGUFReader reading each metadata array whole; made on first use, so gguf is imported only then.

    An array field's parts end with [values] for numbers, or [lengths, raw bytes with
    the length prefixes] for strings; `contents()` is not for the string case.
    """
    from gguf import GGUFReader, GGUFValueType

    class BulkReader(GGUFReader):
        def _get_field_parts(self, orig_offs: int, raw_type: int) -> tuple[int, list, list[int], list]:
            if raw_type != GGUFValueType.ARRAY:
                return super()._get_field_parts(orig_offs, raw_type)
            raw_itype = self._get(orig_offs, np.uint32)
            count_part = self._get(orig_offs + 4, np.uint64)
            item_type, count, offs = GGUFValueType(raw_itype[0]), int(count_part[0]), orig_offs + 12
            head, types = [raw_itype, count_part], [GGUFValueType.ARRAY, item_type]
            np_type = self.gguf_scalar_to_np.get(item_type)
            if np_type is not None:
                values = self._get(offs, np_type, count)
                if len(values) != count:
                    raise ValueError(f"array of {count} {item_type.name} runs past the end of the file")
                return offs + int(values.nbytes) - orig_offs, [*head, values], [2], types
            if item_type != GGUFValueType.STRING:  # nested arrays: rare and short
                return super()._get_field_parts(orig_offs, raw_type)
            unpack = struct.Struct(np.dtype(np.uint64).newbyteorder(self.byte_order).str[0] + "Q").unpack_from
            lengths, end = [], offs
            for _ in range(count):
                (length,) = unpack(self.data, end)  # type: ignore[arg-type]  # numpy's stubs declare ndarray a buffer only for Python 3.12+
                lengths.append(length)
                end += _STRING_PREFIX + length
            if end > len(self.data):
                raise ValueError(f"array of {count} strings runs past the end of the file")
            parts = [*head, np.array(lengths, dtype=np.int64), self.data[offs:end]]
            return end - orig_offs, parts, [2, 3], types

    return BulkReader


def _vocab(path: Path, field: Any) -> Vocab:
    """The token texts out of a bulk-read string array, checked to be UTF-8 as llama.cpp's texts are."""
    if [t.name for t in field.types] != ["ARRAY", "STRING"]:
        raise UserError(f"{path}: tokenizer.ggml.tokens is not an array of strings")
    lengths, raw = field.parts[-2], field.parts[-1]
    ends = np.cumsum(lengths, dtype=np.int64)
    prefixes = (_STRING_PREFIX * np.arange(len(lengths)) + ends - lengths)[:, None] + np.arange(_STRING_PREFIX)
    keep = np.ones(len(raw), dtype=bool)
    keep[prefixes.ravel()] = False
    data = np.asarray(raw[keep])
    if not _each_text_is_utf8(data, ends - lengths, lengths):
        raise UserError(f"{path}: tokenizer.ggml.tokens holds invalid UTF-8")
    return Vocab(data, ends)


def _each_text_is_utf8(data: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> bool:
    """Valid as a whole and no text starting inside a character (a continuation byte): then each is valid."""
    try:
        data.tobytes().decode("utf-8")
    except UnicodeDecodeError:
        return False
    return not np.any((data[starts[lengths > 0]] & 0xC0) == 0x80)


def _file_type_name(path: Path, file_type: Any) -> str | None:
    if file_type is None:
        return None
    if isinstance(file_type, bool) or not isinstance(file_type, int):
        raise UserError(f"{path}: metadata general.file_type is {file_type!r}, expected an integer")
    from gguf import LlamaFileType

    try:
        name = LlamaFileType(file_type).name
    except ValueError:
        return f"file_type {file_type}"
    return name.removeprefix("MOSTLY_").removeprefix("ALL_")
