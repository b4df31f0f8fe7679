"""``tuner inspect``: a GGUF's metadata and its drafts' compatibility (``models/gguf_info``)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from tuner.models.gguf_info import (
    check_draft_compatibility,
    format_compatibility,
    format_model_info,
    read_model_info,
)


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", type=Path, help="the target model (.gguf)")
    parser.add_argument(
        "drafts",
        type=Path,
        nargs="*",
        metavar="DRAFT",
        help="candidate draft models to check against the target",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    parser.epilog = (
        "Exit status is 0 whenever every file could be read, even if a draft is "
        "incompatible (that is the answer, not a failure); 2 if a file is missing "
        "or not a readable GGUF."
    )


def run(args: argparse.Namespace) -> int:
    target = read_model_info(args.model)
    drafts = [read_model_info(p) for p in args.drafts]
    checks = [check_draft_compatibility(target, d) for d in drafts]
    if args.json:
        print(
            json.dumps(
                {
                    "target": target.to_dict(),
                    "drafts": [
                        {
                            "path": str(d.path),
                            "compatible": c.ok,
                            "reasons": list(c.reasons),
                            "warnings": list(c.warnings),
                            "info": d.to_dict(),
                        }
                        for d, c in zip(drafts, checks)
                    ],
                },
                indent=2,
            )
        )
        return 0
    print(format_model_info(target))
    for draft, check in zip(drafts, checks):
        print(format_compatibility(draft, check))
    return 0
