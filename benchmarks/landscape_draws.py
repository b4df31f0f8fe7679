"""Operator-scale landscapes drawn at random from the research's ranges: hosts nobody developed a rule on.

Why: the twelve named landscapes (``benchmarks/operator_landscapes``) are the hosts the search's rules were
developed on, so meeting a bar there says little about the next host. A draw is a landscape of the same model
types (``benchmarks/landscape_model``), so every replay runs it unchanged, with its figures drawn from the ranges
below, seeded: ``draw(seed)`` is the same landscape on every machine. Development draws (``DEVELOPMENT_SEEDS``)
may be inspected while a rule is written; a rule is judged on held-out draws (``HELD_OUT_SEEDS``) that nobody
inspects (docs/decisions.md says which draws each rule was developed on).

The ranges, and where the research notes (docs/decisions.md, "The research's figures") or the named landscapes
put them:

- host: 16-128 physical cores, at least 8 per node, SMT (twice the logical CPUs), every thread count from 1 to
  the logical CPUs (``CORES``; the EPYC 9655's 96 cores; 16- and 64-core hosts in docs/decisions.md, "Thread
  ties");
- threads: decode peaks at 25-95% of the cores (``PEAK_SHARE``; llama.cpp #6434: a 96-core EPYC tops out near
  60), with a saturation constant of a fifth to two fifths of the peak's threads (``TAU_SHARE``), and falls 0-30%
  from the peak to all cores (``FALL``); SMT siblings lose 40-70% per host's worth (``SMT_PENALTY``; -t 192 at
  0.43 of -t 96);
- NUMA: 1-4 nodes (``NODES``; NPS4 on the EPYC, 2 on a 2-socket host); with one node every policy is "none"
  (``tuner.measurement.launch.meaningful_numa_policies``), with more the four policies in random order, each
  0-15% below the one before it (``NUMA_STEP``; interleave 1.0, distribute 0.93, none 0.77 on the EPYC), bind's
  nodes within 3% of each other (``BIND_NODE``); bind's thread curve is the host's on one node
  (``Hardware.node_scaled``): it peaks at the peak's share of a node's cores;
- drafts: 1-4 (``DRAFTS``), of sizes 0.5B-7B, a draft step costing 3-40% of the target's (``DRAFT_SIZES``; the
  0.5B Q8_0 0.046, the 1.5B Q4_K_M 0.13 against the 32B), its weight bytes that share of the target's, its cost
  growing with threads by 0-90% per host's worth (``COUPLING``); per-token acceptance per content type
  (``ACCEPT``: code 0.93-0.99, prose 0.62-0.86, summaries 0.68-0.92: the research's 0.985 and 0.74 for the 0.5B
  on code and prose) decaying 0.1-0.5% per position along a draft (``DECAY``), so code's best K is long and
  prose's short. With two drafts or more, one or two pairs are twins: the same size in a smaller quantization,
  10-30% cheaper (``TWIN_CHEAPER``), whose best rate on one content type is 0-8% from its sibling's, either way
  (``TWIN_GAP``; ``operator_landscapes.TWIN_DRAFTS``: two 0.5B builds within 2%), set by solving its acceptance
  there at the peak's threads;
- temperature: acceptance changes by -0.10 to +0.16 per unit temperature, drawn per content type (so it may help
  one type and hurt another), each draft's at 0.5-1.5 times its type's (``TEMP_SLOPE``, ``DRAFT_SLOPE``;
  Coder-32B falls 0.06, Qwen2.5-VL-7B rises 28.3 -> 57.1 t/s at 0.7); quality falls 0.03-0.06 per unit
  (``QUALITY_TEMP``) against a 0.97 floor; temperatures 0, 0.3, 0.5 and 0.7;
- prompt lookup: in half the draws (``LOOKUP_SHARE``) one to three n-gram types, alone, paying on some content
  types: each type copies 40-98% of its answer in spans of 8-80 tokens (summaries copy nearly all: lookup x12.7)
  or 0-8% in spans of 4-8 (chat), with even odds (``GROUNDED``, ``UNGROUNDED``), at least one type paying;
- workload: nine prompts over one to three content types of code, prose and summaries;
- noise: a launch spreads 2-5% (``NOISE``; 3% on ``threads-40-twins``), a request 3% (the model's default).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from benchmarks.landscape_model import Draft, Grounding, Hardware
from benchmarks.landscape_simulation import OperatorLandscape
from benchmarks.operator_landscapes import LOOKUPS, SpaceOptions, operator_space
from tuner.knobs.config import TrialConfig

DEVELOPMENT_SEEDS = range(0, 100)  # may be inspected while a rule is developed
HELD_OUT_SEEDS = range(10000, 10100)  # judge rules here only; never inspected while developing one

CORES = (16, 24, 32, 48, 64, 96, 128)
NODES = (1, 4)
NODE_CORES = 8  # a node has at least 8 cores (and the cores divide among the nodes)
PEAK_SHARE = (0.25, 0.95)
TAU_SHARE = (0.2, 0.4)
FALL = (0.0, 0.30)
SMT_PENALTY = (0.4, 0.7)
NUMA_STEP = (0.0, 0.15)
BIND_NODE = (0.97, 1.0)
DRAFTS = (1, 4)
DRAFT_SIZES = {"0.5b": (0.03, 0.07), "1.5b": (0.07, 0.15), "3b": (0.12, 0.25), "7b": (0.25, 0.40)}
QUANTS = ("q8_0", "q4_k_m", "q4_0", "q2_k")
COUPLING = (0.0, 0.9)
ACCEPT = {"code": (0.93, 0.99), "prose": (0.62, 0.86), "summarize": (0.68, 0.92)}
DECAY = (0.995, 0.999)
TWIN_CHEAPER = (0.10, 0.30)
TWIN_GAP = (0.0, 0.08)
TEMP_SLOPE = (-0.10, 0.16)
DRAFT_SLOPE = (0.5, 1.5)
QUALITY_TEMP = (0.03, 0.06)
QUALITY_FLOOR = 0.97
LOOKUP_SHARE = 0.5
GROUNDED = {"copy": (0.4, 0.98), "span": (8.0, 80.0)}
UNGROUNDED = {"copy": (0.0, 0.08), "span": (4.0, 8.0)}
CONTENT_TYPES = ("code", "prose", "summarize")
PROMPT_TOKENS = {"code": 200, "prose": 60, "summarize": 800}  # as dense-stack's
NOISE = (0.02, 0.05)
PROMPTS = 9
TARGET, TARGET_BYTES, TARGET_RATE = "Qwen2.5-Coder-32B-Instruct Q4_K_M", 19e9, 3.77
K_RANGE = np.arange(1, 49, dtype=float)  # the space's K: 1..48


def _u(rng: np.random.Generator, bounds: tuple[float, float]) -> float:
    return float(rng.uniform(*bounds))


def draw_hardware(rng: np.random.Generator) -> Hardware:
    """A host: cores and nodes, where decode peaks and how far it falls past the peak, its NUMA policies."""
    nodes = int(rng.integers(NODES[0], NODES[1] + 1))
    cores = int(rng.choice([c for c in CORES if c % (nodes * NODE_CORES) == 0]))
    peak = max(2, round(_u(rng, PEAK_SHARE) * cores))
    fall = _u(rng, FALL)
    if nodes == 1:
        numa = {"none": 1.0}
    else:
        order = [str(p) for p in rng.permutation(["none", "interleave", "bind", "distribute"])]
        factors = np.cumprod([1.0, *(1 - rng.uniform(*NUMA_STEP, size=3))])
        numa = {p: round(float(f), 4) for p, f in zip(order, factors)}
    return Hardware(
        numa=numa,
        tau=peak * _u(rng, TAU_SHARE),
        contention_from=peak,
        contention=fall * cores / (cores - peak) if peak < cores else 0.0,
        smt_penalty=_u(rng, SMT_PENALTY),
        draft_thread_coupling=_u(rng, COUPLING),
        bind_node={n: round(_u(rng, BIND_NODE), 4) for n in range(nodes)},
        cores=cores,
        logical=2 * cores,
        nodes=tuple(range(nodes)),
        node_scaled=True,
    )


def draw_draft(rng: np.random.Generator, slopes: dict[str, float], size: str) -> Draft:
    """A draft of ``size``: its cost, acceptance per content type, and the content types' temperature slopes
    at half to one and a half their size (the sign is the target's sampling, the size the draft's)."""
    return Draft(
        cost=_u(rng, DRAFT_SIZES[size]),
        accept={c: round(_u(rng, ACCEPT[c]), 4) for c in slopes},
        temp_slope={c: round(slope * _u(rng, DRAFT_SLOPE), 4) for c, slope in slopes.items()},
        load_s=0.5,
    )


def best_k_rate(land: OperatorLandscape, draft: Draft, content: str) -> float:
    """A draft's best rate factor over the target alone on one content type, at the peak's threads, greedy."""
    threads = land.hardware.contention_from
    rounds = land.speed.draft_rounds(draft, content, K_RANGE, 0.0, threads, 1.0)
    return float(np.max(rounds.tokens / rounds.time))


def twin_of(land: OperatorLandscape, draft: Draft, content: str, gap: float, cheaper: float) -> Draft:
    """``draft`` in another quantization: ``cheaper`` less cost, its best rate on ``content`` ``gap`` from
    the sibling's (signed), its acceptance elsewhere a little lower; solved by bisection on the acceptance."""
    want = best_k_rate(land, draft, content) * (1 + gap)
    low, high = 0.3, 0.999
    for _ in range(40):
        mid = (low + high) / 2
        trial = replace(draft, cost=draft.cost * (1 - cheaper), accept={**draft.accept, content: mid})
        low, high = (mid, high) if best_k_rate(land, trial, content) < want else (low, mid)
    others = {c: round(a - 0.01 * cheaper, 4) for c, a in draft.accept.items() if c != content}
    return replace(draft, cost=draft.cost * (1 - cheaper), accept={**others, content: round(low, 4)})


def draw_drafts(
    rng: np.random.Generator, land: OperatorLandscape, types: tuple[str, ...]
) -> tuple[dict[str, Draft], list[tuple[str, str, str, float]]]:
    """(drafts by name, twin pairs as (draft, twin, content type, drawn gap)): 1-4 drafts, one or two of the
    pairs twins of one size."""
    count = int(rng.integers(DRAFTS[0], DRAFTS[1] + 1))
    pairs = int(rng.integers(1, count // 2 + 1)) if count >= 2 else 0
    sizes = [str(s) for s in rng.choice(list(DRAFT_SIZES), size=count - pairs, replace=False)]
    slopes = {c: _u(rng, TEMP_SLOPE) for c in types}
    drafts: dict[str, Draft] = {}
    twins: list[tuple[str, str, str, float]] = []
    for index, size in enumerate(sizes):
        quants = [QUANTS[int(q)] for q in sorted(rng.choice(len(QUANTS), size=2, replace=False))]
        name = f"draft-{size}-{quants[0]}"
        drafts[name] = draw_draft(rng, slopes, size)
        if index < pairs:
            content = str(rng.choice(types))
            gap = _u(rng, TWIN_GAP) * float(rng.choice([-1.0, 1.0]))
            twin = f"draft-{size}-{quants[1]}"
            drafts[twin] = twin_of(land, drafts[name], content, gap, _u(rng, TWIN_CHEAPER))
            twins.append((name, twin, content, gap))
    return drafts, twins


def draw_grounding(rng: np.random.Generator, types: tuple[str, ...]) -> dict[str, Grounding]:
    """How each content type copies its prompt: grounded or not with even odds, at least one grounded."""
    grounded = [bool(rng.random() < 0.5) for _ in types]
    if not any(grounded):
        grounded[int(rng.integers(len(types)))] = True
    out = {}
    for content, paid in zip(types, grounded):
        ranges = GROUNDED if paid else UNGROUNDED
        out[content] = Grounding(
            copy=round(_u(rng, ranges["copy"]), 3),
            span=round(_u(rng, ranges["span"]), 1),
            chance=round(_u(rng, (0.4, 0.6)), 3),
            repeated=round(_u(rng, (0.3, 0.5)), 3),
        )
    return out


def draw(seed: int) -> OperatorLandscape:
    """The landscape of ``seed``: the same on every machine (numpy's PCG64 from the seed alone)."""
    rng = np.random.default_rng(seed)
    hardware = draw_hardware(rng)
    types = tuple(
        sorted(str(t) for t in rng.choice(CONTENT_TYPES, size=int(rng.integers(1, 4)), replace=False))
    )
    prompts = tuple(types[i % len(types)] for i in range(PROMPTS))
    land = OperatorLandscape(
        name=f"draw-{seed}",
        description="",
        space=operator_space(("none",), ()),  # replaced below, once the drafts are drawn
        prompts=prompts,
        base_rate={c: TARGET_RATE for c in types},
        prompt_tokens={c: PROMPT_TOKENS[c] for c in types},
        drafts={},
        hardware=hardware,
        verify_cost=round(_u(rng, (0.008, 0.02)), 4),
        decay=round(_u(rng, DECAY), 5),
        quality_temp=round(_u(rng, QUALITY_TEMP), 4),
        quality_floor=QUALITY_FLOOR,
        cv_launch=round(_u(rng, NOISE), 4),
        host=f"drawn host {seed}",
        target=TARGET,
        probed=True,
    )
    drafts, twins = draw_drafts(rng, land, types)
    lookups = {}
    if rng.random() < LOOKUP_SHARE:
        chosen = rng.choice(list(LOOKUPS), size=int(rng.integers(1, len(LOOKUPS) + 1)), replace=False)
        lookups = {str(k): LOOKUPS[str(k)] for k in sorted(chosen)}
    grounding = draw_grounding(rng, types) if lookups else {}
    spec_types = ("none", "draft-simple", *lookups)
    weights = {TARGET: TARGET_BYTES, **{name: d.cost * TARGET_BYTES for name, d in drafts.items()}}
    return replace(
        land,
        description=_describe(hardware, drafts, twins, lookups),
        space=operator_space(spec_types, tuple(drafts), SpaceOptions(hardware=hardware)),
        drafts=drafts,
        lookups=lookups,
        grounding=grounding,
        weights_bytes=weights,
    )


def _describe(hardware: Hardware, drafts: dict[str, Draft], twins: list, lookups: dict) -> str:
    """One line: the host's shape, the drafts and twins, the lookups."""
    twin_text = "; ".join(f"{a} / {b} {gap:+.1%} on {c}" for a, b, c, gap in twins) or "no twins"
    return (
        f"{hardware.cores} cores, {len(hardware.nodes)} node(s), decode peaks at {hardware.contention_from} "
        f"threads; {len(drafts)} draft(s) ({twin_text}); lookups: {', '.join(lookups) or 'none'}"
    )


def draw_table(land: OperatorLandscape) -> str:
    """A draw as markdown: the host, the thread curve, NUMA, each draft per content type (acceptance, slope,
    best K and its rate over the target alone), lookups and grounding, noise, and the optimum."""
    hw = land.hardware
    rate, best = land.optimum
    policy = _whole_host_policy(hw)
    fall = 1 - land.hardware_factor(TrialConfig(numa=policy, threads=hw.cores)) / land.hardware_factor(
        TrialConfig(numa=policy, threads=hw.contention_from)
    )
    lines = [
        f"**{land.name}**: {land.description}",
        "",
        "| figure | value |",
        "|---|---|",
        f"| host | {hw.cores} cores / {hw.logical} logical, {len(hw.nodes)} NUMA node(s) |",
        f"| thread curve | peak at {hw.contention_from} threads ({hw.contention_from / hw.cores:.0%} of the "
        f"cores), {fall:.1%} lower at all cores, tau {hw.tau:.1f}, SMT penalty {hw.smt_penalty:.2f} |",
        "| NUMA policies | " + ", ".join(f"{p} {f:.3f}" for p, f in hw.numa.items()) + " |",
        f"| draft cost coupling to threads | {hw.draft_thread_coupling:.2f} |",
        f"| verification cost per K, decay | {land.verify_cost:.4f}, {land.decay:.5f} |",
        f"| workload | {', '.join(f'{c} x{land.prompts.count(c)}' for c in sorted(set(land.prompts)))} |",
        f"| quality per unit temperature (floor {land.quality_floor}) | {land.quality_temp:.4f} |",
        f"| launch noise, request noise | {land.cv_launch:.1%}, {land.cv_request:.1%} |",
    ]
    lines += _draft_rows(land)
    lines += [
        f"| {name} | fidelity {lk.fidelity}; grounding "
        + ", ".join(f"{c}: copy {g.copy:.0%} span {g.span:g}" for c, g in land.grounding.items())
        + " |"
        for name, lk in land.lookups.items()
    ]
    cfg = " ".join(f"{k}={v}" for k, v in best.as_dict().items())
    lines += [f"| optimum | {rate:.2f} t/s: {cfg} |", f"| configurations | {land.size:,} |", ""]
    return "\n".join(lines)


def _whole_host_policy(hw: Hardware) -> str:
    """The best policy that spreads over the whole host (bind's curve is one node's)."""
    return max((p for p in hw.numa if p != "bind"), key=lambda p: hw.numa[p])


def _draft_rows(land: OperatorLandscape) -> list[str]:
    """A row per draft and content type: acceptance, temperature slope, best K and rate factor at the peak."""
    rows = []
    for name, draft in land.drafts.items():
        for content in sorted(draft.accept):
            rounds = land.speed.draft_rounds(draft, content, K_RANGE, 0.0, land.hardware.contention_from, 1.0)
            factor = rounds.tokens / rounds.time
            best_k = int(np.argmax(factor)) + 1
            rows.append(
                f"| {name} on {content} | cost {draft.cost:.3f}, acceptance {draft.accept[content]:.4f}, "
                f"slope {draft.temp_slope[content]:+.3f}/unit, best K {best_k} at x{float(np.max(factor)):.2f} |"
            )
    return rows


def draw_seeds(text: str) -> range:
    """``A-B`` (inclusive) or ``A`` as a range of seeds; ``held-out`` and ``development`` name the fixed
    ranges."""
    named = {"held-out": HELD_OUT_SEEDS, "development": DEVELOPMENT_SEEDS}
    if text in named:
        return named[text]
    first, _, last = text.partition("-")
    start = int(first)
    return range(start, (int(last) if last else start) + 1)
