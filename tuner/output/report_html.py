"""Render ``ReportData`` into one self-contained HTML page (plotly.js inlined, no network).

Report machines are often air-gapped, so the page carries plotly.js itself (once, in
the head) and every figure is a ``div`` with a stable id (``fig-pareto-quality`` ...)
that tests and readers can find. Nothing here computes: it only draws what
``tuner.output.report`` returned.
"""

from __future__ import annotations

import html
from dataclasses import dataclass

import pandas as pd
import plotly.colors
import plotly.graph_objects as go
from plotly.offline import get_plotlyjs
from plotly.subplots import make_subplots

from tuner.decisions.race import RaceResult
from tuner.machine.bandwidth import SATURATION_SHARE, BandwidthCurve, threads_text
from tuner.machine.roofline import Roofline
from tuner.output.analysis import ReportData, break_even, complete, per_type_frame
from tuner.search.prior import describe_prior
from tuner.storage.records import WarmStartPrior

PLOT_CONFIG = {"displaylogo": False, "responsive": True}
FEASIBLE_COLOR = "#1f77b4"
INFEASIBLE_COLOR = "#b0b0b0"
FRONT_COLOR = "#d62728"

CSS = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1200px; color: #222; }
h1 { margin-bottom: 0.2em; } h2 { margin-top: 2em; border-bottom: 1px solid #ddd; }
table { border-collapse: collapse; margin: 0.5em 0; font-size: 0.9em; }
th, td { border: 1px solid #ddd; padding: 0.25em 0.5em; text-align: left; vertical-align: top; }
th { background: #f4f4f4; }
code { font-size: 0.85em; word-break: break-all; }
.caption { color: #555; max-width: 60em; }
.empty { color: #888; font-style: italic; }
"""


@dataclass(frozen=True)
class Section:
    id: str
    title: str
    caption: str
    body: str  # HTML: a figure div or a table


def _fmt(value, digits: int = 2) -> str:
    if value is None or (isinstance(value, float) and pd.isna(value)) or value is pd.NA:
        return ""
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def _table(frame: pd.DataFrame, columns: dict[str, str], code: tuple[str, ...] = ()) -> str:
    """A plain HTML table; ``columns`` maps frame column -> header, ``code`` columns in <code>."""
    head = "".join(f"<th>{html.escape(h)}</th>" for h in columns.values())
    body = []
    for _, row in frame.iterrows():
        cells = []
        for col in columns:
            text = html.escape(_fmt(row.get(col)))
            cells.append(f"<td><code>{text}</code></td>" if col in code else f"<td>{text}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def _figure_html(fig: go.Figure, div_id: str) -> str:
    fig.update_layout(template="plotly_white", height=fig.layout.height or 420, margin={"t": 40, "b": 50})
    return fig.to_html(full_html=False, include_plotlyjs=False, div_id=div_id, config=PLOT_CONFIG)


def _hover(frame: pd.DataFrame) -> list[str]:
    return [
        f"trial {r.trial}: {r.method}"
        + (f", K={r.draft_max}" if not pd.isna(r.draft_max) else "")
        + f", T={_fmt(r.temperature)}, {r.threads} threads, numa {r.numa}"
        + (f", {r.experts} experts" if not pd.isna(r.experts) else "")
        for r in frame.itertuples()
    ]


def pareto_figure(data: ReportData, x_column: str, front: pd.DataFrame, div_id: str) -> str:
    done = complete(data.trials)
    fig = go.Figure()
    for ok, name, color, symbol in (
        (True, "feasible", FEASIBLE_COLOR, "circle"),
        (False, "below quality floor", INFEASIBLE_COLOR, "x"),
    ):
        part = done[done["feasible"] == ok]
        if not part.empty:
            fig.add_trace(
                go.Scatter(
                    x=part[x_column],
                    y=part["tokens_per_second"],
                    mode="markers",
                    name=name,
                    marker={"color": color, "symbol": symbol, "size": 9},
                    text=_hover(part),
                    hoverinfo="text+x+y",
                )
            )
    if not front.empty:
        fig.add_trace(
            go.Scatter(
                x=front[x_column],
                y=front["tokens_per_second"],
                mode="lines+markers",
                name="Pareto front",
                line={"color": FRONT_COLOR, "shape": "hv"},
                marker={"color": FRONT_COLOR, "size": 11, "symbol": "diamond"},
                text=_hover(front),
                hoverinfo="text+x+y",
            )
        )
    base = done[done["role"] == "baseline"]
    if not base.empty:
        fig.add_trace(
            go.Scatter(
                x=base[x_column],
                y=base["tokens_per_second"],
                mode="markers",
                name="baseline",
                marker={"color": "black", "symbol": "star", "size": 14},
            )
        )
    if x_column == "quality" and data.floor is not None:
        fig.add_vline(x=data.floor, line_dash="dot", annotation_text="quality floor")
    fig.update_layout(xaxis_title=x_column, yaxis_title="decode tokens/s")
    return _figure_html(fig, div_id)


def lines_figure(
    frame: pd.DataFrame,
    group: str,
    x_column: str,
    y_column: str,
    div_id: str,
    x_title: str,
    y_title: str = "best feasible tokens/s",
) -> str:
    fig = _lines(frame, group, x_column, y_column)
    fig.update_layout(xaxis_title=x_title, yaxis_title=y_title, legend_title=group)
    return _figure_html(fig, div_id)


def _lines(frame: pd.DataFrame, group: str, x_column: str, y_column: str) -> go.Figure:
    fig = go.Figure()
    for name, part in frame.groupby(group, sort=True):
        part = part.sort_values(x_column)
        fig.add_trace(go.Scatter(x=part[x_column], y=part[y_column], mode="lines+markers", name=str(name)))
    return fig


def threads_figure(frame: pd.DataFrame, curve: BandwidthCurve | None, div_id: str) -> str:
    """Best tokens/s by threads, one line per NUMA policy, and the copy bandwidth's share of its peak on
    the right axis: decode stops gaining threads about where the bandwidth saturates."""
    fig = _lines(frame, "numa", "threads", "best_tokens_per_second")
    if curve is not None:
        shares = curve.shares()
        fig.add_trace(
            go.Scatter(
                x=list(shares),
                y=list(shares.values()),
                mode="lines+markers",
                name="memory bandwidth (share of peak)",
                yaxis="y2",
                line={"dash": "dot", "color": "gray"},
                text=[f"{curve.points[t] / 1e9:.1f} GB/s" for t in shares],
                hoverinfo="text+x+y",
            )
        )
        fig.add_vline(x=curve.saturation(), line_dash="dot", line_color="gray")
        fig.update_layout(
            yaxis2={
                "title": "memory bandwidth, share of peak",
                "overlaying": "y",
                "side": "right",
                "range": [0, 1.05],
                "tickmode": "linear",
                "tick0": 0,
                "dtick": 0.25,
                "tickformat": ".0%",
                "showgrid": False,
            },
            legend={"x": 1.08},  # clear of the right axis' title
        )
    fig.update_layout(xaxis_title="threads", yaxis_title="best feasible tokens/s", legend_title="numa")
    return _figure_html(fig, div_id)


def threads_caption(curve: BandwidthCurve | None) -> str:
    """What the threads plot shows, and where the machine's memory bandwidth saturates."""
    caption = "Best tokens/s per thread count, one line per NUMA policy."
    if curve is None:
        return caption + " (The study recorded no memory bandwidth by threads to read it against.)"
    return (
        f"{caption} Dotted: the copy bandwidth by threads when the study started, as a share of its peak "
        f"(right axis); memory bandwidth saturates ({SATURATION_SHARE:.0%} of its peak, "
        f"{curve.peak / 1e9:.1f} GB/s) from {threads_text(curve.saturation())} (the vertical line): past it, decode "
        "of a memory-bound model gains little from more threads."
    )


def temperature_figure(frame: pd.DataFrame, div_id: str) -> str:
    fig = make_subplots(rows=1, cols=3, subplot_titles=("tokens/s (best)", "acceptance", "quality"))
    for index, (name, part) in enumerate(frame.groupby("method", sort=True)):
        part = part.sort_values("temperature")
        for col, metric in enumerate(("best_tokens_per_second", "acceptance", "quality"), start=1):
            fig.add_trace(
                go.Scatter(
                    x=part["temperature"],
                    y=part[metric],
                    mode="lines+markers",
                    name=str(name),
                    legendgroup=str(name),
                    showlegend=col == 1,
                    line={"color": _palette(index)},
                ),
                row=1,
                col=col,
            )
    fig.update_xaxes(title_text="temperature")
    return _figure_html(fig, div_id)


def experts_figure(frame: pd.DataFrame, div_id: str) -> str:
    fig = make_subplots(rows=1, cols=2, subplot_titles=("tokens/s", "quality"))
    fig.add_trace(
        go.Scatter(
            x=frame["experts"], y=frame["best_tokens_per_second"], mode="lines+markers", name="best t/s"
        ),
        row=1,
        col=1,
    )
    fig.add_trace(
        go.Scatter(
            x=frame["experts"], y=frame["median_tokens_per_second"], mode="lines+markers", name="median t/s"
        ),
        row=1,
        col=1,
    )
    fig.add_trace(
        go.Scatter(x=frame["experts"], y=frame["quality"], mode="lines+markers", name="mean quality"),
        row=1,
        col=2,
    )
    fig.update_xaxes(title_text="active experts", dtick=1)
    return _figure_html(fig, div_id)


def speedup_figure(data: ReportData, div_id: str) -> str:
    done = complete(data.trials).sort_values("speedup", ascending=False)
    labels = [
        f"#{r.trial} {r.method}" + (f" K={r.draft_max}" if not pd.isna(r.draft_max) else "")
        for r in done.itertuples()
    ]
    colors = [FEASIBLE_COLOR if ok else INFEASIBLE_COLOR for ok in done["feasible"]]
    fig = go.Figure(
        go.Bar(
            x=labels,
            y=done["speedup"],
            marker_color=colors,
            text=_hover(done),
            hoverinfo="text+y",
            name="speedup",
        )
    )
    fig.add_hline(y=1.0, line_dash="dot", annotation_text="baseline")
    fig.update_layout(yaxis_title="tokens/s ÷ baseline", xaxis_title="trial (grey: below quality floor)")
    return _figure_html(fig, div_id)


def drift_figure(data: ReportData, div_id: str) -> str:
    fig = go.Figure()
    for worker, part in data.sentinels.groupby("worker"):
        fig.add_trace(
            go.Scatter(
                x=part["at"],
                y=part["tokens_per_second"],
                mode="lines+markers",
                name=str(worker),
                text=[f"trial {t} ({r})" for t, r in zip(part["trial"], part["role"])],
            )
        )
    fig.update_layout(xaxis_title="time", yaxis_title="baseline configuration tokens/s")
    return _figure_html(fig, div_id)


def race_table(race: RaceResult) -> str:
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
            }
            for e in race.entries
        ]
    )
    notes = [
        f"<p>Verdict: {html.escape(race.verdict)}. Winner: {html.escape(race.figure())}.</p>",
        f"<p>What it may lose: {html.escape(race.loss_line())}.</p>",
    ]
    notes += [f"<p>Outlier: {html.escape(line)}</p>" for line in race.outliers]
    return "".join(notes) + _table(
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
    return _table(
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
    return f"x{estimate:.2f} [{_fmt(low) or '-'}, {_fmt(high) or 'no bound'}]"


def per_type_figure(data: ReportData, div_id: str) -> str:
    """K curves per content type (best feasible recorded tokens/s on the suite), each type's winner
    on its tuning prompts (circle) and its held-out figure (diamond) at its K."""
    fig = go.Figure()
    rows = per_type_frame(data.per_type) if data.per_type is not None else pd.DataFrame()
    for index, (suite, part) in enumerate(data.k_by_suite.groupby("suite", sort=True)):
        color = _palette(index)
        part = part.sort_values("K")
        fig.add_trace(
            go.Scatter(
                x=part["K"],
                y=part["tokens_per_second"],
                mode="lines+markers",
                name=str(suite),
                line={"color": color},
                legendgroup=str(suite),
            )
        )
        own = rows[rows["suite"] == suite] if not rows.empty else rows
        for row in own.itertuples():
            fig.add_trace(
                go.Scatter(
                    x=[row.K],
                    y=[row.tuning_tokens_per_second],
                    mode="markers",
                    legendgroup=str(suite),
                    name=f"{suite} winner, tuning prompts (trial {row.trial})",
                    marker={"color": color, "size": 14, "symbol": "circle-open", "line": {"width": 3}},
                )
            )
            fig.add_trace(
                go.Scatter(
                    x=[row.K],
                    y=[row.held_out_tokens_per_second],
                    mode="markers",
                    legendgroup=str(suite),
                    name=f"{suite} winner, held-out prompts (x{row.gain:.2f} over pooled)",
                    marker={"color": color, "size": 14, "symbol": "diamond"},
                )
            )
    fig.update_layout(
        xaxis_title="K (draft length; 0 = no speculation)", yaxis_title="tokens/s on the content type"
    )
    return _figure_html(fig, div_id)


def per_type_body(data: ReportData) -> str:
    from tuner.decisions.route import describe_accuracy

    parts = [
        per_type_figure(data, "fig-per-type")
        if not data.k_by_suite.empty
        else _empty("no per-suite measurements")
    ]
    if data.per_type is None:
        parts.append(_empty("no per-type race recorded yet: `tuner export STUDY --per-type` runs it"))
    else:
        result = data.per_type
        parts.append(
            f"<p>Pooled winner: trial {result.pooled}. Rule: {html.escape(result.rule)}; "
            f"{result.rounds} rounds of fresh launches on the held-out prompts.</p>"
        )
        parts.append(
            _table(
                per_type_frame(result),
                {
                    "suite": "type",
                    "trial": "winner (tuning)",
                    "method": "draft",
                    "K": "K",
                    "tuning_tokens_per_second": "t/s tuning prompts",
                    "held_out_tokens_per_second": "t/s held-out",
                    "pooled_held_out_tokens_per_second": "pooled winner, held-out",
                    "baseline_held_out_tokens_per_second": "baseline, held-out",
                    "gain": "gain over pooled",
                    "interval": "95% interval",
                    "entry": "served as",
                },
            )
        )
        if result.unsplit:
            parts.append(
                "<p>"
                + html.escape(
                    "; ".join(f"{s}: no per-type figure ({why})" for s, why in result.unsplit.items())
                )
                + "</p>"
            )
    parts.append(
        f"<p>{html.escape(describe_accuracy())} (<code>tuner.decisions.route.content_type</code>, for routing "
        "mixed traffic).</p>"
    )
    return "".join(parts)


def acceptance_model_figure(data: ReportData, div_id: str) -> str:
    fig = go.Figure()
    for index, (option, part) in enumerate(data.acceptance_model.groupby("option")):
        color = _palette(index)
        fig.add_trace(
            go.Scatter(
                x=part["k"], y=part["speedup"], mode="markers", name=f"{option} measured", marker_color=color
            )
        )
        fig.add_trace(
            go.Scatter(
                x=part["k"],
                y=part["model_speedup"],
                mode="lines",
                name=f"{option} model",
                line={"color": color, "dash": "dot"},
            )
        )
    fig.update_layout(xaxis_title="draft length K", yaxis_title="speedup over the target alone")
    return _figure_html(fig, div_id)


def roofline_figure(data: ReportData, div_id: str) -> str:
    done = complete(data.trials).dropna(subset=["roofline_fraction"]).sort_values("trial")
    fig = go.Figure()
    for index, (name, part) in enumerate(done.groupby("method", sort=True)):
        fig.add_trace(
            go.Scatter(
                x=part["trial"],
                y=part["roofline_fraction"],
                mode="markers",
                name=str(name),
                marker={"size": 10, "color": _palette(index)},
                text=_hover(part),
                hoverinfo="text+y",
            )
        )
    fig.add_hline(
        y=1.0,
        line_dash="dash",
        line_color=FRONT_COLOR,
        annotation_text="bandwidth ceiling without speculation",
    )
    fig.update_layout(xaxis_title="trial", yaxis_title="tokens/s ÷ (bandwidth ÷ bytes per token)")
    return _figure_html(fig, div_id)


def importance_figure(frame: pd.DataFrame, div_id: str) -> str:
    fig = go.Figure()
    for objective, part in frame.groupby("objective", sort=False):
        fig.add_trace(go.Bar(y=part["param"], x=part["importance"], orientation="h", name=str(objective)))
    fig.update_layout(barmode="group", xaxis_title="importance (normalized per objective)")
    return _figure_html(fig, div_id)


def _palette(index: int) -> str:
    colors = ("#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22")
    return colors[index % len(colors)]


def _empty(text: str) -> str:
    return f'<p class="empty">{html.escape(text)}</p>'


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
        ("baseline", f"{_fmt(data.baseline_tokens_per_second, 1)} tokens/s (target alone, greedy)"),
    ]


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
            f"x{_fmt(best_row['speedup'])} over the baseline",
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


def _families_section(data: ReportData) -> Section:
    """The draft/lookup/stack table per content type."""
    return Section(
        "families",
        "Draft model, prompt lookup and the stack, per content type",
        "For each content type, the fastest feasible trial of each family on its prompts: a draft model "
        "alone, n-gram lookup alone, and lookup stacked on a draft model (llama.cpp asks the lookup first and "
        "the draft model where lookup has nothing). Sources: accepted/drafted tokens per speculative "
        "implementation on that type's requests, from llama-server's own statistics; lookup share: the "
        "part of the accepted tokens lookup drafted.",
        _table(
            data.families,
            {
                "suite": "content type",
                "family": "family",
                "trial": "trial",
                "method": "method",
                "K": "K",
                "tokens_per_second": "tokens/s",
                "speedup": "x baseline",
                "sources": "accepted/drafted per source",
                "lookup_share": "lookup share",
            },
        )
        if data.families is not None and not data.families.empty
        else _empty("no speculative trial measured per content type"),
    )


FAMILY_COLORS = plotly.colors.qualitative.Plotly  # the aggregate plot's colours, family for family


def latency_figure(frame: pd.DataFrame, div_id: str) -> str:
    """Time to first token and time per output token against users, per family: p50 solid, p95 dashed."""
    fig = make_subplots(
        rows=1, cols=2, subplot_titles=("time to first token (ms)", "time per output token (ms)")
    )
    for index, (family, part) in enumerate(frame.groupby("family", sort=True)):
        part = part.sort_values("users")
        for col, kind in ((1, "ttft"), (2, "tpot")):
            for quantile, dash in (("p50", "solid"), ("p95", "dash")):
                fig.add_trace(
                    go.Scatter(
                        x=part["users"],
                        y=part[f"{quantile}_{kind}_ms"],
                        mode="lines+markers",
                        name=f"{family} {quantile}",
                        legendgroup=str(family),
                        showlegend=col == 1,
                        line={"color": FAMILY_COLORS[index % len(FAMILY_COLORS)], "dash": dash},
                    ),
                    row=1,
                    col=col,
                )
    fig.update_xaxes(title_text="simultaneous users", dtick=1)
    return _figure_html(fig, div_id)


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


def load_sections(data: ReportData) -> list[Section]:
    """Several users at once: aggregate tokens/s per family against users, then the same trials' latency."""
    concurrency = data.concurrency
    curves = (
        None if concurrency is None or concurrency.empty else concurrency.sort_values(["users", "family"])
    )
    measured = curves is not None
    one_user = _empty("one user at a time (workload.concurrency: [1])")
    return [
        Section(
            "concurrency",
            "Aggregate tokens/s against simultaneous users, and where speculation stops paying",
            "Per family (none, draft model, lookup, stack), the best feasible trial's aggregate tokens/s at each "
            "concurrency level (all users' tokens over the level's wall time; one launch each, the best "
            "recorded)"
            + ("; the break-even from the load classes' races (tuner export)" if data.load_races else "")
            + ". "
            + (break_even(data.concurrency, data.launch_spread, data.load_races) + "." if measured else ""),
            lines_figure(
                data.concurrency,
                "family",
                "users",
                "aggregate_tokens_per_second",
                "fig-concurrency",
                "simultaneous users",
            )
            if measured
            else one_user,
        ),
        Section(
            "latency",
            "Time to first token and time per output token, per level",
            "The same trials as the aggregate plot (each family's best at each level): the median (p50, solid) "
            "and 95th percentile (p95, dashed) over the level's requests of the time to the first token "
            "(queueing and prompt processing, from the request's start) and of the time per output token "
            "after it (llama-server's own timings), in milliseconds.",
            latency_figure(curves, "fig-latency") + _table(curves, LATENCY_TABLE) if measured else one_user,
        ),
    ]


def _fronts_sections(data: ReportData) -> list[Section]:
    done = complete(data.trials)
    none = _empty("no complete trial")
    return [
        Section(
            "pareto-quality",
            "Pareto front: tokens/s against quality",
            "Every complete trial; the red staircase joins the feasible trials nothing beats on both axes.",
            pareto_figure(data, "quality", data.front_quality, "fig-pareto-quality")
            if not done.empty
            else none,
        ),
        Section(
            "pareto-acceptance",
            "Pareto front: tokens/s against draft acceptance",
            "Acceptance is accepted / drafted tokens; non-speculative trials sit at 0.",
            pareto_figure(data, "acceptance", data.front_acceptance, "fig-pareto-acceptance")
            if not done.empty
            else none,
        ),
    ]


def _speculation_sections(data: ReportData) -> list[Section]:
    """K per draft and per content type, the per-type winners, the families per content type."""
    return [
        Section(
            "k-method",
            "Tokens/s against K, per draft",
            "Best feasible tokens/s at each draft length K per drafting method (K = 0: no speculation).",
            lines_figure(
                data.k_by_method, "method", "K", "tokens_per_second", "fig-k-method", "K (draft length)"
            )
            if not data.k_by_method.empty
            else _empty("no feasible trial"),
        ),
        Section(
            "k-suite",
            "Tokens/s against K, per content type",
            "Best feasible tokens/s on each prompt suite at each K: the best K differs by content.",
            lines_figure(
                data.k_by_suite, "suite", "K", "tokens_per_second", "fig-k-suite", "K (draft length)"
            )
            if not data.k_by_suite.empty
            else _empty("no per-suite measurements"),
        ),
        Section(
            "per-type",
            "Per content type: winners on tuning prompts, checked on held-out prompts",
            "K curves per type (best feasible recorded tokens/s on each suite). Each type's winner is picked on "
            "its tuning prompts (circle) and re-measured on its held-out prompts against the pooled winner "
            "(diamond); a type is served as its own router model (STUDY-TYPE) only when that gain is above "
            "the noise.",
            per_type_body(data),
        ),
        _families_section(data),
    ]


def _knob_sections(data: ReportData) -> list[Section]:
    """Temperature, experts, threads and NUMA."""
    return [
        Section(
            "temperature",
            "Temperature effect",
            "Sampling above 0 lowers acceptance (the draft guesses the target's sample) and changes outputs.",
            temperature_figure(data.temperature, "fig-temperature")
            if data.temperature["temperature"].nunique() > 1
            else _empty("the study tried a single temperature"),
        ),
        Section(
            "experts",
            "Active experts against speed and quality",
            "MoE only: fewer active experts read fewer weights per token, at some cost in quality.",
            experts_figure(data.experts, "fig-experts")
            if not data.experts.empty
            else _empty("dense target: no expert knob"),
        ),
        Section(
            "threads-numa",
            "Threads and NUMA policy",
            threads_caption(data.bandwidth_curve),
            threads_figure(data.threads_numa, data.bandwidth_curve, "fig-threads-numa")
            if not data.threads_numa.empty or data.bandwidth_curve is not None
            else _empty("no complete trial"),
        ),
    ]


def _decision_sections(data: ReportData) -> list[Section]:
    """The race, the drift of the baseline, the fitted model, the speedup of every trial."""
    done = complete(data.trials)
    return [
        Section(
            "race",
            "Finalist race",
            "The winner, decided on fresh launches only: the first race.min_rounds rounds launch every finalist "
            "and the baseline once; later rounds the leader and the finalists whose comparison with it is open. "
            "Geometric mean over launches; speedup over the baseline on paired rounds with a 95% interval "
            "simultaneous over the finalists; the verdict says what the deployment may lose (its loss bound).",
            race_table(data.race)
            if data.race is not None
            else _empty("no race recorded (tuner run --no-race, or nothing to race)"),
        ),
        Section(
            "verifications",
            "Verifications of the deployed section",
            "Each `tuner verify`: the deployed preset section and the baseline launched in paired rounds on the "
            "study's held-out prompts, on that host and llama.cpp build; its speedup with a 95% interval beside "
            "the one the export claimed. Holds: shown faster, the interval reaching the claim's; smaller than claimed: "
            "shown faster, the whole interval below the claim's; no longer shown faster: the interval does not lie "
            "above 1.",
            verification_table(data.verifications)
            if data.verifications
            else _empty("no verification recorded (tuner verify STUDY)"),
        ),
        Section(
            "drift",
            "Drift: the baseline configuration over time",
            "The baseline and its sentinel re-measures (every few trials). Speedups divide by this line "
            "interpolated at each trial's time; trials measured while it moved more than the noise are flagged.",
            drift_figure(data, "fig-drift") if len(data.sentinels) else _empty("no baseline measured"),
        ),
        Section(
            "acceptance-model",
            "Fitted speculation model",
            "The sampler's fit of Leviathan et al.'s model (acceptance and draft/target cost ratio) per draft, "
            "against the measured points; it predicts the best K before it is measured.",
            acceptance_model_figure(data, "fig-acceptance-model")
            if not data.acceptance_model.empty
            else _empty("no fitted model (another sampler, or too few speculative trials)"),
        ),
        Section(
            "speedup",
            "Speedup over the baseline",
            "Each complete trial's tokens/s divided by the baseline configuration's rate interpolated between "
            "the sentinels around it (same worker).",
            speedup_figure(data, "fig-speedup") if not done.empty else _empty("no complete trial"),
        ),
    ]


def _ceiling_sections(data: ReportData) -> list[Section]:
    """The roofline share and the parameter importances."""
    done = complete(data.trials)
    return [
        Section(
            "roofline",
            "Tokens/s as a fraction of the memory-bandwidth ceiling",
            "1.0 = the study's copy bandwidth (numpy copy, one thread per core, read + write counted) ÷ bytes of "
            "weights read per token: an estimate of the ceiling of decode without speculation, not a bound. "
            "Above 1 is speculation paying off, or a model small enough to be served from the CPU's cache; "
            "far below 1 means compute, threads or NUMA leave bandwidth unused.",
            roofline_figure(data, "fig-roofline")
            if data.roofline is not None and not done.empty
            else _empty("the study does not record the target's weight bytes"),
        ),
        Section(
            "importance",
            "Parameter importances",
            "How much each knob explains each objective among complete trials (Optuna's default evaluator).",
            importance_figure(data.importances, "fig-importance")
            if not data.importances.empty
            else _empty("too few complete trials, or no knob varied"),
        ),
    ]


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


def _table_sections(data: ReportData) -> list[Section]:
    """The Pareto-optimal trials with their commands, the best per content type, the failures."""
    return [
        Section(
            "pareto-table",
            "Pareto-optimal trials",
            "Feasible trials no other feasible trial beats on every objective, with the exact command "
            "(add --host/--port).",
            _table(data.pareto, PARETO_TABLE, code=("command",))
            if not data.pareto.empty
            else _empty("no feasible trial"),
        ),
        Section(
            "per-suite",
            "Best configuration per content type",
            "From each feasible trial's per-suite tokens/s.",
            _table(data.best_per_suite, SUITE_TABLE)
            if not data.best_per_suite.empty
            else _empty("no per-suite measurements"),
        ),
        Section(
            "failures",
            "Failed trials",
            "Why they failed (see the storage's log_tail for evidence).",
            _table(data.failures, FAILURE_TABLE) if not data.failures.empty else _empty("none"),
        ),
    ]


# The page's sections, in order: each builder returns its sections. A new section goes in a builder of its
# own, listed where it belongs (a per-turn section of chat suites: right after ``load_sections``).
def _turn_sections(data: ReportData) -> list[Section]:
    """Conversations turn by turn (only for a study with chat suites)."""
    if data.turns is None or data.turns.empty:
        return []
    return [
        Section(
            "turns",
            "Conversations, turn by turn",
            "For the fastest feasible draft-model, lookup and stacked trial, the decode rate on each turn of the "
            "chat suites' conversations against the baseline's on the same turn (median over repetitions of the "
            "turn's pooled rate; one launch each, so a ratio within the launch spread is not shown by it). A "
            "later turn carries the earlier turns and replies: prompt lookup has more to copy there. Prompt ms: "
            "llama.cpp's prompt processing per request (median), the server's part of time to first token; "
            "cached: prompt tokens the server took from its prompt cache (median).",
            lines_figure(
                data.turns, "family", "turn", "speedup", "fig-turns", "turn of the conversation", "x baseline"
            )
            + _table(
                data.turns,
                {
                    "family": "family",
                    "trial": "trial",
                    "method": "method",
                    "turn": "turn",
                    "tokens_per_second": "tokens/s",
                    "baseline_tokens_per_second": "baseline tokens/s",
                    "speedup": "x baseline",
                    "acceptance": "acceptance",
                    "prompt_ms": "prompt ms",
                    "cached_tokens": "cached",
                },
            ),
        )
    ]


SECTION_BUILDERS = (
    _fronts_sections,
    _speculation_sections,
    _turn_sections,
    load_sections,
    _knob_sections,
    _decision_sections,
    _ceiling_sections,
    _table_sections,
)


def sections(data: ReportData) -> list[Section]:
    return [section for build in SECTION_BUILDERS for section in build(data)]


def render(data: ReportData) -> str:
    secs = sections(data)
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>tuner report: {html.escape(data.study_name)}</title>",
        f"<style>{CSS}</style>",
        f'<script type="text/javascript">{get_plotlyjs()}</script>',
        "</head><body>",
        f"<h1>Study {html.escape(data.study_name)}</h1>",
        summary_table(data),
        "<nav><ul>"
        + "".join(f'<li><a href="#{s.id}">{html.escape(s.title)}</a></li>' for s in secs)
        + "</ul></nav>",
    ]
    for section in secs:
        parts.append(
            f'<section id="{section.id}"><h2>{html.escape(section.title)}</h2>'
            f'<p class="caption">{html.escape(section.caption)}</p>{section.body}</section>'
        )
    parts.append("</body></html>")
    return "\n".join(parts)
