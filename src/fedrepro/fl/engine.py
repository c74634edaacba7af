"""The round loop. It knows no method: broadcast -> local updates (clients in sorted order) ->
aggregate -> evaluate -> log -> checkpoint, until the configured number of rounds.

Resume: after a round (every round, or once ``checkpoint_every`` seconds have passed since the last write, and after
the last round) the method state, the history and the tracked predictions go to ``resume.pt`` (atomic write); per-client state kept on disk (:mod:`fedrepro.fl.client_state`) is
referenced from it by file name, and only the files of clients whose state changed are written. A job that is killed and started again continues after the last
finished round; since every random stream is keyed by (seed, purpose, round, client), the resumed
run produces the same numbers as an uninterrupted one. A ``resume.pt`` that cannot be read or whose bytes changed
since it was written (truncated, corrupt: every member's CRC-32 is checked), or one naming a per-client state file
that is missing or changed, is set aside as ``resume.pt.corrupt`` and the run starts again from its beginning, with
a warning: it never resumes from numbers it did not compute.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import pandas as pd
import torch

from ..io import archive_damage, set_aside, torch_save
from ..seeding import seed_global
from .client_state import ClientStateError
from .federation import Federation
from .method import FederatedMethod
from .selection import PredictionTracker, allowed_rules, opted_in, validation_key


@dataclass
class RunResult:
    history: pd.DataFrame
    predictions: dict[str, dict[str, np.ndarray]]   # rule -> {"<eval>/probs", "<eval>/labels", ...}
    comm: dict
    resumed_from: int | None


def run_rounds(method: FederatedMethod, fed: Federation, run: dict, checkpoint: Path,
               log: logging.Logger | None = None, checkpoint_every: float = 0.0, *,
               observe: Callable | None = None) -> RunResult:
    """``checkpoint_every``: seconds of work a kill may cost at most; ``resume.pt`` is written after a round once that
    long has passed since the last write, and after the last round (0: after every round). Resuming gives the same
    numbers from any round, so the cadence trades only repeated work against the time of writing the state.
    ``observe(rnd, updates, row, method)``, if given, is called after every round with the clients' updates and
    the round's history row (a parity comparison reads them; ``fedrepro.parity``)."""
    log = log or logging.getLogger("fedrepro.train")
    train = run["train"]
    rounds, eval_every, seed = train["rounds"], train["eval_every"], run["seed"]
    tracker = PredictionTracker(train["selection"]["metric"], validation_key(train["selection"]),
                                allowed_rules(run["protocol"], opted_in(train)))
    history: list[dict] = []
    start, resumed_from = 0, None

    phases = method.ctx.phases
    with phases("model build"):
        method.setup()
    state = read_checkpoint(checkpoint, log) if checkpoint.exists() else None
    if state is not None and state.get("config_hash") == run["config_hash"]:
        try:
            method.verify_checkpoint(state["method"])       # the per-client state files it names: there and intact
        except ClientStateError as error:
            start_over(checkpoint, str(error), log)
            state = None
    if state is not None:
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
    last_written = _clock()
    for rnd in range(start, rounds):
        t0 = time.perf_counter()
        method.start_round(rnd)
        message = method.broadcast(rnd)
        updates = []
        for client in method.participants():
            seed_global(seed, "local", rnd, client.index)
            method.ctx.comm.record(rnd, "down", message)
            with phases("local training"):
                update = method.local_update(client, message, rnd)
            method.ctx.comm.record(rnd, "up", update.payload)
            updates.append(update)
        seed_global(seed, "server", rnd)
        with phases("aggregation"):
            method.aggregate(updates, rnd)
        train_s = time.perf_counter() - t0

        row = {"round": rnd + 1, "train_s": train_s, **method.ctx.comm.round_totals(rnd)}
        weights = np.array([u.num_examples for u in updates], dtype=float)
        losses = np.array([u.stats.get("loss", np.nan) for u in updates], dtype=float)
        row["loss"] = float(np.average(losses, weights=weights)) if weights.sum() and not np.isnan(losses).all() else float("nan")
        if (rnd + 1) % eval_every == 0 or rnd + 1 == rounds:
            t1 = time.perf_counter()
            with phases("evaluation"), method.autocast():
                metrics, preds = method.evaluate(fed)
            row["eval_s"] = time.perf_counter() - t1
            row.update(metrics)
            tracker.update(rnd + 1, metrics, preds)
        history.append(row)
        if observe is not None:
            observe(rnd, updates, row, method)
        log.info("[%s] round %d/%d  loss %.4f  global acc %s  val acc %s  %.1fs/round  %.2f MB sent",
                 tag, rnd + 1, rounds, row["loss"], _fmt(row.get("global/acc")), _fmt(row.get("val_mean/acc")),
                 train_s, (row["down_bytes"] + row["up_bytes"]) / 1e6)
        # after the last round too: a job killed while writing its outputs redoes no round
        if rnd + 1 < rounds and _clock() - last_written < checkpoint_every:
            continue
        with phases("checkpoint"):
            torch_save(checkpoint, {
                "config_hash": run["config_hash"], "next_round": rnd + 1, "history": history,
                "method": method.state_dict(), "comm": method.ctx.comm.state_dict(), "tracker": tracker.state_dict(),
            })
            method.checkpoint_committed()         # per-client state files the checkpoint no longer names go
        last_written = _clock()

    return RunResult(pd.DataFrame(history), tracker.predictions, method.ctx.comm.state_dict(), resumed_from)


_clock = time.monotonic          # the checkpoint cadence's clock (a test replaces it)


CHECKPOINT_KEYS = ("config_hash", "next_round", "history", "method", "comm", "tracker")


def read_checkpoint(checkpoint: Path, log: logging.Logger) -> dict | None:
    """The state in ``resume.pt``, or None when the file cannot be read or is not what was written (truncated,
    corrupt, a byte changed: its CRC-32s are checked before it is loaded, :func:`fedrepro.io.archive_damage`): it
    is then set aside (kept, renamed ``resume.pt.corrupt``) and the run starts again from its beginning, the last
    state known good, instead of failing every retry or resuming from numbers that were never computed."""
    problem = archive_damage(checkpoint)
    if problem is None:
        try:
            state = torch.load(checkpoint, map_location="cpu", weights_only=False)
            missing = [k for k in CHECKPOINT_KEYS if k not in state] if isinstance(state, dict) else list(CHECKPOINT_KEYS)
            if not missing:
                return state
            problem = f"it lacks {missing}"
        except Exception as error:  # noqa: BLE001 - whatever torch or pickle raise, the file is unusable
            problem = f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
    start_over(checkpoint, f"{checkpoint} cannot be used ({problem})", log)
    return None


def start_over(checkpoint: Path, why: str, log: logging.Logger) -> None:
    aside = set_aside(checkpoint, "corrupt")
    log.warning("%s; set aside as %s. The run starts again from round 1.", why, aside)


def _fmt(value) -> str:
    return "-" if value is None or (isinstance(value, float) and np.isnan(value)) else f"{value:.4f}"
