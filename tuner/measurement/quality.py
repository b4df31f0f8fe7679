"""Output quality scorers; each suits some knobs and misleads on others.

- ``agreement``: token-level similarity with the baseline's greedy output. For knobs
  that should not change the output at temperature 0: speculation type, draft model
  and K, threads, pinning, NUMA; and, as a drift measure, expert count.
- ``answer_score``: fraction of prompts whose text meets their expected answers. For
  temperature searches, where agreement would punish every temperature above 0.
- ``perplexity_ratio``: baseline perplexity over the trial's, on a text file. Blunt:
  two models with the same perplexity can disagree on many tokens.
- ``kld``: the documented scorer for MoE expert reduction, which changes the model
  itself. The baseline's token distributions on a text file are saved once
  (``llama-perplexity --kl-divergence-base``); each expert count is compared with them
  (``--kl-divergence``). Quality is the fraction of positions whose top token is the
  baseline's ("same top p"), 1.0 for the unchanged model; the mean KLD is stored
  beside it and may be capped (``quality.max_kld``). Same-top is the quality rather
  than 1 - KLD because it is bounded in [0, 1] like the other scorers, so one floor
  reads the same way; KLD is unbounded and its scale depends on the vocabulary.
"""

from __future__ import annotations

import re
import subprocess
import tempfile
from collections.abc import Iterable, Sequence
from importlib import resources
from pathlib import Path
from typing import TypedDict

from tuner.errors import UserError
from tuner.machine.llama_build import binary
from tuner.measurement.failures import FailureReason, TrialFailure
from tuner.measurement.measure import Sample
from tuner.measurement.server_process import classify_exit, describe_exit, read_log_tail, stop_process_group
from tuner.measurement.workload import Workload, request_key

# llama-perplexity has no structured output: this line on its log is the only result.
FINAL_ESTIMATE = re.compile(r"Final estimate: PPL = ([0-9.]+|nan|inf)")
# tools/perplexity/perplexity.cpp, kl_divergence(): "Mean    KLD:   0.012345 ±   0.001234"
# and "Same top p: 98.765 ± 0.123 %"
MEAN_KLD = re.compile(r"Mean\s+KLD:\s+(-?[0-9.]+|nan|inf)")
SAME_TOP = re.compile(r"Same top p:\s+([0-9.]+|nan)\s")
PERPLEXITY_ATTEMPTS = 3


def edit_similarity(a: Sequence, b: Sequence) -> float:
    """1 - Levenshtein(a, b) / max(len a, len b); 1.0 for two empty sequences."""
    if not a and not b:
        return 1.0
    previous = list(range(len(b) + 1))
    for row, item_a in enumerate(a, 1):
        current = [row]
        for column, item_b in enumerate(b, 1):
            current.append(
                min(previous[column] + 1, current[column - 1] + 1, previous[column - 1] + (item_a != item_b))
            )
        previous = current
    return 1.0 - previous[-1] / max(len(a), len(b))


def agreement(outputs: dict[str, tuple[int, ...]], reference: dict[str, tuple[int, ...]]) -> float:
    """Mean token edit similarity with the reference output, prompt by prompt.

    The reference is the baseline configuration's greedy output (target alone, all
    experts, temperature 0). Speculative decoding at temperature 0 is lossless, so a
    correct drafting configuration scores exactly 1.0. Any temperature above 0 is
    penalised by construction: use ``answer_score`` to search temperature.
    """
    if not reference:
        raise ValueError("agreement needs a non-empty reference")
    if outputs.keys() != reference.keys():
        raise ValueError(
            f"outputs and reference cover different prompts: {sorted(outputs.keys() ^ reference.keys())}"
        )
    return sum(edit_similarity(outputs[p], ref) for p, ref in reference.items()) / len(reference)


def answer_score(outputs: dict[str, str], workload: Workload) -> float:
    """Fraction of prompts with expected answers whose output meets all of them."""
    graded = [p for p in workload.prompts if p.expected]
    if not graded:
        raise UserError(
            f"answer quality needs prompts with `expected` answers; suites {', '.join(workload.suites)} have none "
            "(add the math or json suite, or `expected` to your own)"
        )
    # a conversation's expected answers are checked on its last turn's reply
    passed = sum(
        all(e.met_by(outputs[request_key(p.id, p.n_turns if p.chat else 0)]) for e in p.expected)
        for p in graded
    )
    return passed / len(graded)


class ScorerFigures(TypedDict, total=False):
    """A trial's figures besides its quality (``TrialRecord.scores``): the kld scorer's two (``measure_kld``
    sets both), and the share of its output that repeats itself (``repeated_output``)."""

    mean_kld: float
    same_top: float  # share of tokens whose top choice is the base model's
    repeated_output: float


REPEAT_NGRAM = 4  # words: a reply that repeats a 4-word run of its own is copying itself


def repeated_output(texts: Iterable[str], n: int = REPEAT_NGRAM) -> float:
    """Share of output words that complete an ``n``-word run the same output already produced.

    Why: prompt lookup drafts from text the context holds, and the model's own earlier output is part
    of it. A base model that loops ("The series will be a 10-episode series ..." seven times) hands
    lookup easy tokens; this share says how much of a lookup gain may be that, not the prompt."""
    repeated = total = 0
    for text in texts:
        words = text.split()
        seen: set[tuple[str, ...]] = set()
        for last in range(n - 1, len(words)):
            gram = tuple(words[last - n + 1 : last + 1])
            repeated += gram in seen
            seen.add(gram)
        total += max(0, len(words) - n + 1)
    return repeated / total if total else 0.0


def output_quality(
    scorer: str, outputs: dict[str, Sample], workload: Workload, reference_tokens: dict[str, list[int]]
) -> float:
    """A trial's quality from its outputs: the one rule for studies and recorded grids.
    (``perplexity`` is not an output score: it needs llama-perplexity runs, see the study.)"""
    if scorer == "answers":
        return answer_score({pid: s.text for pid, s in outputs.items()}, workload)
    return agreement(
        {pid: tuple(s.tokens) for pid, s in outputs.items()},
        {pid: tuple(tokens) for pid, tokens in reference_tokens.items()},
    )


def builtin_text() -> Path:
    """The text the kld scorer runs on when the study file names none (``tuner/data/quality/kld.txt``): prose,
    instructions, arithmetic answers, code, SQL, JSON lines and a summary, about 2,000 tokens of a typical
    tokenizer, so the default 8 windows of 128 tokens are all filled."""
    return Path(str(resources.files("tuner") / "data" / "quality" / "kld.txt"))


def _perplexity_argv(
    model_argv_flags: list[str], text_file: Path, ctx: int, chunks: int, bin_dir
) -> list[str]:
    """llama-perplexity over ``chunks`` windows of ``ctx`` tokens of ``text_file``, the model as given."""
    return [
        str(binary("llama-perplexity", bin_dir)),
        *model_argv_flags,
        *("-f", str(text_file), "-c", str(ctx), "--chunks", str(chunks)),
    ]


def measure_perplexity(
    model_argv_flags: list[str],
    text_file: Path,
    ctx: int = 128,
    chunks: int = 8,
    timeout_s: float = 600.0,
    bin_dir: str | Path | None = None,
) -> float:
    """Perplexity of a model configuration on ``text_file`` (needs ``2 * ctx`` tokens at least).

    ``model_argv_flags`` are the trial's model flags (``-m``, ``--override-kv``, ``-t``...).
    llama.cpp logs from a background thread it never joins (common/log.cpp leaks the
    logger on purpose), so a run can exit 0 with its last lines, the estimate among
    them, unwritten; such a run is repeated, up to ``PERPLEXITY_ATTEMPTS`` times.
    """
    argv = _perplexity_argv(model_argv_flags, text_file, ctx, chunks, bin_dir)
    for _ in range(PERPLEXITY_ATTEMPTS):
        returncode, text = _run_to_exit(argv, timeout_s)
        tail = "\n".join(text.splitlines()[-40:])
        if "you need at least" in text:
            raise UserError(
                f"{text_file}: too short for perplexity with a context of {ctx}; "
                f"it needs {2 * ctx} tokens or more"
            )
        match = FINAL_ESTIMATE.search(text)
        if match:
            return float(match.group(1))
        if returncode != 0:
            reason = classify_exit(returncode, text, started=False)
            raise TrialFailure(reason, f"llama-perplexity failed ({describe_exit(returncode)})", tail)
    raise TrialFailure(
        FailureReason.LAUNCH_FAILED,
        f"llama-perplexity exited {PERPLEXITY_ATTEMPTS} times without an estimate; "
        f"is {text_file} at least {2 * ctx} tokens long?",
        tail,
    )


def save_kld_base(
    model_argv_flags: list[str],
    text_file: Path,
    base_file: Path,
    ctx: int = 128,
    chunks: int = 8,
    timeout_s: float = 600.0,
    bin_dir: str | Path | None = None,
) -> Path:
    """The baseline's logits on ``text_file``, written once to ``base_file`` (a temp name, then renamed)."""
    if base_file.is_file():
        return base_file
    base_file.parent.mkdir(parents=True, exist_ok=True)
    tmp = base_file.with_name(base_file.name + ".tmp")
    argv = [
        *_perplexity_argv(model_argv_flags, text_file, ctx, chunks, bin_dir),
        "--kl-divergence-base",
        str(tmp),
    ]
    for _ in range(PERPLEXITY_ATTEMPTS):
        returncode, text = _run_to_exit(argv, timeout_s)
        if "you need at least" in text:
            raise UserError(
                f"{text_file}: too short for the kld scorer with a context of {ctx}; "
                f"it needs {2 * ctx} tokens or more"
            )
        if returncode == 0 and FINAL_ESTIMATE.search(text) and tmp.is_file():
            tmp.replace(base_file)
            return base_file
        if returncode != 0:
            raise TrialFailure(
                classify_exit(returncode, text, started=False),
                f"llama-perplexity --kl-divergence-base failed ({describe_exit(returncode)})",
                "\n".join(text.splitlines()[-40:]),
            )
    raise TrialFailure(
        FailureReason.LAUNCH_FAILED, "llama-perplexity --kl-divergence-base never finished its log"
    )


def measure_kld(
    model_argv_flags: list[str],
    base_file: Path,
    ctx: int = 128,
    timeout_s: float = 600.0,
    bin_dir: str | Path | None = None,
) -> ScorerFigures:
    """``{"mean_kld", "same_top"}`` of a model configuration against the saved base logits
    (the tokens come from the base file). Repeated like perplexity when the log is cut short."""
    argv = [
        str(binary("llama-perplexity", bin_dir)),
        *model_argv_flags,
        "-c",
        str(ctx),
        "--kl-divergence-base",
        str(base_file),
        "--kl-divergence",
    ]
    for _ in range(PERPLEXITY_ATTEMPTS):
        returncode, text = _run_to_exit(argv, timeout_s)
        kld, same = MEAN_KLD.search(text), SAME_TOP.search(text)
        if kld and same:
            # -0.000001 is rounding of an identical model: KLD is never negative
            return {"mean_kld": max(0.0, float(kld.group(1))), "same_top": float(same.group(1)) / 100.0}
        if returncode != 0:
            raise TrialFailure(
                classify_exit(returncode, text, started=False),
                f"llama-perplexity --kl-divergence failed ({describe_exit(returncode)})",
                "\n".join(text.splitlines()[-40:]),
            )
    raise TrialFailure(
        FailureReason.LAUNCH_FAILED,
        f"llama-perplexity --kl-divergence exited {PERPLEXITY_ATTEMPTS} times without its summary; "
        f"it prints one only for 100 scored tokens or more: use a longer text or more chunks",
    )


def _run_to_exit(argv: list[str], timeout_s: float) -> tuple[int, str]:
    """Run a llama.cpp tool in its own process group; its exit code and output. Always reaped."""
    with tempfile.NamedTemporaryFile(prefix="llama-tool-", suffix=".log") as log:
        try:
            proc = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        except OSError as err:
            raise TrialFailure(FailureReason.LAUNCH_FAILED, f"cannot run {argv[0]}: {err.strerror}") from err
        try:
            returncode = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            raise TrialFailure(
                FailureReason.TIMEOUT,
                f"{Path(argv[0]).name} not done after {timeout_s:g} s",
                read_log_tail(Path(log.name), 40),
            ) from None
        finally:
            stop_process_group(proc)
        return returncode, Path(log.name).read_text(errors="replace")


def perplexity_ratio(baseline_ppl: float, trial_ppl: float) -> float:
    """Baseline perplexity over the trial's: 1.0 is no loss, below 1.0 a worse model."""
    return baseline_ppl / trial_ppl
