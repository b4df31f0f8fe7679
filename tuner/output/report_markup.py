"""HTML text primitives of the report: a cell's text, a plain table, the note that stands in for an empty part.

Figures, tables and the page all write through these, so a value reads the same wherever it appears.
"""

from __future__ import annotations

import html

import pandas as pd


def cell_text(value, digits: int = 2) -> str:
    """A value as a cell shows it: missing as blank, a float to ``digits`` places."""
    if value is None or (isinstance(value, float) and pd.isna(value)) or value is pd.NA:
        return ""
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def html_table(frame: pd.DataFrame, columns: dict[str, str], code: tuple[str, ...] = ()) -> str:
    """A plain HTML table; ``columns`` maps frame column -> header, ``code`` columns in <code>."""
    head = "".join(f"<th>{html.escape(h)}</th>" for h in columns.values())
    body = []
    for _, row in frame.iterrows():
        cells = []
        for col in columns:
            text = html.escape(cell_text(row.get(col)))
            cells.append(f"<td><code>{text}</code></td>" if col in code else f"<td>{text}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def empty_note(text: str) -> str:
    """What stands in for a figure or table with nothing to show, and why."""
    return f'<p class="empty">{html.escape(text)}</p>'
