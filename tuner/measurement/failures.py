"""Why a trial failed: one taxonomy, recorded on every failed trial with its log tail.

``server_process`` classifies what it saw (exit code, signal, log lines, timeouts) into one of
these reasons; the study records it and goes on. ``PERMANENT`` reasons will not change
if the same configuration is tried again, so the study does not launch it again: before
launching, ``run/trial_references`` looks for a failed trial with the same configuration and a
permanent reason, and if there is one records the new trial as failed at once with the
same reason and that trial's log tail (it still counts toward the budget, which bounds a
sampler that keeps proposing it). Timeouts, crashes, unreachable servers and
interruptions may be flukes of the moment and may be tried again. A trial whose worker
died (failed by heartbeat, see ``tuner.storage.coordination``) has no reason: nobody was left to write one.
"""

from __future__ import annotations

import enum


class FailureReason(str, enum.Enum):
    LAUNCH_FAILED = "launch_failed"  # bad binary or flags: exited before loading a model
    MODEL_LOAD_FAILED = "model_load_failed"  # bad or corrupt GGUF
    OUT_OF_MEMORY = "out_of_memory"  # allocation errors, or killed with exit 137
    TIMEOUT = "timeout"  # not ready, or a request not answered, within the limit (hang)
    CRASHED = "crashed"  # died from a signal mid-run
    SPECULATION_UNAVAILABLE = "speculation_unavailable"  # asked to draft, drafted nothing
    SERVER_UNREACHABLE = "server_unreachable"  # process alive but HTTP failed
    INTERRUPTED = "interrupted"  # Ctrl-C or SIGTERM to the tuner during the trial
    INVALID_CONFIG = "invalid_config"  # refused before launch (e.g. incompatible draft)
    DOES_NOT_FIT = "does_not_fit"  # weights, draft and KV cache more than the host's (or bind node's) memory
    BAD_RESPONSE = "bad_response"  # HTTP 200 whose body is an error, or has no timings
    IMPOSSIBLE_TIMING = "impossible_timing"  # decode time that wall-clock time cannot hold
    ABOVE_ROOFLINE = "above_roofline"  # faster than memory bandwidth allows without speculation
    CONTEXT_EXCEEDED = (
        "context_exceeded"  # a prompt longer than measurement.ctx_size: the study file's to fix
    )


PERMANENT = frozenset(
    {
        FailureReason.LAUNCH_FAILED,
        FailureReason.MODEL_LOAD_FAILED,
        FailureReason.OUT_OF_MEMORY,
        FailureReason.SPECULATION_UNAVAILABLE,
        FailureReason.INVALID_CONFIG,
        FailureReason.CONTEXT_EXCEEDED,
    }
)


class TrialFailure(Exception):
    """A trial that cannot produce a measurement; carries its reason and evidence."""

    def __init__(self, reason: FailureReason, detail: str, log_tail: str = ""):
        super().__init__(f"{reason.value}: {detail}")
        self.reason = reason
        self.detail = detail
        self.log_tail = log_tail
