"""The report's tables: the study at a glance (the summary and its rows), the race, the verifications,
and the columns of the tables the page shows its frames in.
"""

from __future__ import annotations

import html

import pandas as pd

from tuner.decisions.race import RaceResult
from tuner.machine.roofline import Roofline
from tuner.output.analysis import ReportData, complete
from tuner.output.report_markup import cell_text, html_table
from tuner.search.prior import describe_prior
from tuner.storage.records import WarmStartPrior


def race_table(race: RaceResult) -> str:
    """The race's entries; a column of launches on a busy host, and one of launches not pinned as asked, when there
    were any."""
    busy = any(e.busy_launches for e in race.entries)
    unpinned = any(e.unpinned_launches for e in race.entries)
    rows = pd.DataFrame(
        [
            {
                "trial": e.trial,
                "winner": "*" if e.trial == race.winner else "",
                "launches": len(e.rates),
                "mean_tps": e.mean_tokens_per_second,
                "recorded_tps": e.recorded_tokens_per_second,
                "speedup": e.speedup,
                "interval": race.speedup_of(e).text() if e.trial != race.baseline_trial else "baseline",
                "status": e.status,
                "config": " ".join(f"{k}={v}" for k, v in e.config.items()),
                **({"busy": e.busy_launches} if busy else {}),
                **({"unpinned": e.unpinned_launches} if unpinned else {}),
            }
            for e in race.entries
        ]
    )
    notes = [
        f"<p>Verdict: {html.escape(race.verdict)}. Winner: {html.escape(race.figure())}.</p>",
        f"<p>What it may lose: {html.escape(race.loss_line())}.</p>",
    ]
    notes += [f"<p>Outlier: {html.escape(line)}</p>" for line in race.outliers]
    return "".join(notes) + html_table(
        rows,
        {
            "trial": "trial",
            "winner": "winner",
            "launches": "launches (selection)",
            "mean_tps": "geometric mean t/s (race)",
            "recorded_tps": "recorded t/s (study)",
            "speedup": "speedup (paired rounds)",
            "interval": "95% interval (simultaneous over the finalists)",
            "status": "status",
            "config": "configuration",
            **({"busy": "launches on a busy host (rates may read low)"} if busy else {}),
            **({"unpinned": "launches whose threads left the asked CPUs"} if unpinned else {}),
        },
    )


def verification_table(lines: list[dict]) -> str:
    """Every ``tuner verify``, oldest first: where and on which build, the speedup beside the claim, the verdict."""
    rows = pd.DataFrame(
        [
            {
                "time": v.get("time"),
                "host": v.get("host"),
                "section": f"[{v.get('section')}] trial {v.get('trial')}",
                "build": f"{v.get('build')}"
                + (
                    ""
                    if v.get("build") == v.get("study_build")
                    else f" (the study's: {v.get('study_build')})"
                ),
                "rounds": v.get("rounds"),
                "speedup": _interval(v.get("speedup"), v.get("low"), v.get("high")),
                "claim": _interval(v.get("claim"), v.get("claim_low"), v.get("claim_high")),
                "verdict": v.get("verdict"),
                "edited": "; ".join(v.get("edited") or []) or "as exported",
            }
            for v in lines
        ]
    )
    return html_table(
        rows,
        {
            "time": "time (UTC)",
            "host": "host",
            "section": "section",
            "build": "llama.cpp build",
            "rounds": "paired rounds",
            "speedup": "speedup [95%]",
            "claim": "claimed by the export",
            "verdict": "verdict",
            "edited": "section edits",
        },
    )


def _interval(estimate: float | None, low: float | None, high: float | None) -> str:
    """``x1.31 [1.25, 1.38]``; a bound stored as null (no interval) in words."""
    if estimate is None:
        return "no figure"
    return f"x{estimate:.2f} [{cell_text(low) or '-'}, {cell_text(high) or 'no bound'}]"


def summary_table(data: ReportData) -> str:
    """The study at a glance, before any figure: what was tuned on what, the trials, the best, and where a
    warm start and the roofline put it."""
    done = complete(data.trials)
    rows = _setup_rows(data, done) + _best_rows(done)
    if data.prior:
        rows.append(_warm_start_row(data.prior))
    if data.roofline is not None:
        rows.append(_roofline_row(data.roofline))
    return (
        "<table>"
        + "".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(v)}</td></tr>" for k, v in rows)
        + "</table>"
    )


def _setup_rows(data: ReportData, done: pd.DataFrame) -> list[tuple[str, str]]:
    """What the numbers are of: target, machine, build, objectives, quality, trials and the baseline."""
    fp, build = data.record.fingerprint, data.record.build
    return [
        ("target", _target_text(data.record.target)),
        (
            "machine",
            f"{fp.get('cpu_model')}: {fp.get('physical_cores')} cores / {fp.get('logical_cpus')} CPUs, "
            f"NUMA nodes {fp.get('numa_nodes')}, {fp.get('memory_gib')} GiB",
        ),
        (
            "llama.cpp",
            f"commit {fp.get('llama_commit') or build.get('commit')}, flags {fp.get('llama_build_flags')}",
        ),
        ("objectives", ", ".join(data.objectives)),
        ("quality", f"{data.record.quality.get('scorer')} scorer, floor {data.floor}"),
        (
            "trials",
            f"{len(data.trials)} finished: {len(done)} complete, {int(done['feasible'].sum())} feasible, "
            f"{len(data.failures)} failed",
        ),
        ("baseline", _baseline_text(data)),
    ]


def _baseline_text(data: ReportData) -> str:
    """The baseline's rate and which reading it is: the baseline trial's, or, where that reading ran on a busy host
    or the sentinels contradicted it, their median, the first reading named and why it is left out; where every
    reading ran on a busy host, the busy one, said so."""
    rate = f"{cell_text(data.baseline_tokens_per_second, 1)} tokens/s (target alone, greedy"
    disturbed = data.disturbed_baseline
    if disturbed is None:
        reference = data.reference_trial
        reading = f"; trial {reference}'s reading" if reference is not None else ""
        if data.baseline_busy:
            return (
                f"{rate}{reading}, on a busy host ({data.baseline_busy}) like every re-measure of it: no quiet "
                "reading to replace it, so every speedup divides by a busy one)"
            )
        return rate + reading + ")"
    if disturbed.busy:
        return (
            f"{rate}; the median of its {disturbed.sentinels} quiet re-measure(s): its first reading, "
            f"{disturbed.first:.1f} tokens/s, ran on a busy host ({disturbed.busy}) and is left out)"
        )
    busy = (
        f"; those re-measures ran on a busy host too ({data.baseline_busy}): no quiet reading, so every speedup "
        "divides by a busy one"
        if data.baseline_busy
        else ""
    )
    return (
        f"{rate}; the median of its {disturbed.sentinels} re-measures: its first reading, {disturbed.first:.1f} "
        f"tokens/s, disagreed with them beyond the noise, the host disturbed, and is left out{busy})"
    )


def _target_text(target: dict) -> str:
    """The target model: name, architecture, quantization, the weights a token reads, experts if any."""
    return (
        f"{target.get('name') or target.get('path')} ({target.get('architecture')}, "
        f"{target.get('quantization')}, {(target.get('weights_bytes') or 0) / 1e9:.2f} GB of weights"
        + (
            f", {target.get('expert_used_count')} of {target.get('expert_count')} experts"
            if target.get("is_moe")
            else ""
        )
        + ")"
    )


def _best_rows(done: pd.DataFrame) -> list[tuple[str, str]]:
    """The fastest feasible trial and its speedup, when there is one."""
    best = done[done["feasible"]].sort_values("tokens_per_second", ascending=False).head(1)
    if best.empty:
        return []
    best_row = best.iloc[0]
    return [
        (
            "best feasible",
            f"trial {best_row['trial']}: {best_row['tokens_per_second']:.1f} tokens/s, "
            f"x{cell_text(best_row['speedup'])} over the baseline",
        )
    ]


def _warm_start_row(prior: WarmStartPrior) -> tuple[str, str]:
    """Which earlier study the search started from, and what of it was tried early."""
    reused = [
        k
        for k, v in (("its NUMA policy and threads", prior["hardware"]), ("its winner", prior["params"]))
        if v
    ]
    return ("warm start", f"from {describe_prior(prior)}: {' and '.join(reused)} tried early")


def _roofline_row(roofline: Roofline) -> tuple[str, str]:
    """The bandwidth ceiling of decode without speculation, to read the speedups against."""
    return (
        "roofline",
        f"{roofline.bandwidth.bytes_per_s / 1e9:.1f} GB/s ({roofline.bandwidth.note}); "
        f"{roofline.bytes_per_token(None) / 1e9:.3f} GB read per token ({roofline.note}): "
        f"ceiling {roofline.tokens_per_second(None):.1f} tokens/s without speculation",
    )


LATENCY_TABLE = {
    "users": "users",
    "family": "family",
    "trial": "trial",
    "aggregate_tokens_per_second": "aggregate tokens/s",
    "p50_ttft_ms": "p50 TTFT ms",
    "p95_ttft_ms": "p95 TTFT ms",
    "p50_tpot_ms": "p50 TPOT ms",
    "p95_tpot_ms": "p95 TPOT ms",
}
PARETO_TABLE = {
    "trial": "trial",
    "tokens_per_second": "tokens/s",
    "speedup": "x baseline",
    "roofline_fraction": "of ceiling",
    "acceptance": "acceptance",
    "quality": "quality",
    "method": "draft",
    "draft_max": "K",
    "temperature": "T",
    "experts": "experts",
    "threads": "threads",
    "numa": "numa",
    "command": "command",
}
SUITE_TABLE = {
    "suite": "suite",
    "trial": "trial",
    "tokens_per_second": "tokens/s",
    "method": "draft",
    "draft_max": "K",
    "temperature": "T",
}
FAILURE_TABLE = {
    "trial": "trial",
    "method": "draft",
    "draft_max": "K",
    "threads": "threads",
    "failure_reason": "reason",
    "failure_detail": "detail",
}
