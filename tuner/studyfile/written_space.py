"""The study file's search space as written: one knob's domain from YAML (scalar, list of choices,
or ``{low, high, step, log}``), a space file or a study's overrides, its ``concurrent:`` section."""

from __future__ import annotations

from typing import Any

from tuner.knobs.config import Choices, Domain, FloatRange, IntRange, RawSpace
from tuner.knobs.registry import (
    FLASH_ATTN,
    KNOB_TYPES,
    KV_CACHE_TYPES,
    LOOKUP_TYPES,
    NUMA_POLICIES,
    ON_OFF,
    SPEC_TYPES,
)
from tuner.studyfile.validate import Fields


def parse_domain(fields: Fields, knob: str) -> Domain:
    """One knob's domain from YAML: scalar, list of choices, or {low, high, step, log}."""
    value = fields.raw(knob)
    if isinstance(value, list):
        return _choices(fields, knob, value)
    if isinstance(value, dict):
        return _range(fields, knob, value)
    return Choices((_check(fields, knob, value, knob),))


def _choices(fields: Fields, knob: str, value: list) -> Choices:
    """A list of choices: each value checked where it stands (``knob[i]``), none twice."""
    if not value:
        fields.fail(knob, "empty list of choices; give at least one value")
    values = tuple(_check(fields, knob, v, f"{knob}[{i}]") for i, v in enumerate(value))
    if len(set(values)) != len(values):
        fields.fail(knob, "duplicate choices; list each value once")
    return Choices(values)


def _range(fields: Fields, knob: str, value: dict) -> IntRange | FloatRange:
    """``{low, high, step, log}`` of a numeric knob, refused where Optuna would refuse it later."""
    kind = KNOB_TYPES[knob]
    if kind is str:
        fields.fail(knob, "a range makes no sense here; give a list of choices")
    sub = Fields(fields.file, value, fields.name(knob))
    low = _check(fields, knob, sub.raw("low"), f"{knob}.low")
    high = _check(fields, knob, sub.raw("high"), f"{knob}.high")
    log = sub.bool("log", False)
    step = sub.raw("step", None)
    sub.done()
    if low > high:
        fields.fail(knob, f"empty range: low {low} > high {high}; swap them")
    if log and low <= 0:
        fields.fail(knob, "a log range needs low > 0")
    if step is not None:
        step = _check(fields, knob, step, f"{knob}.step")
        if step <= 0:
            fields.fail(f"{knob}.step", f"must be > 0, got {step}")
        if log:
            fields.fail(knob, "step and log cannot be combined (Optuna refuses it); drop one")
    if kind is int:
        return IntRange(low, high, step or 1, log)
    return FloatRange(low, high, step, log)


def _check(fields: Fields, knob: str, value: Any, where: str) -> Any:
    """One value of ``knob`` as its type (an int where a float is wanted is one), then within what the
    knob accepts; an error names ``where`` it is written."""
    kind = KNOB_TYPES[knob]
    if knob in ("flash_attn", "mmap", "mlock") and isinstance(value, bool):
        value = "on" if value else "off"  # YAML reads a bare on/off as a boolean
    ok = isinstance(value, kind) and not isinstance(value, bool)
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        ok, value = True, float(value)
    if not ok:
        fields.fail(where, f"expected {kind.__name__} values, got {type(value).__name__} {value!r}")
    _check_allowed(fields, knob, kind, value, where)
    return value


def _check_allowed(fields: Fields, knob: str, kind: type, value: Any, where: str) -> None:
    """The knob's own vocabulary (speculative types, NUMA policies, cache types, ...) and bounds."""
    if knob == "spec_type" and value not in SPEC_TYPES:
        fields.fail(where, f"unknown speculative type {value!r}; use one of {', '.join(SPEC_TYPES)}")
    if knob == "lookup" and value not in ("none", *LOOKUP_TYPES):
        fields.fail(where, f"unknown lookup {value!r}; use none or one of {', '.join(LOOKUP_TYPES)}")
    if knob == "numa" and value not in NUMA_POLICIES:
        fields.fail(where, f"unknown NUMA policy {value!r}; use one of {', '.join(NUMA_POLICIES)}")
    if knob == "flash_attn" and value not in FLASH_ATTN:
        fields.fail(where, f"unknown flash attention mode {value!r}; use one of {', '.join(FLASH_ATTN)}")
    if knob in ("mmap", "mlock") and value not in ON_OFF:
        fields.fail(where, f"expected on or off, got {value!r}")
    if knob in ("cache_type_k", "cache_type_v") and value not in KV_CACHE_TYPES:
        fields.fail(where, f"unknown KV cache type {value!r}; use one of {', '.join(KV_CACHE_TYPES)}")
    if knob in ("parallel", "batch", "ubatch") and value < 1:
        fields.fail(where, f"must be at least 1, got {value}")
    if knob == "poll" and value > 100:
        fields.fail(where, f"a polling level is 0..100, got {value}")
    if kind in (int, float) and value < 0:
        fields.fail(where, f"must not be negative, got {value}")


def parse_space(fields: Fields) -> RawSpace:
    """A search-space mapping (a file, or a study's overrides merged over one); its ``concurrent:``
    section holds domains used only when the study drives several users at once."""
    allow_smt = fields.bool("allow_smt", False)
    concurrent = _domains(fields.section("concurrent")) if fields.has("concurrent") else {}
    return RawSpace(_domains(fields, skip=("allow_smt", "concurrent")), allow_smt, concurrent=concurrent)


def _domains(fields: Fields, skip: tuple[str, ...] = ()) -> dict[str, Domain]:
    domains = {}
    for key in list(fields.data):
        if key in skip:
            continue
        if key not in KNOB_TYPES:
            fields.fail(
                key, f"unknown knob; known knobs: {', '.join(KNOB_TYPES)} (and allow_smt, concurrent)"
            )
        domains[key] = parse_domain(fields, key)
    fields.done()
    return domains
