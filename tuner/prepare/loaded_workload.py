"""The study's workload: its suites loaded (errors naming the study file's field), the chat template its
conversations are served through, every prompt checked to fit its slot's context, and each request's prompt
tokens as the estimate counts them."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from tuner import eta
from tuner.errors import MissingBinaryError, UserError
from tuner.machine.llama_build import binary
from tuner.measurement.workload import (
    BUILTIN_CHAT_TEMPLATES,
    TOKENS_PER_BYTE_SLACK,
    Workload,
    llama_tokenize_count,
    load_workload,
    too_long,
)
from tuner.models.gguf_info import ModelInfo
from tuner.progress import Progress
from tuner.studyfile.spec import StudySpec


def study_workload(spec: StudySpec) -> Workload:
    """The study's suites loaded; a problem is one line naming the study file and its field."""
    try:
        return load_workload(list(spec.suites), spec.base_dir)
    except UserError as err:  # name the study file and its field
        raise UserError(f"{spec.path}: workload.suites: {str(err).removeprefix('workload: ')}") from None


def chat_template(spec: StudySpec, target: ModelInfo, workload: Workload) -> str | None:
    """The Jinja source chat suites are served through: the study's ``llama_cpp.chat_template``, else the
    target's own; a chat suite on a target without one is refused (llama-server would fall back to
    ChatML, which a model never trained on it answers with noise)."""
    if not workload.chat:
        return None
    if spec.chat_template is not None:
        return spec.chat_template.read_text(encoding="utf-8")
    if target.chat_template is None:
        chats = [p.suite for p in workload.prompts if p.chat]
        raise UserError(
            f"{spec.path}: workload.suites: suite {chats[0]} holds conversations, but {spec.target.name} has "
            "no chat template (no tokenizer.chat_template); name one in llama_cpp.chat_template (a built-in: "
            f"{', '.join(BUILTIN_CHAT_TEMPLATES)}, or a Jinja file)"
        )
    return target.chat_template


def check_prompts_fit(
    spec: StudySpec,
    workload: Workload,
    bin_dir: Path,
    progress: Progress,
    slots: int = 1,
    template: str | None = None,
) -> None:
    """Every prompt leaves room for n_predict tokens in its slot's share of ctx_size, counted in the
    target's own vocabulary; else one line naming the prompt, where it is defined, its tokens and the
    ctx_size it needs."""
    measurement = replace(spec.measurement, ctx_size=spec.measurement.ctx_size // slots)
    field = "measurement.ctx_size" if slots == 1 else "workload.concurrency"
    split = (
        "" if slots == 1 else f" (measurement.ctx_size {spec.measurement.ctx_size} split over {slots} slots)"
    )

    def count(text: str) -> int:
        return llama_tokenize_count(tokenizer, spec.target, text)

    try:
        tokenizer = binary("llama-tokenize", bin_dir)
        long = too_long(workload, measurement.ctx_size, measurement.n_predict, count, template)
    except MissingBinaryError:
        long = too_long(
            workload,
            measurement.ctx_size,
            measurement.n_predict,
            lambda text: len(text.encode()) + TOKENS_PER_BYTE_SLACK,
            template,
        )
        if long:
            progress(
                f"note: prompt '{long[0][0].id}' ({long[0][0].source}) may not fit measurement.ctx_size "
                f"{measurement.ctx_size}, and llama-tokenize is not in {bin_dir} to count it; a prompt that does not "
                "fit fails its trials as context_exceeded"
            )
        return
    if long:
        prompt, tokens = long[0]
        more = f" (and {len(long) - 1} more prompt(s))" if len(long) > 1 else ""
        what = (
            f"conversation '{prompt.id}' ({prompt.source}) reaches {tokens} tokens at its turn "
            f"{prompt.n_turns} (through the chat template, earlier replies of n_predict tokens included)"
            if prompt.chat
            else f"prompt '{prompt.id}' ({prompt.source}) is {tokens} tokens"
        )
        raise UserError(
            f"{spec.path}: {field}: {what} in the "
            f"target's vocabulary (counted by llama-tokenize), which with n_predict {measurement.n_predict} does not fit "
            f"ctx_size {measurement.ctx_size}{split}{more}; raise measurement.ctx_size to at least "
            f"{slots * (tokens + measurement.n_predict + 1)}, or shorten the prompt"
            + (", or lower the level" if slots > 1 else "")
        )


def request_prompts(workload: Workload) -> list[int]:
    """The prompt tokens each request has the server process (estimated from characters): a conversation's
    later turns only their new message, the conversation so far being in the server's prompt cache
    (``cache_prompt``, as every request sends it)."""
    tokens = []
    for prompt in workload.prompts:
        tokens.append(
            eta.prompt_tokens("".join(c for _, c in prompt.messages) if prompt.messages else prompt.text)
        )
        tokens += [eta.prompt_tokens(turn) for turn in prompt.turns]
    return tokens
