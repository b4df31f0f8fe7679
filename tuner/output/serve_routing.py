"""Which preset section serves a request under ``tuner serve STUDY``: the study's sections read from the preset,
and the pick per request.

Why a module of its own: the pick is the rule an operator bets on (a request's content type sent to the
section tuned for it), pure and tested apart from the HTTP stack (``output/serve_proxy``). The content type
comes from ``tuner.decisions.route.request_type``, the classifier ``tuner export --per-type`` measured its
accuracy with; this module never classifies on its own.

A study's sections are those ``tuner export`` wrote for it (their ``; tuner export: study NAME`` comment):
``STUDY`` (the pooled winner), ``STUDY-TYPE`` (a content type whose own winner paid) and ``STUDY-cN`` (a load
class). A request naming one of them keeps it; any other is sent to ``STUDY-TYPE`` for its type when the
study has that section, else to ``STUDY``. A chat request goes first to ``STUDY-chat-TYPE`` (a chat suite's own
winner: the export names a section by its suite, and ``chat-code`` is measured through the chat template, turn
by turn), then to ``STUDY-TYPE``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tuner.decisions.route import request_type, section_name
from tuner.errors import UserError
from tuner.output.preset import preset_origins

ROUTED_PATHS = ("/v1/chat/completions", "/v1/completions", "/completion")  # the requests classified


@dataclass(frozen=True)
class Routing:
    """The study's sections: the pooled one and every one its export wrote."""

    study: str
    pooled: str
    sections: frozenset[str]

    def pick(self, body: dict) -> tuple[str, str]:
        """(the request's content type, the section that serves it)."""
        kind = request_type(body)
        named = body.get("model")
        if isinstance(named, str) and named in self.sections:
            return kind, named
        chat = isinstance(body.get("messages"), list)
        for suite in (f"chat-{kind}", kind) if chat else (kind,):
            own = section_name(f"{self.pooled}-{suite}")
            if own in self.sections:
                return kind, own
        return kind, self.pooled


def study_routing(preset: Path, study: str) -> Routing:
    """The study's sections in the preset file; a file or study without them is one line naming the fix."""
    if not preset.is_file():
        raise UserError(
            f"{preset}: no such preset file; run `tuner export {study}` first, or pass --preset FILE"
        )
    origins = preset_origins(preset)
    pooled = section_name(study)
    sections = frozenset(name for name, origin in origins.items() if origin == study)
    if pooled not in sections:
        studies = sorted({o for o in origins.values() if o is not None})
        raise UserError(
            f"{preset}: no section [{pooled}] exported from study {study} (studies exported there: "
            f"{', '.join(studies) or 'none'}); run `tuner export {study}` or pass --preset the file it wrote"
        )
    return Routing(study, pooled, sections)
