"""Integer tables with given row and column sums: how a random draw is made to hold the sizes a paper printed.

A paper that prints its clients' sizes (FACMIC Table 1, FAA-CLIP Table I) fixes the column sums of the
class x client table of its partition; the dataset fixes the row sums (its class counts). A Dirichlet draw
gives neither exactly. :func:`fit_table` moves a draw onto both: iterative proportional fitting (Deming and
Stephan 1940; the table with the given margins nearest the draw in Kullback-Leibler divergence, which keeps
the draw's odds ratios between classes and clients), above a floor per cell (every client holds every
class), then rounded to integers without losing a sum (:func:`round_table`).
"""

from __future__ import annotations

import numpy as np

IPF_ITERATIONS, IPF_TOLERANCE = 10_000, 1e-9


class MarginError(ValueError):
    pass


def fit_table(seed: np.ndarray, rows: np.ndarray, cols: np.ndarray, floor: np.ndarray | None = None) -> np.ndarray:
    """The integer table with row sums ``rows``, column sums ``cols`` and every cell at least ``floor``
    (a table of the same shape, default 0) nearest the positive table ``seed``."""
    seed, rows, cols = np.asarray(seed, dtype=float), np.asarray(rows, dtype=np.int64), np.asarray(cols, dtype=np.int64)
    floor = np.zeros(seed.shape, dtype=np.int64) if floor is None else np.asarray(floor, dtype=np.int64)
    if rows.sum() != cols.sum():
        raise MarginError(f"the row sums ({rows.sum()}) and column sums ({cols.sum()}) differ")
    free_rows, free_cols = rows - floor.sum(axis=1), cols - floor.sum(axis=0)
    if (free_rows < 0).any() or (free_cols < 0).any():
        short = [int(i) for i in np.flatnonzero(free_rows < 0)], [int(j) for j in np.flatnonzero(free_cols < 0)]
        raise MarginError(f"the floor per cell does not fit: rows {short[0]} and columns {short[1]} are smaller "
                          f"than the sum of their floors")
    # a tiny share in every cell: a draw may put exactly 0 where the margins need something
    table = proportional_fit(np.maximum(seed, 0.0) + 1e-12, free_rows, free_cols)
    return floor + round_table(table, free_rows, free_cols)


def proportional_fit(table: np.ndarray, rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
    """Scale the rows and columns of a positive table in turn until its sums are ``rows`` and ``cols``."""
    table = table.copy()
    for _ in range(IPF_ITERATIONS):
        have = table.sum(axis=1)
        table *= np.divide(rows, have, out=np.zeros_like(have), where=have > 0)[:, None]
        have = table.sum(axis=0)
        table *= np.divide(cols, have, out=np.zeros_like(have), where=have > 0)[None, :]
        if np.abs(table.sum(axis=1) - rows).max(initial=0.0) <= IPF_TOLERANCE * max(1, rows.max(initial=1)):
            return table
    raise MarginError("proportional fitting did not converge")


def round_table(table: np.ndarray, rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
    """Integers with row sums ``rows`` and column sums ``cols`` from a real table with (about) these sums: every
    cell rounded down, then the missing units go to the cells with the largest remainders whose row and column
    still miss one (ties in row-major order), and what is left (rare) to the first cells whose row and column
    still miss some."""
    out = np.floor(table + 1e-9).astype(np.int64)
    need_rows, need_cols = rows - out.sum(axis=1), cols - out.sum(axis=0)
    remainder = (table - out).ravel()
    for flat in np.argsort(-remainder, kind="stable"):
        i, j = divmod(int(flat), table.shape[1])
        if need_rows[i] > 0 and need_cols[j] > 0:
            out[i, j] += 1
            need_rows[i] -= 1
            need_cols[j] -= 1
    for i in np.flatnonzero(need_rows > 0):
        for j in np.flatnonzero(need_cols > 0):
            step = min(need_rows[i], need_cols[j])
            out[i, j] += step
            need_rows[i] -= step
            need_cols[j] -= step
    if (out < 0).any() or (out.sum(axis=1) != rows).any() or (out.sum(axis=0) != cols).any():
        raise MarginError("could not round the table to its sums")
    return out


def apportion(total: int, weights: np.ndarray) -> np.ndarray:
    """``total`` units divided in proportion to ``weights`` (largest remainders; ties to the first)."""
    weights = np.asarray(weights, dtype=float)
    quota = total * weights / weights.sum() if weights.sum() > 0 else np.zeros_like(weights)
    out = np.floor(quota + 1e-9).astype(np.int64)
    for i in np.argsort(-(quota - out), kind="stable")[: total - int(out.sum())]:
        out[i] += 1
    return out
