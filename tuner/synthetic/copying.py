"""How much a model quotes its prompt: the copy share, and the family's calibration against a real model.

Why: prompt lookup, lookup stacked on a draft and the per-type router pay where the output copies
the input. The family's copy head (``weights.Copy``) is set so the target quotes as much as a real
model does on the same prompts, measured here, never from a speculation result.

The copy share of a completion is the share of its output tokens that lie in a run of
``MIN_RUN`` or more consecutive output tokens found verbatim in the prompt's tokens (each model
in its own tokens: prompt lookup drafts in tokens). A suite's share pools its prompts' tokens.
Greedy decoding, ``N_PREDICT`` tokens, one llama-server: deterministic on any load.
"""

from __future__ import annotations

import json
import tempfile
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from tuner.measurement.measured_launch import ServerLaunch, measured_launch
from tuner.measurement.server_process import LlamaServer
from tuner.measurement.workload import load_workload
from tuner.synthetic import landscape

MIN_RUN = 4
N_PREDICT = 64
CALIBRATION_SUITES = ("summarize", "code", "prose")
# How far the synthetic target's share may lie from the real model's, per suite.
TOLERANCE = 0.10


def copied_tokens(prompt: Sequence[int], output: Sequence[int], min_run: int = MIN_RUN) -> int:
    """Output tokens inside a run of ``min_run`` or more output tokens found verbatim in ``prompt``."""
    source = list(prompt)
    grams = {tuple(source[i : i + min_run]) for i in range(len(source) - min_run + 1)}
    covered = [False] * len(output)
    for start in range(len(output) - min_run + 1):
        if tuple(output[start : start + min_run]) in grams:
            covered[start : start + min_run] = [True] * min_run
    return sum(covered)


@dataclass(frozen=True)
class Share:
    """One suite on one model: output tokens, and those inside a run found in the prompt."""

    suite: str
    copied: int
    tokens: int

    @property
    def share(self) -> float:
        return self.copied / self.tokens if self.tokens else 0.0


def measure_shares(
    model: Path, suites: Sequence[str] = CALIBRATION_SUITES, n_predict: int = N_PREDICT
) -> dict[str, Share]:
    """Each suite's copy share on ``model``: its raw prompts, greedy, through one llama-server."""
    prompts = [p for p in load_workload(list(suites), base_dir=Path(".")).prompts if p.text is not None]

    def every_prompt(server: LlamaServer) -> dict[str, Share]:
        server.complete(prompts[0].text or "", 4, 0.0, landscape.SEED)
        counts = {suite: [0, 0] for suite in suites}
        for prompt in prompts:
            text = prompt.text or ""
            output = server.complete(text, n_predict, 0.0, landscape.SEED).tokens
            counts[prompt.suite][0] += copied_tokens(tokenize(server.url, text), output)
            counts[prompt.suite][1] += len(output)
        return {suite: Share(suite, copied, tokens) for suite, (copied, tokens) in counts.items()}

    with tempfile.TemporaryDirectory(prefix="tuner-copying-") as tmp:
        launch = ServerLaunch(landscape.Launch(model).argv(), Path(tmp) / "server.log", ready_timeout_s=120)
        shares = measured_launch(launch, then=every_prompt).then
    assert shares is not None  # every_prompt always answers
    return shares


def tokenize(url: str, text: str, add_special: bool = False) -> list[int]:
    """The server's own tokens of ``text`` (by default without BOS: the output never copies it)."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    request = urllib.request.Request(
        f"{url}/tokenize",
        data=json.dumps({"content": text, "add_special": add_special}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with opener.open(request, timeout=60) as resp:
        return list(json.load(resp)["tokens"])


@dataclass(frozen=True)
class Calibration:
    """Per suite, the real model's copy share and the synthetic target's."""

    real: dict[str, Share]
    synthetic: dict[str, Share]

    def gaps(self) -> dict[str, float]:
        return {suite: self.synthetic[suite].share - self.real[suite].share for suite in self.real}

    @property
    def within_tolerance(self) -> bool:
        return all(abs(gap) <= TOLERANCE for gap in self.gaps().values())

    def table(self, real_name: str, synthetic_name: str) -> str:
        lines = [
            f"copy share (output tokens in a run of {MIN_RUN}+ tokens found verbatim in the prompt; "
            f"greedy, {N_PREDICT} tokens, llama-server)",
            f"{'suite':<11} {real_name:>14} {synthetic_name:>14} {'gap':>7}",
        ]
        for suite, gap in self.gaps().items():
            lines.append(
                f"{suite:<11} {self.real[suite].share:14.2f} {self.synthetic[suite].share:14.2f} {gap:+7.2f}"
            )
        verdict = "within" if self.within_tolerance else "NOT within"
        return "\n".join(
            [*lines, f"the synthetic target is {verdict} {TOLERANCE:.2f} of the real model on every suite"]
        )


def calibrate(
    real_model: Path, synthetic_target: Path, progress: Callable[[str], None] | None = None
) -> Calibration:
    """The copy shares of the real model and the synthetic target on the calibration suites."""
    if progress:
        progress(f"copy share of {real_model.name} on {', '.join(CALIBRATION_SUITES)} ...")
    real = measure_shares(real_model)
    if progress:
        progress(f"copy share of {synthetic_target.name} ...")
    return Calibration(real, measure_shares(synthetic_target))
