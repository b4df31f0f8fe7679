"""`tuner report STUDY`: one self-contained HTML page and a CSV of all trials under reports/STUDY/.

The numbers come from ``tuner.output.analysis``; the page from ``tuner.output.report_html``.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from tuner.output.analysis import ReportData
from tuner.output.files import write_atomic


def csv_frame(frame: pd.DataFrame) -> pd.DataFrame:
    """The trials table as exported: everything but the bulky failure detail's newlines."""
    out = frame.copy()
    if "failure_detail" in out:
        out["failure_detail"] = out["failure_detail"].str.replace("\n", " ", regex=False)
    return out


def write_report(data: ReportData, out_dir: Path) -> tuple[Path, Path]:
    """Write ``index.html`` and ``trials.csv`` under ``out_dir``; returns both paths. Both are rendered
    before either is written, and each is written whole or not at all (``write_atomic``)."""
    from tuner.output.report_html import render  # plotly is imported only when rendering

    page, table = render(data), csv_frame(data.trials).to_csv(index=False)
    csv_path = write_atomic(out_dir / "trials.csv", table)
    html_path = write_atomic(out_dir / "index.html", page)
    return html_path, csv_path
