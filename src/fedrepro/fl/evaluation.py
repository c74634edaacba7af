"""Scoring a method's models each evaluated round: which model answers for which data, and the metrics.

What a model family is for decides how it is scored (``family.task``): ``classification`` (class
probabilities on every client's test and validation split and the global test set; ACC, BACC, F1,
AUC, ECE) or ``retrieval`` (image-text retrieval on every client's held-out pairs; Recall@1/@5 and the
paired embeddings' cosine similarity). The metric functions are :mod:`fedrepro.metrics`; the model side
of retrieval (embedding a dataset, ranking within pools) is the family's.
"""

from __future__ import annotations

import numpy as np
import torch

from ..metrics import classification_metrics
from .federation import Federation

METRICS = ("acc", "bacc", "f1", "auc", "ece")
RETRIEVAL_METRICS = ("recall@1", "recall@5", "cos_sim")
EVAL_SPLITS = (("", "test"), (".val", "val"))
# what each task reports per eval set ("n": how many examples were scored)
TASK_METRICS = {"classification": (*METRICS, "n"), "retrieval": (*RETRIEVAL_METRICS, "n")}


def eval_keys(task: str, clients: list[str], prefixes: list[str] = ()) -> list[str]:
    """Every eval key a run of ``task`` over ``clients`` may report (keys of personalized models
    included), with the extra keys a method adds under ``prefixes``: what a table may name."""
    if task == "retrieval":
        pairs = [f"{owner}@{data}" for owner in clients for data in clients]
        per_client = clients + pairs
        keys = ["global", "clients_mean", "clients_worst", "clients_disparity", "val_mean"]
        keys += [f"{key}{suffix}" for key in per_client for suffix, _ in EVAL_SPLITS]
        keys += [f"{prefix}{key}{suffix}" for prefix in prefixes for key in per_client for suffix, _ in EVAL_SPLITS]
        return keys
    keys = ["global", "external", "clients_mean", "val_mean", "val_pooled"]
    for client in clients:
        keys += [client, f"{client}.val", f"{client}@global", f"{client}@external",
                 f"upto_{client}@global", f"upto_{client}@external"]
    return keys


def evaluate(method, fed: Federation) -> tuple[dict, dict]:
    """-> (flat metrics ``{"<eval>/<metric>": value}``, predictions ``{"<eval>": (probs, labels)}``)."""
    task = getattr(method.family, "task", "classification") if hasattr(method, "family") else "classification"
    if task == "retrieval":
        return evaluate_retrieval(method, fed)
    return evaluate_classification(method, fed)


# --------------------------------------------------------------------------------------------
# classification

def dataset_labels(dataset) -> np.ndarray:
    labels = dataset.labels
    return labels.numpy() if isinstance(labels, torch.Tensor) else np.asarray(labels)


def evaluate_classification(method, fed: Federation, with_val: bool = True) -> tuple[dict, dict]:
    """-> (flat metrics {"<eval>/<metric>": value}, predictions {"<eval>": (probs, labels)}).

    Eval keys: ``<client>`` = that client's test split with the model used for it (the global model
    unless the method is personalized), ``<client>.val`` = its validation split, ``global`` = the
    global test set with the global model, ``<client>@global`` = a personalized client model on the
    global test set, ``external`` / ``<client>@external`` = the same on the external evaluation set
    (if the split has one), ``clients_mean`` / ``val_mean`` = unweighted means over clients, and
    ``val_pooled`` = the metrics of every client's validation predictions pooled.

    ``upto_<client>@global`` / ``@external`` (personalized): the predictions of the first clients' models,
    up to and including this one, pooled - what FedAdapterProto's test loop reports as "client k"
    (berenslab/FedAdapterProto ``lib/update.py::test_inference_new_het_lt`` never resets its counters).
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

    def pooled_metrics(key: str, parts: list) -> None:
        if parts:
            probs, labels = np.concatenate([p for p, _ in parts]), np.concatenate([y for _, y in parts])
            metrics.update({f"{key}/{k}": v for k, v in classification_metrics(labels, probs).items()})

    pooled_metrics("val_pooled", [preds[f"{c.name}.val"] for c in fed.clients if f"{c.name}.val" in preds])
    if method.personalized:
        for where in ("global", "external"):
            answered = [c.name for c in fed.clients if f"{c.name}@{where}" in preds]
            for k, name in enumerate(answered):
                pooled_metrics(f"upto_{name}@{where}", [preds[f"{n}@{where}"] for n in answered[:k + 1]])
    for mean_key, suffix in (("clients_mean", ""), ("val_mean", ".val")):
        for m in METRICS:
            values = [metrics[f"{c.name}{suffix}/{m}"] for c in fed.clients if f"{c.name}{suffix}/{m}" in metrics]
            if values:
                metrics[f"{mean_key}/{m}"] = float(np.nanmean(values)) if not np.all(np.isnan(values)) else float("nan")
    return metrics, preds


# --------------------------------------------------------------------------------------------
# image-text retrieval (FedDRA and its baselines)

def evaluate_retrieval(method, fed) -> tuple[dict, dict]:
    """Retrieval on every client's test (and validation) split. A personalized method (e.g.
    decentralized training) is scored with every client's model on every client's split,
    ``<model client>@<data client>``; a client's score is then the mean over the models, as the
    paper reports local training ("Local.avg")."""
    metrics: dict[str, float] = {}
    names = [c.name for c in fed.clients]
    if method.personalized:
        for owner in fed.clients:
            model = method.model_for(owner)
            metrics.update(client_scores(method, model, fed, lambda c, o=owner: f"{o.name}@{c.name}"))
        metrics.update(mean_over_models(metrics, names, names, suffixes=eval_splits(method.family)))
    else:
        model = method.model_for(None)
        metrics.update(client_scores(method, model, fed, lambda c: c.name))
        if fed.global_test is not None and len(fed.global_test):
            bs, workers = method.ctx.train["eval_batch_size"], method.ctx.train.get("num_workers", 0)
            scores = method.family.retrieval_scores(*method.family.embed_dataset(model, fed.global_test, bs, method.device, workers))
            metrics.update({f"global/{name}": value for name, value in scores.items()})
    metrics.update(summarise_clients(metrics, names))
    return metrics, {}


def eval_splits(family) -> tuple[tuple[str, str], ...]:
    """(eval-key suffix, client split) pairs retrieval scores: the family's (e.g. the authors' protocol
    reports the validation split), by default the test split as ``<client>`` and ``<client>.val``."""
    return getattr(family, "eval_splits", EVAL_SPLITS)


def client_scores(method, model, fed, key) -> dict[str, float]:
    """Retrieval scores of ``model`` on every client's test and validation split, ``key(client) + suffix``."""
    bs, workers, device = method.ctx.train["eval_batch_size"], method.ctx.train.get("num_workers", 0), method.device
    metrics = {}
    for client in fed.clients:
        for suffix, part in eval_splits(method.family):
            data = getattr(client, part)
            if data is None or len(data) == 0:
                continue
            scores = method.family.retrieval_scores(*method.family.embed_dataset(model, data, bs, device, workers))
            metrics.update({f"{key(client)}{suffix}/{name}": value for name, value in scores.items()})
    return metrics


def mean_over_models(metrics: dict, owners: list[str], clients: list[str], prefix: str = "",
                     suffixes=EVAL_SPLITS) -> dict[str, float]:
    """A data client's score = the mean over the models (``<prefix><owner>@<client>``), as the
    paper reports local training ("Local.avg")."""
    out = {}
    for client in clients:
        for suffix, _ in suffixes:
            for name in RETRIEVAL_METRICS:
                values = [metrics.get(f"{prefix}{o}@{client}{suffix}/{name}") for o in owners]
                if all(v is not None for v in values):
                    out[f"{prefix}{client}{suffix}/{name}"] = float(np.mean(values))
    return out


def score_models(method, fed, states: dict[str, dict], prefix: str) -> dict[str, float]:
    """Retrieval of extra client models (``states``: owner -> state dict, loaded into the method's
    working model) on every client's split, ``<prefix><owner>@<client>`` and the mean over the
    models ``<prefix><client>``."""
    metrics: dict[str, float] = {}
    for owner, state in states.items():
        method.work.load_state_dict({k: v.to(method.device) for k, v in state.items()})
        metrics.update(client_scores(method, method.work, fed, lambda c, o=owner: f"{prefix}{o}@{c.name}"))
    metrics.update(mean_over_models(metrics, list(states), [c.name for c in fed.clients], prefix,
                                    eval_splits(method.family)))
    return metrics


def summarise_clients(metrics: dict, clients: list[str]) -> dict[str, float]:
    """``clients_mean`` (Rec.), ``clients_worst`` (Wst.) and ``clients_disparity`` (std across
    clients) of the test scores, and ``val_mean`` of the validation scores (model selection)."""
    out = {}
    for name in RETRIEVAL_METRICS:
        test = [metrics[f"{c}/{name}"] for c in clients if f"{c}/{name}" in metrics]
        val = [metrics[f"{c}.val/{name}"] for c in clients if f"{c}.val/{name}" in metrics]
        if test:
            out[f"clients_mean/{name}"] = float(np.mean(test))
            out[f"clients_worst/{name}"] = float(np.min(test))
            out[f"clients_disparity/{name}"] = float(np.std(test))
        if val:
            out[f"val_mean/{name}"] = float(np.mean(val))
    return out
