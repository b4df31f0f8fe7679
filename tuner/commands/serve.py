"""``tuner serve``: one OpenAI-compatible endpoint that sends each request to its content type's tuned section
(``output/serve_proxy``)."""

from __future__ import annotations

import argparse
from pathlib import Path

from tuner.machine.llama_build import ENV_BIN_DIR
from tuner.output.preset import PRESET_FILE
from tuner.output.serve_proxy import serve
from tuner.paths import reports_dir


def configure(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "One OpenAI-compatible endpoint for mixed traffic: each /v1/chat/completions, /v1/completions and "
        "/completion request is classified (the chat's last user message or the prompt, with the classifier "
        "`tuner export --per-type` measured) and sent to the study's section for its content type, else to the "
        "study's pooled section; a request naming one of the study's sections keeps it. Every other path "
        "passes through unchanged; /metrics is the proxy's own (Prometheus text). Starts llama-server's router "
        "on the preset (as serve-router.sh does) unless --upstream names a running one."
    )
    parser.add_argument("study", help="the exported study whose sections serve the traffic")
    parser.add_argument("--preset", type=Path, help=f"the preset file (default: reports/{PRESET_FILE})")
    parser.add_argument(
        "--host", default="127.0.0.1", help="address to bind (default: 127.0.0.1; the proxy has no login)"
    )
    parser.add_argument("--port", type=int, default=8080, help="port (default: 8080)")
    parser.add_argument(
        "--upstream", help="a llama-server router already running on the preset (e.g. http://127.0.0.1:9000)"
    )
    parser.add_argument(
        "--bin-dir",
        type=Path,
        help=f"the llama.cpp build whose llama-server runs the router (default: ${ENV_BIN_DIR}, else the pinned)",
    )


def run(args: argparse.Namespace) -> int:
    preset = args.preset or reports_dir() / PRESET_FILE
    return serve(args.study, preset, args.host, args.port, args.upstream, args.bin_dir)
