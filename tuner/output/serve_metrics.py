"""What ``tuner serve`` counts per section and content type, and its ``/metrics`` page (Prometheus text format).

Why: per-type tuning pays only if the traffic's types land where the export measured them; the operator
reads requests, output tokens and decode tokens/s per section and type here. The figures are llama.cpp's own
(a response's ``timings.predicted_n``/``predicted_ms``, ``usage.completion_tokens``), read from the last
event of a stream or the whole body of an answer, never re-counted by the proxy.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

_COUNTED = (b'"timings"', b'"usage"', b'"tokens_predicted"')  # an event worth parsing holds one of these


@dataclass
class Tally:
    """One section and type's totals so far."""

    requests: int = 0
    output_tokens: int = 0
    decode_tokens: int = 0
    decode_ms: float = 0.0

    def add(self, answer: dict) -> None:
        """A response's (or a stream's last event's) llama.cpp figures added."""
        timings, usage = answer.get("timings"), answer.get("usage")
        timings = timings if isinstance(timings, dict) else {}
        usage = usage if isinstance(usage, dict) else {}
        predicted_n, predicted_ms = timings.get("predicted_n"), timings.get("predicted_ms")
        tokens = usage.get("completion_tokens", answer.get("tokens_predicted", predicted_n))
        if isinstance(tokens, int):
            self.output_tokens += tokens
        if isinstance(predicted_n, int) and isinstance(predicted_ms, (int, float)) and predicted_ms > 0:
            self.decode_tokens += predicted_n
            self.decode_ms += predicted_ms


class ResponseReader:
    """A routed response's bytes as they pass: the one answer (a JSON body) or the stream event that carries
    llama.cpp's counts (SSE ``data:`` lines); only lines naming a count are parsed, so a stream's chunks cost
    one substring test each."""

    def __init__(self, streamed: bool) -> None:
        self.streamed = streamed
        self._rest = b""
        self._body: list[bytes] = []
        self.last: dict = {}

    def feed(self, chunk: bytes) -> None:
        if not self.streamed:
            self._body.append(chunk)
            return
        data = self._rest + chunk
        if not any(mark in data for mark in _COUNTED):  # most of a stream: tokens, no counts
            self._rest = data[data.rfind(b"\n") + 1 :]
            return
        lines = data.split(b"\n")
        self._rest = lines.pop()
        for line in lines:
            if line.startswith(b"data:") and any(mark in line for mark in _COUNTED):
                self._take(line[5:])

    def answer(self) -> dict:
        """The counts' carrier: the stream's last such event, or the body parsed (empty when neither)."""
        if self.streamed:
            if self._rest.startswith(b"data:"):
                self._take(self._rest[5:])
                self._rest = b""
            return self.last
        self._take(b"".join(self._body))
        return self.last

    def _take(self, data: bytes) -> None:
        try:
            parsed = json.loads(data)
        except ValueError:
            return
        if isinstance(parsed, dict):
            self.last = {**self.last, **parsed} if self.streamed else parsed


class ServeMetrics:
    """Totals per (section, type), and the requests refused before routing by why."""

    def __init__(self) -> None:
        self.tallies: dict[tuple[str, str], Tally] = {}
        self.refused: dict[str, int] = {}

    def routed(self, section: str, kind: str, answer: dict) -> None:
        tally = self.tallies.setdefault((section, kind), Tally())
        tally.requests += 1
        tally.add(answer)

    def refuse(self, reason: str) -> None:
        self.refused[reason] = self.refused.get(reason, 0) + 1

    def page(self) -> str:
        """The Prometheus text exposition of every total."""
        rows = sorted(self.tallies.items())
        lines = [
            "# HELP tuner_serve_requests_total Requests routed, by the section that served them and their content type.",
            "# TYPE tuner_serve_requests_total counter",
            *(f"tuner_serve_requests_total{_labels(s, k)} {t.requests}" for (s, k), t in rows),
            "# HELP tuner_serve_output_tokens_total Tokens generated (llama.cpp's usage.completion_tokens).",
            "# TYPE tuner_serve_output_tokens_total counter",
            *(f"tuner_serve_output_tokens_total{_labels(s, k)} {t.output_tokens}" for (s, k), t in rows),
            "# HELP tuner_serve_decode_tokens_per_second Decode rate so far: llama.cpp's timings.predicted_n "
            "over predicted_ms, summed.",
            "# TYPE tuner_serve_decode_tokens_per_second gauge",
            *(
                f"tuner_serve_decode_tokens_per_second{_labels(s, k)} {1000.0 * t.decode_tokens / t.decode_ms:.6g}"
                for (s, k), t in rows
                if t.decode_ms > 0
            ),
            "# HELP tuner_serve_refused_total Requests answered by the proxy itself with an error, by reason.",
            "# TYPE tuner_serve_refused_total counter",
            *(
                f'tuner_serve_refused_total{{reason="{_escape(r)}"}} {n}'
                for r, n in sorted(self.refused.items())
            ),
        ]
        return "\n".join(lines) + "\n"


def _labels(section: str, kind: str) -> str:
    return f'{{section="{_escape(section)}",type="{_escape(kind)}"}}'


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
