"""The report's page: its sections in order (title, caption, a figure or table) and ``render``, which
writes them into one self-contained HTML page (plotly.js inlined, no network).

Report machines are often air-gapped, so the page carries plotly.js itself (once, in
the head) and every figure is a ``div`` with a stable id (``fig-pareto-quality`` ...)
that tests and readers can find. Nothing here computes: it only lays out what
``tuner.output.analysis`` returned, drawn by ``report_figures`` and ``report_tables``.
"""

from __future__ import annotations

import html
from dataclasses import dataclass

from plotly.offline import get_plotlyjs

from tuner.output.analysis import ReportData, break_even, complete, per_type_frame
from tuner.output.report_figures import (
    acceptance_model_figure,
    drift_figure,
    experts_figure,
    importance_figure,
    latency_figure,
    lines_figure,
    pareto_figure,
    per_type_figure,
    roofline_figure,
    speedup_figure,
    temperature_figure,
    threads_caption,
    threads_figure,
    variants_figure,
)
from tuner.output.report_markup import empty_note, html_table
from tuner.output.report_tables import (
    FAILURE_TABLE,
    LATENCY_TABLE,
    PARETO_TABLE,
    SUITE_TABLE,
    race_table,
    summary_table,
    verification_table,
)

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


def per_type_body(data: ReportData) -> str:
    from tuner.decisions.route import describe_accuracy

    parts = [
        per_type_figure(data, "fig-per-type")
        if not data.k_by_suite.empty
        else empty_note("no per-suite measurements")
    ]
    if data.per_type is None:
        parts.append(empty_note("no per-type race recorded yet: `tuner export STUDY --per-type` runs it"))
    else:
        result = data.per_type
        parts.append(
            f"<p>Pooled winner: trial {result.pooled}. Rule: {html.escape(result.rule)}; "
            f"{result.rounds} rounds of fresh launches on the held-out prompts.</p>"
        )
        parts.append(
            html_table(
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
        html_table(
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
        else empty_note("no speculative trial measured per content type"),
    )


def load_sections(data: ReportData) -> list[Section]:
    """Several users at once: aggregate tokens/s per family against users, then the same trials' latency."""
    concurrency = data.concurrency
    curves = (
        None if concurrency is None or concurrency.empty else concurrency.sort_values(["users", "family"])
    )
    measured = curves is not None
    one_user = empty_note("one user at a time (workload.concurrency: [1])")
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
            latency_figure(curves, "fig-latency") + html_table(curves, LATENCY_TABLE)
            if measured
            else one_user,
        ),
    ]


def _fronts_sections(data: ReportData) -> list[Section]:
    done = complete(data.trials)
    none = empty_note("no complete trial")
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
            else empty_note("no feasible trial"),
        ),
        Section(
            "k-suite",
            "Tokens/s against K, per content type",
            "Best feasible tokens/s on each prompt suite at each K: the best K differs by content.",
            lines_figure(
                data.k_by_suite, "suite", "K", "tokens_per_second", "fig-k-suite", "K (draft length)"
            )
            if not data.k_by_suite.empty
            else empty_note("no per-suite measurements"),
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
            else empty_note("the study tried a single temperature"),
        ),
        Section(
            "experts",
            "Active experts against speed and quality",
            "MoE only: fewer active experts read fewer weights per token, at some cost in quality.",
            experts_figure(data.experts, "fig-experts")
            if not data.experts.empty
            else empty_note("dense target: no expert knob"),
        ),
        *(
            [
                Section(
                    "variants",
                    "The target's quantization: speed against KL divergence",
                    "Each variant of the target (target.quantize) at its fastest per speculation family (colour), "
                    "against its mean KL divergence from the source's logits on quality.text_file. Hollow: over "
                    "the quality bounds (quality.max_kld, the floor on the same top token), never deployed. "
                    "Speculation on a variant is lossless with respect to that variant: what it adds is the "
                    "height above the variant's own target-alone point.",
                    variants_figure(data.variants, "fig-variants")
                    + html_table(
                        data.variants,
                        {
                            "target_quant": "variant",
                            "family": "speculation",
                            "best_tokens_per_second": "best tokens/s",
                            "speedup": "speedup (sentinels)",
                            "mean_kld": "mean KLD from the source",
                            "same_top": "same top token",
                            "feasible": "within the bounds",
                        },
                    ),
                )
            ]
            if not data.variants.empty
            else []
        ),
        Section(
            "threads-numa",
            "Threads and NUMA policy",
            threads_caption(data.bandwidth_curve),
            threads_figure(data.threads_numa, data.bandwidth_curve, "fig-threads-numa")
            if not data.threads_numa.empty or data.bandwidth_curve is not None
            else empty_note("no complete trial"),
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
            else empty_note("no race recorded (tuner run --no-race, or nothing to race)"),
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
            else empty_note("no verification recorded (tuner verify STUDY)"),
        ),
        Section(
            "drift",
            "Drift: the baseline configuration over time",
            "The baseline and its sentinel re-measures (every few trials). Speedups divide by this line "
            "interpolated at each trial's time; trials measured while it moved more than the noise are flagged.",
            drift_figure(data, "fig-drift") if len(data.sentinels) else empty_note("no baseline measured"),
        ),
        Section(
            "acceptance-model",
            "Fitted speculation model",
            "The sampler's fit of Leviathan et al.'s model (acceptance and draft/target cost ratio) per draft, "
            "against the measured points; it predicts the best K before it is measured.",
            (
                acceptance_model_figure(data, "fig-acceptance-model")
                if not data.acceptance_model.empty
                else empty_note("no fitted model (another sampler, or too few speculative trials)")
            )
            + "".join(f"<p>{html.escape(why)}</p>" for why in data.unprobed),
        ),
        Section(
            "speedup",
            "Speedup over the baseline",
            "Each complete trial's tokens/s divided by the baseline configuration's rate interpolated between "
            "the sentinels around it (same worker).",
            speedup_figure(data, "fig-speedup") if not done.empty else empty_note("no complete trial"),
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
            else empty_note("the study does not record the target's weight bytes"),
        ),
        Section(
            "importance",
            "Parameter importances",
            "How much each knob explains each objective among complete trials (Optuna's default evaluator).",
            importance_figure(data.importances, "fig-importance")
            if not data.importances.empty
            else empty_note("too few complete trials, or no knob varied"),
        ),
    ]


def _table_sections(data: ReportData) -> list[Section]:
    """The Pareto-optimal trials with their commands, the best per content type, the failures."""
    return [
        Section(
            "pareto-table",
            "Pareto-optimal trials",
            "Feasible trials no other feasible trial beats on every objective, with the exact command "
            "(add --host/--port).",
            html_table(data.pareto, PARETO_TABLE, code=("command",))
            if not data.pareto.empty
            else empty_note("no feasible trial"),
        ),
        Section(
            "per-suite",
            "Best configuration per content type",
            "From each feasible trial's per-suite tokens/s.",
            html_table(data.best_per_suite, SUITE_TABLE)
            if not data.best_per_suite.empty
            else empty_note("no per-suite measurements"),
        ),
        Section(
            "failures",
            "Failed trials",
            "Why they failed (see the storage's log_tail for evidence).",
            html_table(data.failures, FAILURE_TABLE) if not data.failures.empty else empty_note("none"),
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
            + html_table(
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
