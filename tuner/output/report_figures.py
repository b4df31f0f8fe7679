"""The report's plotly figures, each an HTML ``div`` with a stable id and no plotly.js of its own.

The page (``tuner.output.report_html``) carries plotly.js once; each figure here only draws what
``tuner.output.analysis`` returned, and the threads figure's caption says where the bandwidth saturates.
"""

from __future__ import annotations

import pandas as pd
import plotly.colors
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from tuner.machine.bandwidth import SATURATION_SHARE, BandwidthCurve, threads_text
from tuner.output.analysis import ReportData, complete, per_type_frame
from tuner.output.report_markup import cell_text

PLOT_CONFIG = {"displaylogo": False, "responsive": True}
FEASIBLE_COLOR = "#1f77b4"
INFEASIBLE_COLOR = "#b0b0b0"
FRONT_COLOR = "#d62728"


def _figure_html(fig: go.Figure, div_id: str) -> str:
    fig.update_layout(template="plotly_white", height=fig.layout.height or 420, margin={"t": 40, "b": 50})
    return fig.to_html(full_html=False, include_plotlyjs=False, div_id=div_id, config=PLOT_CONFIG)


def _hover(frame: pd.DataFrame) -> list[str]:
    return [
        f"trial {r.trial}: {r.method}"
        + (f", K={r.draft_max}" if not pd.isna(r.draft_max) else "")
        + f", T={cell_text(r.temperature)}, {r.threads} threads, numa {r.numa}"
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


def variants_figure(frame: pd.DataFrame, div_id: str) -> str:
    """Speed against KL divergence from the source, a point per variant and speculation family (colour);
    hollow: over the study's quality bounds, never deployed."""
    fig = go.Figure()
    for index, (family, group) in enumerate(frame.groupby("family", sort=False)):
        fig.add_trace(
            go.Scatter(
                x=group["mean_kld"],
                y=group["best_tokens_per_second"],
                mode="markers+text",
                text=group["target_quant"],
                textposition="top center",
                name=str(family),
                marker={
                    "color": _palette(index),
                    "size": 11,
                    "symbol": ["circle" if ok else "circle-open" for ok in group["feasible"]],
                },
            )
        )
    fig.update_xaxes(title_text="mean KL divergence from the source (nats)")
    fig.update_yaxes(title_text="best tokens/s")
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
