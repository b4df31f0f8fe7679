"""Study files (``studies/NAME.yaml``): read and validate everything before anything runs.

A study names a target model, candidate drafts, a search space (a file plus per-study
overrides), a workload, objectives, a quality floor, measurement settings, a budget,
the storage, the sampler and, for workers sharing a database, their heartbeats. Paths
may use ``${VAR}`` and are relative to the study file. Any bad field is one line naming
the file, the field and the fix; nothing is written until the whole file (and the
models it names) has been checked.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from tuner.knobs.config import RawSpace
from tuner.knobs.registry import SOURCE_QUANT
from tuner.measurement.load import LATENCY_METRICS, LOAD_METRICS, metric_name, split_metric_name
from tuner.measurement.measure import MeasurementSettings
from tuner.measurement.quality import builtin_text
from tuner.measurement.workload import BUILTIN_CHAT_TEMPLATES, builtin_chat_template
from tuner.models.quantize import QuantizeRequest
from tuner.paths import check_study_name, storage_dir
from tuner.studyfile.validate import Fields, expand_env, load_yaml_mapping
from tuner.studyfile.written_space import parse_space

METRICS = {
    "tokens_per_second": "maximize",
    "acceptance": "maximize",
    "quality": "maximize",
    "speedup": "maximize",
}
QUALITY_SCORERS = ("agreement", "answers", "perplexity", "kld")
TEXT_SCORERS = ("perplexity", "kld")  # scorers that run llama-perplexity on quality.text_file
# A study of target variants excludes a variant whose mean KL divergence from the source exceeds this (nats)
# unless it sets quality.max_kld: llama.cpp's perplexity tables put Q4_K_M of a 7-8B model near 0.03 and
# Q3 and Q2 types from about 0.1 up, where answers start to change.
DEFAULT_TARGET_MAX_KLD = 0.10
SAMPLERS = ("structured", "tpe", "nsga2", "random")


@dataclass(frozen=True)
class Objective:
    metric: str
    direction: str


@dataclass(frozen=True)
class Constraint:
    """A bound on a load metric at one concurrency level (``constraints: {p95_ttft_ms: 2000}``):
    latencies at most ``limit`` milliseconds, aggregate tokens/s at least ``limit``."""

    name: str  # the metric at its level, as stored: p95_ttft_ms_c4
    metric: str
    users: int
    limit: float

    @property
    def upper(self) -> bool:
        return self.metric in LATENCY_METRICS

    def violation(self, value: float) -> float:
        """Feasible when <= 0, relative to the limit so bounds in ms and in tokens/s weigh alike."""
        return value / self.limit - 1.0 if self.upper else 1.0 - value / self.limit


@dataclass(frozen=True)
class QualitySpec:
    """How output quality is scored; see tuner.measurement.quality for which scorer suits which knob."""

    scorer: str = "agreement"
    floor: float = 0.95
    text_file: Path | None = None  # perplexity and kld scorers only
    max_kld: float | None = None  # kld scorer: a trial whose mean KLD exceeds this is infeasible too


@dataclass(frozen=True)
class WorkersSpec:
    """Database storages: heartbeats fail a dead worker's trial; see tuner.storage.coordination."""

    heartbeat_s: int = 30  # each running trial records a heartbeat this often
    grace_s: int = 120  # a running trial without a heartbeat this long is failed
    max_retry: int = 1  # a trial failed that way is queued again at most this often
    baseline_wait_s: float = 1800.0  # how long a joining worker waits for the baseline
    storage_retry_s: float = (
        120.0  # how long a storage outage is retried before the run stops (see tuner.storage.outage)
    )


@dataclass(frozen=True)
class SentinelSpec:
    """Re-measure the baseline configuration during a study, to divide by a reference that
    drifts with the machine rather than by one early measurement (see tuner.decisions.drift)."""

    every_trials: int = 5  # a sentinel after this many measured trials...
    every_minutes: float | None = 15.0  # ...or this long since the last one, whichever comes first
    after_busy: int = 3  # while every reference ran on a busy host: one after each trial, this many at most


@dataclass(frozen=True)
class RaceSpec:
    """The finalist race that declares a winner on fresh, interleaved measurements (see tuner.decisions.race)."""

    min_rounds: int = 3  # every finalist launched in each of these rounds (no decision before round 5)
    max_rounds: int = 11  # rounds at most; then what it may lose (undecided while a finalist is open)
    loss: float = (
        0.02  # stop once a finalist is within this of every other (95%): resources decide among those
    )
    confirm_rounds: int = (
        0  # optional: winner and baseline alone for a figure from rounds not used to pick it
    )
    expected_loss: float = 0.002  # stop once deploying the leader is expected to lose less (0: race on)
    budget_minutes: float | None = None  # no further selection round after this long
    max_finalists: int = 8  # besides the baseline; the closest to the leader first (the race drops the slow)


@dataclass(frozen=True)
class StudySpec:
    path: Path
    name: str
    target: Path
    drafts: tuple[Path, ...]
    space: RawSpace
    space_file: Path | None
    suites: tuple[str, ...]
    objectives: tuple[Objective, ...]
    quality: QualitySpec
    measurement: MeasurementSettings
    budget_trials: int
    budget_minutes: float | None
    storage: str
    sampler: str
    seed: int
    warm_start: tuple[dict[str, Any], ...] = field(default=())
    bin_dir: Path | None = None
    extra_args: tuple[str, ...] = ()
    workers: WorkersSpec = WorkersSpec()
    prune: bool = True  # stop a trial early once it clearly cannot beat the incumbent (tuner.search.pruning)
    reuse: bool = (
        True  # warm start from earlier studies in the same storage on this host (tuner.search.prior)
    )
    sentinel: SentinelSpec = SentinelSpec()
    race: RaceSpec = RaceSpec()
    quantize: tuple[QuantizeRequest, ...] = ()  # drafts made by llama-quantize (tuner.models.quantize)
    # the target's variants (``target: {path, quantize: [...]}``), searched as the knob target_quant
    target_quantize: tuple[QuantizeRequest, ...] = ()
    constraints: tuple[Constraint, ...] = ()  # bounds on load metrics (tuner.measurement.load)
    chat_template: Path | None = (
        None  # a Jinja file for chat suites (llama_cpp.chat_template); None: the model's
    )

    @property
    def base_dir(self) -> Path:
        return self.path.parent

    @property
    def load_levels(self) -> tuple[int, ...]:
        """The concurrency levels the load generator drives in every trial: none for a study of one user
        at a time that names no load metric (today's studies, measured as before)."""
        levels = self.measurement.concurrency
        named = any(split_metric_name(o.metric) for o in self.objectives) or self.constraints
        return levels if levels != (1,) or named else ()

    def draft_names(self) -> tuple[str, ...]:
        return tuple(p.stem for p in self.drafts) + tuple(q.name for q in self.quantize)


def default_storage_url() -> str:
    """One SQLite file for all studies, so the dashboard sees them all."""
    return f"sqlite:///{storage_dir() / 'studies.db'}"


def _path(fields: Fields, key: str, raw: str, base: Path) -> Path:
    path = Path(expand_env(raw, fields.file, fields.name(key))).expanduser()
    return path if path.is_absolute() else (base / path)


def _model_path(fields: Fields, key: str, raw: Any, base: Path) -> Path:
    if not isinstance(raw, str) or not raw.strip():
        fields.fail(key, f"expected a path to a .gguf file, got {raw!r}")
    path = _path(fields, key, raw, base)
    if not path.exists():
        fields.fail(key, f"{path} does not exist; fix the path (or run `make models` for the built-in ones)")
    if path.is_dir():
        fields.fail(key, f"{path} is a directory; point at the .gguf file")
    return path


def _study_name(fields: Fields, path: Path) -> str:
    """``name:`` (default: the file's stem): it names folders (logs, reports), so one safe folder name."""
    name = fields.str("name", None)
    if name is not None:
        return check_study_name(name, f"{fields.file}: name")
    return check_study_name(
        path.stem, f"{fields.file}: name (not set, so the file name's stem; set name: or rename the file)"
    )


def load_spec(path: str | Path) -> StudySpec:
    """Read and check a study file (not yet the models' contents: see study.prepare).

    One parser per section of the file, in the file's order; each holds that section's rules."""
    path = Path(path)
    fields = Fields(path, load_yaml_mapping(path))
    base = path.parent.resolve()

    name = _study_name(fields, path)
    target, target_quantize = _target(fields, base)
    drafts, quantize = _drafts(fields, base)
    space, space_file = _search_space_section(fields.section("search_space"), path, base)
    workload = fields.section("workload")
    suites, n_predict = _workload_section(workload)
    quality = _quality_section(fields.section("quality"), base, bool(target_quantize))
    measurement = _measurement_section(fields.section("measurement"), n_predict)
    measurement = replace(measurement, concurrency=_concurrency(workload, measurement))
    workload.done()
    objectives = _objectives(fields, measurement.concurrency)
    constraints = _constraints(fields.section("constraints"), measurement)
    budget_trials, budget_minutes = _budget_section(fields.section("budget"))
    storage = fields.str("storage", None) or default_storage_url()
    sampler = _sampler_section(fields.section("sampler"))  # sampler, seed, prune, reuse
    warm_start = _warm_start(fields)
    bin_dir, extra_args, chat_template = _llama_cpp_section(fields.section("llama_cpp"), base)
    workers = _workers_section(fields.section("workers"))
    sentinel = _sentinel_section(fields.section("sentinel"))
    race = _race_section(fields.section("race"))
    fields.done()

    return StudySpec(
        path=path,
        name=name,
        target=target,
        drafts=drafts,
        space=space,
        space_file=space_file,
        suites=suites,
        objectives=objectives,
        quality=quality,
        measurement=measurement,
        budget_trials=budget_trials,
        budget_minutes=budget_minutes,
        storage=storage,
        warm_start=warm_start,
        bin_dir=bin_dir,
        extra_args=extra_args,
        chat_template=chat_template,
        workers=workers,
        sentinel=sentinel,
        race=race,
        quantize=quantize,
        target_quantize=target_quantize,
        constraints=constraints,
        **sampler,
    )


def _budget_section(section: Fields) -> tuple[int, float | None]:
    """``budget:``: trials, and minutes if the study also stops on time."""
    trials, minutes = section.int("trials", 20, minimum=1), section.number("minutes", None, minimum=0.1)
    section.done()
    return trials, minutes


def _search_space_section(section: Fields, path: Path, base: Path) -> tuple[RawSpace, Path | None]:
    """``search_space:``: a space file (checked on its own, errors naming it) plus per-study overrides."""
    space_file = None
    merged: dict[str, Any] = {}
    if section.has("file"):
        space_file = _path(section, "file", section.str("file"), base)
        if not space_file.is_file():
            section.fail(
                "file",
                f"{space_file}: {'is a directory' if space_file.is_dir() else 'no such file'}; "
                "fix the path (relative to the study file's folder)",
            )
        merged.update(load_yaml_mapping(space_file))
        parse_space(Fields(space_file, dict(merged)))  # errors point at the space file itself
    overrides = section.raw("overrides", {})
    if not isinstance(overrides, dict):
        section.fail("overrides", "expected a mapping of knob: domain")
    from_file = frozenset(merged) - frozenset(overrides)
    merged.update(overrides)
    section.done()
    return replace(parse_space(Fields(path, merged, "search_space")), from_file=from_file), space_file


def _workload_section(section: Fields) -> tuple[tuple[str, ...], int]:
    """``workload:``: suite names or files, and tokens generated per request (the caller closes the section)."""
    suites = section.list("suites", ["code"])
    if not suites or not all(isinstance(s, str) and s for s in suites):
        section.fail("suites", "expected a non-empty list of suite names or files")
    return tuple(suites), section.int("n_predict", 128, minimum=1)


def _concurrency(section: Fields, measurement: MeasurementSettings) -> tuple[int, ...]:
    """``workload.concurrency``: the user counts every trial serves at once, each slot holding a prompt and
    n_predict tokens of its share of ctx_size (the prompts themselves are counted at prepare)."""
    levels = section.list("concurrency", [1])
    for index, users in enumerate(levels):
        if isinstance(users, bool) or not isinstance(users, int) or users < 1:
            section.fail(
                f"concurrency[{index}]",
                f"expected a number of users >= 1, got {users!r}; list user counts such as [1, 2, 4]",
            )
    if not levels or len(set(levels)) != len(levels):
        section.fail("concurrency", "expected a non-empty list of distinct user counts, such as [1, 2, 4]")
    top = max(levels)
    if measurement.ctx_size // top < measurement.n_predict + 2:
        section.fail(
            "concurrency",
            f"{top} users split measurement.ctx_size {measurement.ctx_size} into {measurement.ctx_size // top} "
            f"tokens per slot, too few for a prompt and n_predict {measurement.n_predict}; raise "
            f"measurement.ctx_size (at least {top * (measurement.n_predict + 2)}) or lower the level",
        )
    return tuple(sorted(levels))


def _metric(obj: Fields, levels: tuple[int, ...]) -> tuple[str, str]:
    """An objective's metric as stored, and its default direction: a load metric names its level
    (``aggregate_tokens_per_second_c4``; without one, the highest of workload.concurrency)."""
    raw = obj.str("metric")
    if raw in METRICS:
        return raw, METRICS[raw]
    load = split_metric_name(raw)
    if load is None:
        obj.fail(
            "metric",
            f"unknown value {raw!r}; use one of {', '.join([*METRICS, *LOAD_METRICS])} "
            "(a load metric optionally at a level: p95_ttft_ms_c4)",
        )
    metric, users = load
    return metric_name(metric, _level(obj, "metric", users, levels)), LOAD_METRICS[metric]


def _level(fields: Fields, key: str, users: int | None, levels: tuple[int, ...]) -> int:
    if users is None:
        return max(levels)
    if users not in levels:
        fields.fail(
            key,
            f"workload.concurrency has no level of {users} users ({', '.join(map(str, levels))}); "
            f"add it there or use one of those",
        )
    return users


def _objectives(fields: Fields, levels: tuple[int, ...]) -> tuple[Objective, ...]:
    """``objectives:``: a list of {metric, direction}, each metric once."""
    objectives = []
    default = [{"metric": m} for m in ("tokens_per_second", "acceptance", "quality")]
    for index, item in enumerate(fields.list("objectives", default)):
        obj = Fields(fields.file, item, f"objectives[{index}]")
        metric, default_direction = _metric(obj, levels)
        direction = obj.choice("direction", ("maximize", "minimize"), default_direction)
        obj.done()
        objectives.append(Objective(metric, direction))
    if not objectives:
        fields.fail("objectives", "give at least one objective")
    if len({o.metric for o in objectives}) != len(objectives):
        fields.fail("objectives", "an objective is listed twice")
    return tuple(objectives)


_OTHER_UNIT = re.compile(r"^(?P<base>p\d+_(?:ttft|tpot))_(?P<unit>s|sec|secs|seconds|us|ns|min)$")


def _constraints(section: Fields, measurement: MeasurementSettings) -> tuple[Constraint, ...]:
    """``constraints:``: load metric (at a level, default the highest) -> bound; latencies in milliseconds,
    at most; aggregate tokens/s at least. A bound no request can meet or miss is taken for a wrong unit."""
    constraints = []
    for key in list(section.data):
        load = split_metric_name(key)
        if load is None:
            other = _OTHER_UNIT.match(key)
            if other:
                section.fail(
                    key, f"latency constraints are in milliseconds: write {other['base']}_ms (2 s is 2000)"
                )
            section.fail(
                key,
                f"unknown constraint; use one of {', '.join(LOAD_METRICS)} (optionally at a level: "
                "p95_ttft_ms_c4)",
            )
        metric, users = load
        if isinstance(section.data[key], str):
            section.fail(
                key,
                f"expected a number, got {section.data[key]!r}; latencies are in milliseconds "
                "(2000 for 2 s), aggregate tokens/s a plain number",
            )
        limit = section.number(key, minimum=0.0)
        if metric in LATENCY_METRICS and not 1.0 <= limit <= measurement.trial_timeout_s * 1000:
            section.fail(
                key,
                f"{limit:g} ms cannot be a latency bound here (1 ms .. measurement.trial_timeout_s "
                f"{measurement.trial_timeout_s:g} s); latencies are in milliseconds, e.g. 2000 for 2 s",
            )
        if limit <= 0:
            section.fail(key, "an aggregate tokens/s bound must be > 0")
        level = _level(section, key, users, measurement.concurrency)
        constraints.append(Constraint(metric_name(metric, level), metric, level, limit))
    section.done()
    if len({c.name for c in constraints}) != len(constraints):
        section.fail("", "a metric is bounded twice at one level; keep one bound")
    return tuple(constraints)


def _quality_section(section: Fields, base: Path, target_variants: bool = False) -> QualitySpec:
    """``quality:``: the scorer, its floor; a text file for the scorers that run llama-perplexity; a KLD ceiling
    (for a study of target variants ``DEFAULT_TARGET_MAX_KLD`` unless it sets one). A study of target variants is
    scored by kld, its only scorer, by default; kld runs on the built-in text (``quality.builtin_text``) unless
    the study names one."""
    scorer = section.choice("scorer", QUALITY_SCORERS, "kld" if target_variants else "agreement")
    if target_variants and scorer != "kld":
        section.fail(
            "scorer",
            "a quantized target computes other logits, and its quality is their KL divergence from the "
            "source's; set quality.scorer: kld (or leave it out) or drop target.quantize",
        )
    floor = section.number("floor", 0.95, minimum=0.0, maximum=1.0)
    text_file = section.str("text_file", None)
    if scorer == "kld" and text_file is None:
        text_file = str(builtin_text())
    if scorer in TEXT_SCORERS and text_file is None:
        section.fail("text_file", f"the {scorer} scorer needs a text file to score; add quality.text_file")
    max_kld = section.number("max_kld", None, minimum=0.0)
    if max_kld is not None and scorer != "kld":
        section.fail("max_kld", "only the kld scorer has a mean-KLD ceiling; remove it or use scorer: kld")
    text_path = _path(section, "text_file", text_file, base) if text_file else None
    if text_path is not None and not text_path.is_file():
        section.fail("text_file", f"{text_path} is not a readable file")
    section.done()
    if target_variants and max_kld is None:
        max_kld = DEFAULT_TARGET_MAX_KLD
    return QualitySpec(scorer, floor, text_path, max_kld)


def _measurement_section(section: Fields, n_predict: int) -> MeasurementSettings:
    """``measurement:``: warmup, repetitions (and their cap), context, seed, noise and timeout."""
    measurement = MeasurementSettings(
        warmup=section.int("warmup", 1, minimum=0),
        repetitions=section.int("repetitions", 3, minimum=1),
        max_repetitions=section.int("max_repetitions", None, minimum=1),
        n_predict=n_predict,
        ctx_size=section.int("ctx_size", 2048, minimum=128),
        seed=section.int("seed", 42, minimum=0),
        noise_cv=section.number("noise_cv", 0.10, minimum=0.0),
        trial_timeout_s=section.number("trial_timeout_s", 600.0, minimum=1.0),
    )
    if measurement.max_repetitions is not None and measurement.max_repetitions < measurement.repetitions:
        section.fail(
            "max_repetitions",
            f"must be at least repetitions ({measurement.repetitions}); "
            "repetitions go on past `repetitions` until the cv is below noise_cv or this cap",
        )
    section.done()
    return measurement


def _sampler_section(section: Fields) -> dict[str, Any]:
    """``sampler:``: name, seed, pruning, warm start from earlier studies (as StudySpec's fields)."""
    sampler = {
        "sampler": section.choice("name", SAMPLERS, "structured"),
        "seed": section.int("seed", 0, minimum=0),
        "prune": section.bool("prune", True),
        "reuse": section.bool("reuse", True),
    }
    section.done()
    return sampler


def _warm_start(fields: Fields) -> tuple[dict[str, Any], ...]:
    """``warm_start:``: configurations to measure first, each a mapping of knob: value."""
    warm_start = fields.list("warm_start", [])
    for index, item in enumerate(warm_start):
        if not isinstance(item, dict):
            fields.fail(f"warm_start[{index}]", "expected a mapping of knob: value")
    return tuple(warm_start)


def _llama_cpp_section(llama: Fields, base: Path) -> tuple[Path | None, tuple[str, ...], Path | None]:
    """``llama_cpp:``: a user build's folder, extra llama-server arguments (argv elements, no shell), and
    the chat template for chat suites (a built-in name or a Jinja file)."""
    bin_dir_raw = llama.str("bin_dir", None)
    extra_args = llama.list("extra_args", [])
    if not all(isinstance(a, str) for a in extra_args):
        llama.fail("extra_args", "expected a list of strings (one argv element each; no shell syntax)")
    template_raw = llama.str("chat_template", None)
    llama.done()
    bin_dir = _path(llama, "bin_dir", bin_dir_raw, base) if bin_dir_raw else None
    return bin_dir, tuple(extra_args), _chat_template(llama, template_raw, base)


def _chat_template(llama: Fields, raw: str | None, base: Path) -> Path | None:
    """A built-in template name (tuner/data/chat_templates/NAME.jinja) or a path to a Jinja file."""
    if raw is None:
        return None
    if raw in BUILTIN_CHAT_TEMPLATES:
        return builtin_chat_template(raw)
    path = _path(llama, "chat_template", raw, base)
    if not path.is_file():
        llama.fail(
            "chat_template",
            f"{raw!r} is neither a built-in template ({', '.join(BUILTIN_CHAT_TEMPLATES)}) nor a Jinja file",
        )
    return path


def _workers_section(section: Fields) -> WorkersSpec:
    """``workers:``: heartbeats, grace before a silent trial is failed, retries, baseline wait, storage outages."""
    workers = WorkersSpec(
        heartbeat_s=section.int("heartbeat_s", 30, minimum=1),
        grace_s=section.int("grace_s", 120, minimum=1),
        max_retry=section.int("max_retry", 1, minimum=0),
        baseline_wait_s=section.number("baseline_wait_s", 1800.0, minimum=1.0),
        storage_retry_s=section.number("storage_retry_s", 120.0, minimum=0.0),
    )
    if workers.grace_s <= workers.heartbeat_s:
        section.fail(
            "grace_s", f"must exceed heartbeat_s ({workers.heartbeat_s}), or live trials are failed as dead"
        )
    section.done()
    return workers


def _sentinel_section(se: Fields) -> SentinelSpec:
    """``sentinel:``: how often the baseline is re-measured during a study."""
    sentinel = SentinelSpec(
        every_trials=se.int("every_trials", 5, minimum=1),
        every_minutes=se.number("every_minutes", 15.0, minimum=0.1),
        after_busy=se.int("after_busy", 3, minimum=0),
    )
    se.done()
    return sentinel


def _race_section(section: Fields) -> RaceSpec:
    """``race:``: the sequential race's rounds, the loss it stops at, confirmation rounds, finalists."""
    if section.has("rounds"):
        section.fail(
            "rounds", "the race is sequential now: set max_rounds (and min_rounds, loss, confirm_rounds)"
        )
    if section.has("equivalence"):
        section.fail(
            "equivalence",
            "the race bounds a loss now: set loss (stop once a finalist is within it of every other, 95%; "
            "default 0.02)",
        )
    race = RaceSpec(
        min_rounds=section.int("min_rounds", 3, minimum=3),
        max_rounds=section.int("max_rounds", RaceSpec.max_rounds, minimum=3),
        loss=section.number("loss", 0.02, minimum=0.001, maximum=0.5),
        expected_loss=section.number("expected_loss", RaceSpec.expected_loss, minimum=0.0, maximum=0.5),
        confirm_rounds=section.int("confirm_rounds", 0, minimum=0),
        budget_minutes=section.number("budget_minutes", None, minimum=0.1),
        max_finalists=section.int("max_finalists", 8, minimum=1),
    )
    if race.max_rounds < race.min_rounds:
        section.fail("max_rounds", f"must be at least min_rounds ({race.min_rounds})")
    section.done()
    return race


def _target(fields: Fields, base: Path) -> tuple[Path, tuple[QuantizeRequest, ...]]:
    """``target:``: a path, or ``{path, quantize: [TYPE, ...]}``: the file (the highest precision the operator
    has) and llama-quantize variants of it, each offered as a value of the knob ``target_quant``."""
    raw = fields.raw("target")
    if not isinstance(raw, dict):
        return _model_path(fields, "target", raw, base), ()
    item = Fields(fields.file, raw, fields.name("target"))
    source = _model_path(item, "path", item.raw("path"), base)
    types = item.list("quantize", [])
    if not types or not all(isinstance(t, str) and t.strip() for t in types):
        item.fail("quantize", "expected a non-empty list of llama-quantize types, e.g. [Q8_0, Q4_K_M, Q4_0]")
    item.done()
    names = [t.strip().upper() for t in types]
    for name in names:
        if name.startswith("IQ") or name in ("Q2_K_S",):
            item.fail(
                "quantize",
                f"{name} needs an importance matrix (llama-imatrix), which this tuner does not compute; "
                "use a type without one, e.g. Q2_K, Q3_K_M, Q4_K_M",
            )
        if name == SOURCE_QUANT.upper():
            item.fail("quantize", f"{name!r} names the source file itself; list llama-quantize types only")
    if len(set(names)) != len(names):
        item.fail("quantize", "a type is listed twice; list each once")
    return source, tuple(QuantizeRequest(source, name) for name in names)


def _drafts(fields: Fields, base: Path) -> tuple[tuple[Path, ...], tuple[QuantizeRequest, ...]]:
    """``drafts:`` entries: a path, or ``{path, quantize: [TYPE, ...]}`` asking for requantized variants
    of that file (only the variants are offered; the target itself may be the path: self-speculation)."""
    paths: list[Path] = []
    requests: list[QuantizeRequest] = []
    for index, entry in enumerate(fields.list("drafts", [])):
        if not isinstance(entry, dict):
            paths.append(_model_path(fields, f"drafts[{index}]", entry, base))
            continue
        item = Fields(fields.file, entry, fields.name(f"drafts[{index}]"))
        source = _model_path(item, "path", item.raw("path"), base)
        types = item.list("quantize", [])
        if not types or not all(isinstance(t, str) and t.strip() for t in types):
            item.fail("quantize", "expected a non-empty list of llama-quantize types, e.g. [Q8_0, Q4_0]")
        item.done()
        requests += [QuantizeRequest(source, t.strip().upper()) for t in types]
    stems = [p.stem for p in paths] + [q.name for q in requests]
    if len(set(stems)) != len(stems):
        fields.fail(
            "drafts",
            "two drafts share a name; drafts are named by file stem (plus -TYPE for quantize "
            "variants), rename one or drop a duplicate type",
        )
    return tuple(paths), tuple(requests)
