"""The round loop. It knows no method: broadcast -> local updates (clients in sorted order) ->
aggregate -> evaluate -> log -> checkpoint, until the configured number of rounds.

Resume: after every round the method state, the history and the tracked predictions go to
``resume.pt`` (atomic write). A job that is killed and started again continues after the last
finished round; since every random stream is keyed by (seed, purpose, round, client), the resumed
run produces the same numbers as an uninterrupted one.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from ..io import torch_save
from ..metrics import classification_metrics
from ..seeding import seed_global
from .federation import Federation
from .method import FederatedMethod

METRICS = ("acc", "bacc", "f1", "auc", "ece")
LOWER_IS_BETTER = {"ece", "loss"}


@dataclass
class RunResult:
    history: pd.DataFrame
    predictions: dict[str, dict[str, np.ndarray]]   # rule -> {"<eval>/probs", "<eval>/labels", ...}
    comm: dict
    resumed_from: int | None


def dataset_labels(dataset) -> np.ndarray:
    labels = dataset.labels
    return labels.numpy() if isinstance(labels, torch.Tensor) else np.asarray(labels)


def evaluate_classification(method: FederatedMethod, fed: Federation, with_val: bool = True) -> tuple[dict, dict]:
    """-> (flat metrics {"<eval>/<metric>": value}, predictions {"<eval>": (probs, labels)}).

    Eval keys: ``<client>`` = that client's test split with the model used for it (the global model
    unless the method is personalized), ``<client>.val`` = its validation split, ``global`` = the
    global test set with the global model, ``<client>@global`` = a personalized client model on the
    global test set, ``external`` / ``<client>@external`` = the same on the external evaluation set
    (if the split has one), ``clients_mean`` / ``val_mean`` = unweighted means over clients, and
    ``val_pooled`` = the metrics of every client's validation predictions pooled.
    """
    metrics, preds = {}, {}

    def score(key, dataset, client):
        if dataset is None or len(dataset) == 0:
            return
        probs = method.predict(dataset, client)
        labels = dataset_labels(dataset)
        preds[key] = (probs, labels)
        for name, value in classification_metrics(labels, probs).items():
            metrics[f"{key}/{name}"] = value

    for client in fed.clients:
        score(client.name, client.test, client)
        if with_val:
            score(f"{client.name}.val", client.val, client)
        if method.personalized:
            score(f"{client.name}@global", fed.global_test, client)
            score(f"{client.name}@external", fed.external, client)
    score("global", fed.global_test, None)
    score("external", fed.external, None)
    pooled = [preds[f"{c.name}.val"] for c in fed.clients if f"{c.name}.val" in preds]
    if pooled:
        probs, labels = np.concatenate([p for p, _ in pooled]), np.concatenate([y for _, y in pooled])
        metrics.update({f"val_pooled/{k}": v for k, v in classification_metrics(labels, probs).items()})
    for mean_key, suffix in (("clients_mean", ""), ("val_mean", ".val")):
        for m in METRICS:
            values = [metrics[f"{c.name}{suffix}/{m}"] for c in fed.clients if f"{c.name}{suffix}/{m}" in metrics]
            if values:
                metrics[f"{mean_key}/{m}"] = float(np.nanmean(values)) if not np.all(np.isnan(values)) else float("nan")
    return metrics, preds


class PredictionTracker:
    """Keeps the predictions of the rounds a selection rule may pick: ``last``; ``best_val`` (the round
    best on validation); and, for the paper protocol, ``best_test`` (each eval key's predictions at the
    round where *that* key's metric is best: FAA-CLIP's code writes a client's ROC and decision-curve
    arrays whenever that client's test accuracy improves) and ``best_test_round`` (every key at the one
    round best on the global test set, ``global/<metric>``)."""

    def __init__(self, metric: str, val_key: str = "val_mean"):
        self.metric, self.val_key = metric, val_key
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
            if self._better(value, self.best[rule]):
                self.best[rule] = self.sign * value
                self.predictions[rule] = packed
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


def run_rounds(method: FederatedMethod, fed: Federation, run: dict, checkpoint: Path,
               log: logging.Logger | None = None) -> RunResult:
    log = log or logging.getLogger("fedrepro.train")
    train = run["train"]
    rounds, eval_every, seed = train["rounds"], train["eval_every"], run["seed"]
    tracker = PredictionTracker(train["selection"]["metric"], validation_key(train["selection"]))
    history: list[dict] = []
    start, resumed_from = 0, None

    method.setup()
    if checkpoint.exists():
        state = torch.load(checkpoint, map_location="cpu", weights_only=False)
        if state.get("config_hash") == run["config_hash"]:
            method.load_state_dict(state["method"])
            method.ctx.comm.load_state_dict(state["comm"])
            tracker.load_state_dict(state["tracker"])
            history, start = state["history"], state["next_round"]
            resumed_from = start
            log.info("resuming from %s after round %d of %d", checkpoint, start, rounds)
        else:
            log.warning("ignoring %s: it belongs to another configuration (hash %s, this run %s)",
                        checkpoint, state.get("config_hash"), run["config_hash"])

    tag = f"{run['paper']}/{run['setting']}/{run['method']}/seed{seed}"
    for rnd in range(start, rounds):
        t0 = time.perf_counter()
        message = method.broadcast(rnd)
        updates = []
        for client in method.participants():
            seed_global(seed, "local", rnd, client.index)
            method.ctx.comm.record(rnd, "down", message)
            update = method.local_update(client, message, rnd)
            method.ctx.comm.record(rnd, "up", update.payload)
            updates.append(update)
        seed_global(seed, "server", rnd)
        method.aggregate(updates, rnd)
        train_s = time.perf_counter() - t0

        row = {"round": rnd + 1, "train_s": train_s, **method.ctx.comm.round_totals(rnd)}
        weights = np.array([u.num_examples for u in updates], dtype=float)
        losses = np.array([u.stats.get("loss", np.nan) for u in updates], dtype=float)
        row["loss"] = float(np.average(losses, weights=weights)) if weights.sum() and not np.isnan(losses).all() else float("nan")
        if (rnd + 1) % eval_every == 0 or rnd + 1 == rounds:
            t1 = time.perf_counter()
            metrics, preds = method.evaluate(fed)
            row["eval_s"] = time.perf_counter() - t1
            row.update(metrics)
            tracker.update(rnd + 1, metrics, preds)
        history.append(row)
        log.info("[%s] round %d/%d  loss %.4f  global acc %s  val acc %s  %.1fs/round  %.2f MB sent",
                 tag, rnd + 1, rounds, row["loss"], _fmt(row.get("global/acc")), _fmt(row.get("val_mean/acc")),
                 train_s, (row["down_bytes"] + row["up_bytes"]) / 1e6)
        torch_save(checkpoint, {
            "config_hash": run["config_hash"], "next_round": rnd + 1, "history": history,
            "method": method.state_dict(), "comm": method.ctx.comm.state_dict(), "tracker": tracker.state_dict(),
        })

    return RunResult(pd.DataFrame(history), tracker.predictions, method.ctx.comm.state_dict(), resumed_from)


def _fmt(value) -> str:
    return "-" if value is None or (isinstance(value, float) and np.isnan(value)) else f"{value:.4f}"


# --------------------------------------------------------------------------------------------
# model selection

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
