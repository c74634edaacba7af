"""Summaries over seeds: mean, std, standard error and a t-based 95% interval.

One convention for uncertainty in everything a reader sees (tables, scorecards, the evidence page, the report, the
figures' error bars and bands): **mean ± the half-width of the 95% t-interval of the mean over n seeds**
(``ci95`` = t(0.975, n-1) x sd / sqrt(n)), always said with its n where a ± stands. The standard deviation and the
standard error stay in the tables' CSV for whoever wants them; the per-seed values are in ``<table>.seeds.csv``.
"""

from __future__ import annotations

import math

import numpy as np

# what a ± means, in the words every page uses (with n: :func:`plus_minus`)
PLUS_MINUS = "mean ± half-width of the 95% t-interval of the mean"


def plus_minus(n: int | str) -> str:
    """"mean ± half-width of the 95% t-interval of the mean over n = 3 seeds": what a ± is, with its n (one seed has
    no interval, and says so)."""
    if str(n) == "1":
        return "the value of n = 1 seed (no interval: one seed)"
    return f"{PLUS_MINUS} over n = {n} seeds"


def t_quantile_975(dof: int) -> float:
    from scipy.stats import t

    return float(t.ppf(0.975, dof))


def ci95_half_width(values) -> float:
    """The half-width of the 95% t-interval of the mean of ``values`` (NaN for fewer than two)."""
    return summarise(values)["ci95"]


def ci95_per_row(table):
    """The 95% t-interval half-width of each row's mean over its columns (seeds; NaN cells left out): a curve's band
    at each round. 0 where a row has fewer than two values (nothing to draw a band from)."""
    n = table.notna().sum(axis=1)
    t = n.map(lambda k: t_quantile_975(k - 1) if k > 1 else 0.0)
    return (table.std(axis=1) / np.sqrt(n.clip(lower=1)) * t).fillna(0.0)


def summarise(values) -> dict[str, float]:
    x = np.asarray([v for v in values if v is not None and not (isinstance(v, float) and math.isnan(v))], dtype=float)
    n = len(x)
    if n == 0:
        return {"mean": math.nan, "std": math.nan, "se": math.nan, "ci95": math.nan, "n": 0}
    std = float(np.std(x, ddof=1)) if n > 1 else math.nan
    se = std / math.sqrt(n) if n > 1 else math.nan
    return {"mean": float(np.mean(x)), "std": std, "se": se, "ci95": t_quantile_975(n - 1) * se if n > 1 else math.nan, "n": n}
