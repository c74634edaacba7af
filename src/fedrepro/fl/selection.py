"""Model selection: which round a run's reported metrics come from.

Rules over the per-round history (``history.csv``): ``last``; ``best_val`` (the round best on the
validation data: the mean of the clients' validation metrics, or with ``selection.validation: pooled``
their pooled predictions); ``last_k_mean`` (the mean of the last k evaluated rounds); and, for the
paper protocol, ``best_test`` (each column's best over rounds, selected on the test set itself, as
the authors' code did) and ``best_test_round`` (every column at the one round best on a test metric).
``auto`` = ``best_val`` under the clean protocol, ``best_test`` under the paper protocol.
:class:`PredictionTracker` keeps the predictions of the rounds the rules may pick.

The rules that read the test set (:data:`TEST_RULES`) belong to the paper protocol. A clean run neither
selects with them nor computes or stores them (:func:`allowed_rules`), unless its train block says
``allow_test_selection: true`` (an explicit opt-in that the configuration check asks for, and the run
manifest, metrics.json and the table captions record).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

SELECTION_RULES = ("last", "best_val", "best_test", "best_test_round", "last_k_mean")
TEST_RULES = ("best_test", "best_test_round")      # rules that pick rounds (or values) on the test set
LOWER_IS_BETTER = {"ece", "loss"}


class ForbiddenTestUse(ValueError):
    """A run would read its test data (selection or domain-adaptation target) without being allowed to."""


def opted_in(train: dict) -> bool:
    """A train block's ``allow_test_selection``. Unset means not opted in; it stays out of the resolved
    train block then, so that run configurations (and their hashes) of runs that never opt in are unchanged."""
    return bool(train.get("allow_test_selection", False))


def may_read_test_data(protocol: str, allow_test_selection: bool) -> bool:
    """Whether a run may read its test data to select or to adapt: under the paper protocol (the
    authors' protocol), or with the explicit opt-in ``allow_test_selection: true``."""
    return protocol == "paper" or bool(allow_test_selection)


def allowed_rules(protocol: str, allow_test_selection: bool) -> tuple[str, ...]:
    """The selection rules a run computes and stores: all of them under the paper protocol (or with the
    opt-in), only those that never look at the test set otherwise."""
    if may_read_test_data(protocol, allow_test_selection):
        return SELECTION_RULES
    return tuple(r for r in SELECTION_RULES if r not in TEST_RULES)


class PredictionTracker:
    """Keeps the predictions of the rounds a selection rule may pick: ``last``; ``best_val`` (the round
    best on validation); and, for the paper protocol, ``best_test`` (each eval key's predictions at the
    round where *that* key's metric is best: FAA-CLIP's code writes a client's ROC and decision-curve
    arrays whenever that client's test accuracy improves) and ``best_test_round`` (every key at the one
    round best on the global test set, ``global/<metric>``). ``rules``: the rules to track (those the
    run's protocol allows, :func:`allowed_rules`); the test-set ones are neither computed nor kept
    without them."""

    def __init__(self, metric: str, val_key: str = "val_mean", rules: tuple[str, ...] = SELECTION_RULES):
        self.metric, self.val_key = metric, val_key
        self.rules = tuple(rules)
        self.sign = -1.0 if metric in LOWER_IS_BETTER else 1.0
        self.best = {"best_val": -np.inf, "best_test_round": -np.inf, "best_test": {}}
        self.predictions: dict[str, dict] = {}

    def _better(self, value, best) -> bool:
        return value is not None and not np.isnan(value) and self.sign * value > best

    def update(self, rnd: int, metrics: dict, preds: dict) -> None:
        packed = {"round": rnd, **{f"{k}/probs": p for k, (p, _) in preds.items()},
                  **{f"{k}/labels": y for k, (_, y) in preds.items()}}
        self.predictions["last"] = packed
        for rule, key in (("best_val", f"{self.val_key}/{self.metric}"), ("best_test_round", f"global/{self.metric}")):
            value = metrics.get(key)
            if rule in self.rules and self._better(value, self.best[rule]):
                self.best[rule] = self.sign * value
                self.predictions[rule] = packed
        if "best_test" not in self.rules:
            return
        per_key = self.predictions.setdefault("best_test", {})
        for key, (probs, labels) in preds.items():
            value = metrics.get(f"{key}/{self.metric}")
            if self._better(value, self.best["best_test"].get(key, -np.inf)):
                self.best["best_test"][key] = self.sign * value
                per_key.update({f"{key}/probs": probs, f"{key}/labels": labels, f"{key}/round": rnd})

    def state_dict(self) -> dict:
        return {"best": self.best, "predictions": self.predictions}

    def load_state_dict(self, state: dict) -> None:
        self.best, self.predictions = state["best"], state["predictions"]
        if not isinstance(self.best.get("best_test"), dict):     # a checkpoint written before per-key tracking
            self.best = {"best_val": self.best.get("best_val", -np.inf), "best_test_round": self.best.get("best_test", -np.inf),
                         "best_test": {}}
            self.predictions = {k: v for k, v in self.predictions.items() if k != "best_test"} | (
                {"best_test_round": self.predictions["best_test"]} if "best_test" in self.predictions else {})
        for rule in TEST_RULES:         # never carry a test-set selection into a run that may not keep one
            if rule not in self.rules:
                self.predictions.pop(rule, None)
                self.best[rule] = {} if rule == "best_test" else -np.inf


def resolve_rule(rule: str, protocol: str) -> str:
    if rule == "auto":
        return "best_test" if protocol == "paper" else "best_val"
    return rule


def validation_key(selection: dict) -> str:
    """The eval key best_val maximises: ``val_mean`` or (``validation: pooled``) ``val_pooled``."""
    return "val_pooled" if selection.get("validation", "mean") == "pooled" else "val_mean"


def select(history: pd.DataFrame, rule: str, metric: str, k: int,
           val_key: str = "val_mean", round_on: str | None = None) -> tuple[dict[str, dict[str, float]], dict]:
    """-> (metrics per eval key under ``rule``, description of the choice).

    ``best_test`` takes each column's best value over rounds; ``best_test_round`` takes every column
    from the one round best on ``round_on`` (``<eval>/<metric>``, default ``global/<metric>``), e.g. a
    transferred model's column from the round selected on the source task."""
    evaluated = history.dropna(subset=["eval_s"]) if "eval_s" in history else history.iloc[0:0]
    if evaluated.empty:
        return {}, {"rule": rule, "note": "no evaluated round"}
    columns = [c for c in evaluated.columns if "/" in c]  # eval columns are "<eval>/<metric>"
    sign = -1.0 if metric in LOWER_IS_BETTER else 1.0
    info = {"rule": rule, "metric": metric}
    if rule == "best_val":
        key = f"{val_key}/{metric}"
        info["validation"] = val_key
        if key not in evaluated or evaluated[key].isna().all():
            rule, info["note"] = "last", "no validation data: fell back to the last round"
        else:
            pos = int(np.argmax(sign * evaluated[key].to_numpy()))
            row = evaluated.iloc[pos]
            info["round"] = int(row["round"])
            return _nest(row[columns]), info
    if rule == "last":
        row = evaluated.iloc[-1]
        info.update(rule="last", round=int(row["round"]))
        return _nest(row[columns]), info
    if rule == "best_test_round":
        key = round_on or f"global/{metric}"
        info.update(on=key, note="one round, the best on the test set itself (paper protocol), for every column")
        if key not in evaluated or evaluated[key].isna().all():
            info["note"] = f"no {key} in the history: no round to choose"
            return {}, info
        name = key.split("/", 1)[1]
        values = evaluated[key].to_numpy(dtype=float)
        pos = int(np.nanargmin(values) if name in LOWER_IS_BETTER else np.nanargmax(values))
        row = evaluated.iloc[pos]
        info["round"] = int(row["round"])
        return _nest(row[columns]), info
    if rule == "best_test":
        # what the authors reported: each column's best value over rounds, picked on the test data itself
        info["note"] = "best test score over rounds, selected on the test set (paper protocol)"
        best = {}
        for col in columns:
            values = evaluated[col].to_numpy(dtype=float)
            name = col.split("/", 1)[1]
            best[col] = np.nanmin(values) if name in LOWER_IS_BETTER else np.nanmax(values) if name != "n" else values[-1]
        return _nest(pd.Series(best)), info
    if rule == "last_k_mean":
        tail = evaluated.tail(k)
        info["rounds"] = [int(r) for r in tail["round"]]
        return _nest(tail[columns].mean()), info
    raise ValueError(f"unknown selection rule {rule!r}")


def _nest(row: pd.Series) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for col, value in row.items():
        key, name = col.split("/", 1)
        out.setdefault(key, {})[name] = float(value)
    return out
