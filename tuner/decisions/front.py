"""The trials a deployment is chosen among: those that meet the quality floor (``feasible``), their Pareto
fronts and the knee of a 2-D front (the best speed before quality is paid for it). Pure pandas on the
trials frame (``tuner.output.analysis.trials_frame``), which reports draw and exports choose from.
"""

from __future__ import annotations

import pandas as pd


def feasible(frame: pd.DataFrame) -> pd.DataFrame:
    return frame[frame["feasible"].astype(bool)]


def pareto_mask(frame: pd.DataFrame, columns: list[str], maximize: list[bool] | None = None) -> pd.Series:
    """True for rows no other row dominates (at least as good everywhere, better somewhere)."""
    maximize = maximize or [True] * len(columns)
    signs = [1.0 if m else -1.0 for m in maximize]
    values = frame[columns].astype(float).to_numpy() * signs
    mask = []
    for index, row in enumerate(values):
        dominated = any(
            (other >= row).all() and (other > row).any() for j, other in enumerate(values) if j != index
        )
        mask.append(not dominated)
    return pd.Series(mask, index=frame.index, dtype=bool)


def front_2d(frame: pd.DataFrame, x: str, y: str = "tokens_per_second") -> pd.DataFrame:
    """The feasible trials on the 2-D front of ``x`` against ``y`` (both maximized), by ``x``."""
    pool = feasible(frame).dropna(subset=[x, y])
    if pool.empty:
        return pool
    return pool[pareto_mask(pool, [x, y])].sort_values(x)


def knee(front: pd.DataFrame, x: str = "quality", y: str = "tokens_per_second") -> int | None:
    """The trial at the knee of a 2-D front: farthest from the chord joining its two ends.

    Both axes are scaled to [0, 1] over the front first; with fewer than three
    distinct points there is no bend and the fastest trial is the knee.
    """
    if front.empty:
        return None
    points = front[[x, y, "trial"]].drop_duplicates(subset=[x, y]).sort_values(x)
    if len(points) < 3:
        return int(front.sort_values(y, ascending=False)["trial"].iloc[0])
    xs = (points[x] - points[x].min()) / (points[x].max() - points[x].min())
    ys = (points[y] - points[y].min()) / (points[y].max() - points[y].min())
    (x0, y0), (x1, y1) = (xs.iloc[0], ys.iloc[0]), (xs.iloc[-1], ys.iloc[-1])
    distance = ((y1 - y0) * xs - (x1 - x0) * ys + x1 * y0 - y1 * x0).abs()
    return int(points["trial"].loc[distance.idxmax()])
