"""Does a deployed preset section still pay on this host and build (``tuner verify``)?

Why: an export's speedup was measured on the study's host, with the study's llama.cpp build, on the day
of the export. A new build, an operator's edit to the section or a host that changed can take it away, and
nothing in the preset file would say so. So the section is launched as it is deployed (its options over the
preset's ``[*]`` ones, on the build in use), against the study's baseline configuration on the same build, in
paired rounds (``remeasure.rounds_of_launches``: one fresh launch of each per round, Williams order) on the
study's held-out prompts (``measurement.workload.split``, as the per-type race; a suite too small to split is
measured whole, and said so), and its speedup is set beside the one the export claimed.

**The verdict** (``verdict``): S is the section's speedup over the baseline, the geometric mean of the paired
per-round ratios, [lo, hi] its two-sided 95% t-interval (``evidence.ratio``); the claim is the export's figure
for the section's trial, C [C_lo, C_hi] (its confirmation rounds' speedup and interval when the race ran them,
else the race's estimate and simultaneous interval on its paired rounds: ``claim_for``). C_lo is C where the
claim has no interval.

* ``holds``: lo > 1 and hi >= C_lo x (1 - ``CLAIM_TOLERANCE``). Shown faster than the baseline, and the interval
  reaches within 10% of the claim's: the measurement does not contradict the claim (an interval wholly above the
  claim holds too: faster than claimed).
* ``smaller than claimed``: lo > 1 and hi below that. Still shown faster than the baseline, but the whole
  interval lies more than 10% below the claimed speedup's whole interval: more than a host's other work moves it.
* ``no longer shown faster``: lo <= 1, or fewer than ``evidence.MIN_ROUNDS`` paired rounds (no interval). The
  section is not shown faster than llama.cpp's defaults on this host and build.

Why against the claim's interval and not its estimate: the claim is a measurement too, so a precise
verification whose interval meets the claim's does not contradict it, wherever the claim's estimate lies
(evidence: docs/decisions.md#verification-tolerance).

**Exit codes** (``EXIT``): 0 holds, 1 no longer shown faster, 4 smaller than claimed; 2 a user error (one
line), as every command.

**What changed** (``why_lines``): the build in use against the study's build manifest (commit, build number,
cmake flags, the flags its llama-server lists: ``build_differences``), the section against what the export wrote for its trial (``edits``), and the machine against the
study's fingerprint. When only the build differs, a change is the build's; when several differ, verify says it
cannot tell them apart and how to.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from tuner import figure_text
from tuner.decisions import evidence
from tuner.decisions.race import RaceResult
from tuner.decisions.remeasure import MODEL_FLAGS, Contender, StudyInputs, contender, rounds_of_launches
from tuner.errors import UserError
from tuner.machine.llama_build import build_label
from tuner.measurement.launch import NO_SPECULATION
from tuner.measurement.workload import Workload, restrict, split
from tuner.progress import Progress
from tuner.storage.records import TrialRecord

HOLDS = "holds"
SMALLER = "smaller than claimed"
# How far below the claim's interval a verification may end and still hold: the claim was measured at another
# moment of the host, and a speedup moves with what else runs, the section, the build and the machine unchanged
# (evidence: docs/decisions.md#verification-tolerance).
CLAIM_TOLERANCE = 0.10
NOT_FASTER = "no longer shown faster"
EXIT = {HOLDS: 0, NOT_FASTER: 1, SMALLER: 4}
MEANING = {
    HOLDS: "shown faster than the baseline, and the interval reaches the claim's",
    SMALLER: "shown faster than the baseline, but the whole interval lies below the claim's",
    NOT_FASTER: "not shown faster than the baseline on this host and build (its interval does not lie above 1)",
}
DEFAULT_TEMPERATURE = 0.8  # llama-server's own, for a section without ``temp``
SECTION, BASELINE = "section", "baseline"  # the two contenders' labels (and their launch logs' names)
MAX_FORECAST_ROUNDS = 1000
BUILD_KEYS = ("commit", "build_number", "cmake_flags")  # what makes two llama.cpp builds the same build


@dataclass(frozen=True)
class Claim:
    """What the export said of the section's trial: its speedup over the baseline and interval, and whence."""

    speedup: float
    low: float
    high: float
    source: str

    @property
    def floor(self) -> float:
        """The bottom of the claim's interval (its estimate where it has none): ``verdict`` compares with it."""
        return self.low if figure_text.finite(self.low) and self.low > 0 else self.speedup

    def text(self) -> str:
        """``x1.76 [1.70, 1.82] (the export's race, 5 paired rounds)``."""
        bounds = figure_text.finite(self.high) and figure_text.finite(self.low) and self.low > 0
        interval = f"[{self.low:.2f}, {self.high:.2f}]" if bounds else "(no interval)"
        return f"x{self.speedup:.2f} {interval} ({self.source})"


def claim_for(race: RaceResult, trial: int) -> Claim:
    """The export's figure for ``trial``: its confirmation rounds when it won and they ran, else its speedup on
    the race's paired rounds. A trial the race did not measure, or the baseline, has no claim to check."""
    if trial == race.baseline_trial:
        raise UserError(
            f"trial {trial} is the study's baseline: the export deployed llama.cpp's defaults, which claim no "
            "speedup to verify; export a finalist shown faster (`tuner export`), then verify it"
        )
    entry = next((e for e in race.entries if e.trial == trial), None)
    if entry is None:
        raced = ", ".join(str(e.trial) for e in race.entries)
        raise UserError(
            f"trial {trial} is not in the study's last race (trials {raced}), so there is no claimed speedup to "
            "check it against; export it (`tuner export STUDY --trial N`), then verify"
        )
    confirmation = race.confirmation
    if trial == race.winner and confirmation is not None:
        return Claim(
            confirmation.speedup,
            confirmation.low,
            confirmation.high,
            f"the export's {confirmation.rounds} confirmation rounds",
        )
    ratio = race.speedup_of(entry)
    return Claim(ratio.estimate, ratio.low, ratio.high, f"the export's race, {ratio.rounds} paired rounds")


def verdict(ratio: evidence.Ratio, claim: Claim) -> str:
    """``holds``, ``smaller than claimed`` or ``no longer shown faster`` (the module's rule)."""
    if not ratio.enough or not ratio.low > 1.0:
        return NOT_FASTER
    return HOLDS if ratio.high >= claim.floor * (1 - CLAIM_TOLERANCE) else SMALLER


def verification_workload(workload: Workload) -> tuple[Workload, str]:
    """The study's held-out prompts (a suite too small to split: all of its prompts), and what was taken."""
    splits, unsplit = split(workload)
    held = [i for s in splits.values() for i in s.held_out]
    if not held:
        return workload, (
            f"the whole workload ({len(workload.prompts)} prompts; no suite has enough prompts to hold some out, "
            "so these are prompts the study tuned on)"
        )
    whole = [p.id for p in workload.prompts if p.suite in unsplit]
    note = f"{len(held)} held-out prompts ({', '.join(splits)})"
    if whole:
        note += f" and every prompt of {', '.join(unsplit)} ({len(whole)}: too few to hold some out)"
    return restrict(workload, [*held, *whole]), note


def section_contender(
    options: Mapping[str, str], server: Path, numactl: str | None, policy: tuple[str, ...], where: str
) -> Contender:
    """The section's options as a launch on ``server`` (``key = true``: a switch), under the numactl memory
    policy its export noted; a model file that is not here is one line naming ``where`` (file and section)."""
    argv: list[str] = []
    models = []
    for key, value in options.items():
        flag = ("-" if len(key) == 1 else "--") + key
        argv += [flag] if value == "true" else [flag, value]
        if flag in MODEL_FLAGS or flag == "-m":
            if not Path(value).is_file():
                raise UserError(f"{where}: {key} = {value}: no such file on this host; fix the path")
            models.append(value)
    prefix: list[str] = []
    if policy:
        if numactl is None:
            raise UserError(f"{where}: tuned under numactl {' '.join(policy)}, which is not installed here")
        prefix = [numactl, *policy]
    try:
        temperature = float(options.get("temp", DEFAULT_TEMPERATURE))
    except ValueError:
        raise UserError(f"{where}: temp = {options['temp']}: not a number; fix it") from None
    numa = "interleave" if any("interleave" in p for p in policy) else "bind" if policy else "none"
    speculation = "" if options.get("spec-type", "none") == "none" else options["spec-type"]
    return Contender(
        SECTION, [*prefix, str(server), *argv], temperature, numa, tuple(models), None, speculation
    )


def baseline_contender(record: TrialRecord, server: Path, flags: frozenset[str] = frozenset()) -> Contender:
    """The study's baseline configuration as stored, launched on ``server`` (the build in use): without
    speculation on any build, so ``--no-spec-type`` where ``flags`` (that build's ``--help``) lists it and the
    stored command does not say it (a build that speculates by default would otherwise speculate here)."""
    if record.command is None:
        raise UserError(f"the baseline, trial {record.number}, has no stored command to launch")
    base = contender(BASELINE, record)
    at = base.argv.index(record.command.binary)
    argv = [*base.argv[:at], str(server), *base.argv[at + 1 :]]
    if NO_SPECULATION in flags and not {NO_SPECULATION, "--spec-type"} & set(argv):
        argv.append(NO_SPECULATION)
    return replace(base, argv=argv)


def edits(exported: Mapping[str, str], deployed: Mapping[str, str]) -> list[str]:
    """How the deployed section differs from what the export wrote for its trial, one phrase per option."""
    changed = []
    for key in dict.fromkeys([*exported, *deployed]):
        was, now = exported.get(key), deployed.get(key)
        if was == now:
            continue
        changed.append(
            f"{key} removed (exported {was})"
            if now is None
            else f"{key} = {now} added"
            if was is None
            else f"{key} = {now} (exported {was})"
        )
    return changed


def build_text(build: Mapping) -> str:
    return build_label(build)


def build_change(study_build: Mapping, this_build: Mapping) -> str:
    """ "" when this run uses the study's build (same commit, build number and flags, and the same llama-server
    flags where both list theirs), else both and what differs between them, in words."""
    differs = build_differences(study_build, this_build)
    if not differs:
        return ""
    return (
        f"the study measured {build_text(study_build)}; this run uses {build_text(this_build)} "
        f"({'; '.join(differs)})"
    )


def build_differences(study_build: Mapping, this_build: Mapping) -> list[str]:
    """What differs between two build manifests, one phrase each: the keys that make a build (``BUILD_KEYS``), then
    the flags each llama-server's ``--help`` lists (a new default such as speculation comes with new flags: a
    build that speculates by default adds ``--no-spec-type``), where both manifests hold them."""
    differs = [
        f"{key} {study_build.get(key)} -> {this_build.get(key)}"
        for key in BUILD_KEYS
        if study_build.get(key) != this_build.get(key)
    ]
    if "server_flags" in study_build and "server_flags" in this_build:
        was, now = set(study_build["server_flags"]), set(this_build["server_flags"])
        if now - was:
            differs.append(f"its llama-server adds {' '.join(sorted(now - was))}")
        if was - now:
            differs.append(f"its llama-server drops {' '.join(sorted(was - now))}")
    return differs


@dataclass(frozen=True)
class Verification:
    """One ``tuner verify``: what it launched, what it measured, against what claim, and the verdict (one line of
    the study's record: ``store.append_verification``)."""

    time: str  # UTC, ISO 8601
    host: str
    preset: str
    section: str
    trial: int  # the export's trial the section came from
    build: str  # the llama.cpp commit this run used
    build_number: int | None
    study_build: str  # the study's
    rounds: int
    prompts: str  # what was measured: held-out prompts, or the whole workload
    section_rates: list[float]
    baseline_rates: list[float]
    speedup: float
    low: float
    high: float
    claim: float
    claim_low: float
    claim_high: float
    claim_source: str
    verdict: str
    edited: list[str] = field(default_factory=list)  # the section's options that differ from the export's
    why: list[str] = field(default_factory=list)

    @property
    def ratio(self) -> evidence.Ratio:
        return evidence.Ratio(self.speedup, self.low, self.high, self.rounds)

    @property
    def claimed(self) -> Claim:
        return Claim(self.claim, self.claim_low, self.claim_high, self.claim_source)

    def to_json(self) -> dict:
        return figure_text.json_safe(asdict(self))


def measure(
    ctx: StudyInputs,
    section: Contender,
    baseline: Contender,
    workload: Workload,
    rounds: int,
    progress: Progress,
) -> tuple[list[float], list[float], evidence.Ratio]:
    """Both launched once per round for ``rounds`` rounds: their rates, and the section over the baseline."""
    rates = rounds_of_launches([section, baseline], workload, ctx.settings, rounds, ctx.log_dir, progress)
    mine, theirs = rates[SECTION].tokens_per_second, rates[BASELINE].tokens_per_second
    return mine, theirs, evidence.ratio(mine, theirs)


def rounds_to_show(mine: list[float], theirs: list[float]) -> float:
    """Paired rounds at which an estimate above 1 at this spread would be shown faster (its 95% interval above
    1); infinite when the estimate is not above 1, there is no spread yet, or it would take more than
    ``MAX_FORECAST_ROUNDS``."""
    logs = evidence.log_ratios(mine, theirs)
    if len(logs) < 2 or statistics.fmean(logs) <= 0:
        return math.inf
    mean, sd = statistics.fmean(logs), statistics.stdev(logs)
    for rounds in range(max(len(logs), evidence.MIN_ROUNDS), MAX_FORECAST_ROUNDS + 1):
        if evidence.t_quantile(1 - (1 - evidence.CONFIDENCE) / 2, rounds - 1) * sd / math.sqrt(rounds) < mean:
            return float(rounds)
    return math.inf


def why_lines(result: str, build: str, edited: list[str], host: list[str]) -> list[str]:
    """What changed since the export, and what a verdict other than ``holds`` is attributed to."""
    changed = [
        *([f"the build changed: {build}"] if build else []),
        *([f"the section was edited: {'; '.join(edited)}"] if edited else []),
        *([f"the machine differs: {'; '.join(host)}"] if host else []),
    ]
    if result == HOLDS:
        return [f"{line}; the claim still holds" for line in changed]
    if not changed:
        return [
            "the section, the build and the machine are the export's: the change is the host's state now "
            "(load, other work) or the claim's luck; verify again on a quiet host"
        ]
    if len(changed) == 1:
        return [f"{changed[0]}; the only change since the export, so the difference is put down to it"]
    return [
        *changed,
        "several things changed since the export, so verify cannot tell which did this: verify the section as "
        "exported (`tuner preset rollback`) or on the study's build (--bin-dir) to tell them apart",
    ]


def result_lines(verification: Verification, mean_section: float, mean_baseline: float) -> list[str]:
    """What an operator reads after the rounds: the rates, the speedup beside the claim, the verdict, why."""
    lines = [
        f"verify: section {mean_section:.1f} t/s, baseline {mean_baseline:.1f} t/s (geometric means over "
        f"{verification.rounds} launches each)",
        f"verify: speedup {verification.ratio.text()} over the baseline (95%, {verification.rounds} paired rounds); the export claimed "
        f"{verification.claimed.text()}",
        f"verdict: {verification.verdict}: {MEANING[verification.verdict]}"
        + (
            "; the whole interval lies below 1: it is shown slower than the baseline"
            if verification.high < 1
            else ""
        ),
    ]
    more = (
        rounds_to_show(verification.section_rates, verification.baseline_rates)
        if verification.verdict == NOT_FASTER
        else math.inf
    )
    if figure_text.finite(more):
        lines.append(
            f"forecast: at this spread, about {more:.0f} paired rounds would show x{verification.speedup:.2f} faster "
            f"(`--rounds {more:.0f}`)"
        )
    return lines + [f"why: {line}" for line in verification.why]
