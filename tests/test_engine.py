"""The round loop on a synthetic federation: determinism, communication accounting, selection, resume."""

import logging

import numpy as np
import pandas as pd
import pytest
import torch

from fedrepro.data.loader import FeatureSet
from fedrepro.fl.comm import CommLedger
from fedrepro.fl.engine import run_rounds
from fedrepro.fl.federation import ClientData, Federation
from fedrepro.fl.method import MethodContext
from fedrepro.fl.selection import select
from fedrepro.methods.centralized import Centralized
from fedrepro.methods.fedclip import FedCLIP

DIM, CLASSES = 8, 3


def synthetic_federation(n_clients=3, n=30, seed=0) -> Federation:
    gen = torch.Generator().manual_seed(seed)
    text = torch.randn(CLASSES, DIM, generator=gen)

    def make(count, offset):
        y = torch.arange(count) % CLASSES
        x = text[y] + 0.5 * torch.randn(count, DIM, generator=gen)
        return FeatureSet(x, y, np.arange(offset, offset + count))

    clients = [ClientData(f"client{i}", i, make(n, 1000 * i), make(6, 1000 * i + 500), make(6, 1000 * i + 600))
               for i in range(n_clients)]
    return Federation(clients, make(12, 9000), None, [f"c{i}" for i in range(CLASSES)], {"text_features": text})


def run_config(rounds=4, **train) -> dict:
    base = {
        "rounds": rounds, "batch_size": 8, "eval_batch_size": 64, "eval_every": 1, "num_workers": 0,
        "local": {"epochs": 1, "drop_last": False},
        "optimizer": {"name": "adam", "lr": 1e-2, "weight_decay": 0.0, "persist": True},
        "model": {"family": "clip_adapter", "logit_scale": 10.0},
        "aggregation": {"weights": "train_size"},
        "selection": {"rule": "best_val", "metric": "acc", "k": 2},
    }
    base.update(train)
    return {"paper": "t", "setting": "s", "method": "m", "seed": 0, "protocol": "clean", "config_hash": "abc",
            "train": base, "algorithm": {"name": "fedclip", "params": {}},
            "impl": {"model": "fedrepro.models.families:ClipAdapterFamily"}}


def run(method_cls, run_cfg, checkpoint, fed=None, checkpoint_every=0.0):
    fed = fed or synthetic_federation()
    ctx = MethodContext(run_cfg, fed, torch.device("cpu"), CommLedger(), logging.getLogger("test"))
    method = method_cls(ctx)
    return method, run_rounds(method, fed, run_cfg, checkpoint, checkpoint_every=checkpoint_every)


def eval_columns(history: pd.DataFrame) -> pd.DataFrame:
    return history[[c for c in history.columns if "/" in c or c == "loss"]]


def test_two_runs_are_identical_and_learn(tmp_path):
    _, a = run(FedCLIP, run_config(), tmp_path / "a.pt")
    _, b = run(FedCLIP, run_config(), tmp_path / "b.pt")
    pd.testing.assert_frame_equal(eval_columns(a.history), eval_columns(b.history))
    assert a.history["loss"].iloc[-1] < a.history["loss"].iloc[0]
    assert a.history["global/acc"].iloc[-1] > 1 / CLASSES


def test_fused_optimizer_steps_like_the_reference_one(tmp_path):
    """optimizer.fused (the default) uses torch's single-kernel update: the same arithmetic as the reference
    multi-tensor Adam up to float rounding."""
    from fedrepro.fl.local import make_optimizer

    fused_method, fused = run(FedCLIP, run_config(rounds=2, optimizer={**run_config()["train"]["optimizer"], "fused": True}),
                              tmp_path / "f.pt")
    plain_method, plain = run(FedCLIP, run_config(rounds=2), tmp_path / "p.pt")
    for key, value in fused_method.server.state_dict().items():
        assert torch.allclose(value, plain_method.server.state_dict()[key], atol=1e-5), key
    params = [torch.nn.Parameter(torch.zeros(3))]
    assert make_optimizer(params, {"name": "adam", "lr": 1e-3, "fused": True}).defaults["fused"]
    assert not make_optimizer(params, {"name": "adam", "lr": 1e-3}).defaults.get("fused")


def test_communication_is_the_adapter_both_ways(tmp_path):
    method, result = run(FedCLIP, run_config(rounds=2), tmp_path / "c.pt")
    adapter = sum(p.numel() for p in method.server.parameters())  # the adapter has no buffers
    assert (result.history["down_params"] == 3 * adapter).all()
    assert (result.history["up_params"] == 3 * adapter).all()
    assert (result.history["up_bytes"] == 4 * 3 * adapter).all()


def test_centralized_trains_one_pooled_participant(tmp_path):
    method, result = run(Centralized, run_config(rounds=1), tmp_path / "d.pt")
    assert [c.name for c in method.participants()] == ["pooled"]
    assert len(method.participants()[0].train) == 90
    assert "client2/acc" in result.history  # still evaluated per original client


def test_resume_after_a_crash_gives_the_same_result(tmp_path, monkeypatch):
    _, full = run(FedCLIP, run_config(rounds=4), tmp_path / "full.pt")
    ckpt = tmp_path / "crash.pt"
    original = FedCLIP.aggregate

    def crash_in_round_3(self, updates, rnd):
        if rnd == 2:
            raise KeyboardInterrupt("simulated kill")
        return original(self, updates, rnd)

    monkeypatch.setattr(FedCLIP, "aggregate", crash_in_round_3)
    with pytest.raises(KeyboardInterrupt):
        run(FedCLIP, run_config(rounds=4), ckpt)
    monkeypatch.setattr(FedCLIP, "aggregate", original)
    assert ckpt.exists()
    _, resumed = run(FedCLIP, run_config(rounds=4), ckpt)
    assert resumed.resumed_from == 2
    pd.testing.assert_frame_equal(eval_columns(full.history), eval_columns(resumed.history))


def saved_rounds(monkeypatch) -> list[int]:
    """The rounds after which the engine writes resume.pt (its ``next_round``), recorded as it writes them."""
    import fedrepro.fl.engine as engine

    written, save = [], engine.torch_save
    monkeypatch.setattr(engine, "torch_save", lambda path, state: (written.append(state["next_round"]), save(path, state)))
    return written


def test_checkpoints_follow_the_cadence_and_always_follow_the_last_round(tmp_path, monkeypatch):
    """0 s: after every round; an hour: rounds of milliseconds write resume.pt once, after the last round (a job
    killed while writing its outputs redoes no round); the numbers do not depend on the cadence."""
    written = saved_rounds(monkeypatch)
    _, every = run(FedCLIP, run_config(rounds=4), tmp_path / "every.pt", checkpoint_every=0)
    assert written == [1, 2, 3, 4]
    written.clear()
    _, hourly = run(FedCLIP, run_config(rounds=4), tmp_path / "hourly.pt", checkpoint_every=3600)
    assert written == [4]
    pd.testing.assert_frame_equal(eval_columns(every.history), eval_columns(hourly.history))


def test_a_kill_between_sparse_checkpoints_resumes_from_the_last_one(tmp_path, monkeypatch):
    """With a cadence longer than a round, a kill loses the rounds since the last write, never the numbers."""
    import fedrepro.fl.engine as engine

    _, full = run(FedCLIP, run_config(rounds=4), tmp_path / "full.pt")
    # the cadence's clock: the start, after round 1 (1 s: no write), after round 2 (6 s: written, then the write's
    # time), after round 3 (7 s: no write); round 4 is killed before its end
    clock = iter([0.0, 1.0, 6.0, 6.0, 7.0])
    monkeypatch.setattr(engine, "_clock", lambda: next(clock))
    original = FedCLIP.aggregate

    def crash_in_round_4(self, updates, rnd):
        if rnd == 3:
            raise KeyboardInterrupt("simulated kill")
        return original(self, updates, rnd)

    monkeypatch.setattr(FedCLIP, "aggregate", crash_in_round_4)
    ckpt = tmp_path / "sparse.pt"
    with pytest.raises(KeyboardInterrupt):
        run(FedCLIP, run_config(rounds=4), ckpt, checkpoint_every=5)
    monkeypatch.undo()
    assert torch.load(ckpt, weights_only=False)["next_round"] == 2      # round 3's state was never written
    _, resumed = run(FedCLIP, run_config(rounds=4), ckpt)
    assert resumed.resumed_from == 2
    pd.testing.assert_frame_equal(eval_columns(full.history), eval_columns(resumed.history))


def test_checkpoint_of_another_config_is_not_resumed(tmp_path):
    ckpt = tmp_path / "x.pt"
    run(FedCLIP, run_config(rounds=2), ckpt)
    other = run_config(rounds=2)
    other["config_hash"] = "different"
    _, result = run(FedCLIP, other, ckpt)
    assert result.resumed_from is None


def test_selection_rules_on_a_known_history():
    history = pd.DataFrame({
        "round": [1, 2, 3, 4], "eval_s": [0.1] * 4,
        "val_mean/acc": [0.2, 0.6, 0.5, 0.4],
        "global/acc": [0.3, 0.4, 0.9, 0.5],
        "global/ece": [0.3, 0.1, 0.2, 0.4],
    })
    best_val, info = select(history, "best_val", "acc", 2)
    assert info["round"] == 2 and best_val["global"]["acc"] == 0.4  # chosen on validation, not test
    best_test, info = select(history, "best_test", "acc", 2)
    assert best_test["global"]["acc"] == 0.9 and best_test["global"]["ece"] == 0.1
    assert "test set" in info["note"]
    last, _ = select(history, "last", "acc", 2)
    assert last["global"]["acc"] == 0.5
    tail, _ = select(history, "last_k_mean", "acc", 2)
    assert tail["global"]["acc"] == pytest.approx(0.7)
    no_val, info = select(history.drop(columns=["val_mean/acc"]), "best_val", "acc", 2)
    assert info["rule"] == "last" and "no validation" in info["note"]


def test_one_round_for_every_column_and_each_columns_best():
    # FACMIC Table 5: the transferred model's column (external) comes from the round chosen on the source
    # task (global), not from the round that is best on the external set itself
    history = pd.DataFrame({
        "round": [1, 2, 3], "eval_s": [0.1] * 3,
        "global/acc": [0.5, 0.8, 0.6], "global/bacc": [0.4, 0.5, 0.7],
        "external/acc": [0.9, 0.3, 0.4], "global/ece": [0.2, 0.3, 0.1],
    })
    per_column, _ = select(history, "best_test", "acc", 2)
    assert per_column["external"]["acc"] == 0.9 and per_column["global"]["bacc"] == 0.7
    one_round, info = select(history, "best_test_round", "acc", 2)
    assert info["round"] == 2 and info["on"] == "global/acc"
    assert one_round["external"]["acc"] == 0.3 and one_round["global"]["bacc"] == 0.5
    on_bacc, info = select(history, "best_test_round", "acc", 2, round_on="global/bacc")
    assert info["round"] == 3 and on_bacc["external"]["acc"] == 0.4
    on_ece, info = select(history, "best_test_round", "acc", 2, round_on="global/ece")     # lower is better
    assert info["round"] == 3


def test_tracker_keeps_each_eval_sets_best_round_and_the_one_best_global_round():
    from fedrepro.fl.selection import PredictionTracker

    tracker = PredictionTracker("acc")
    p = {r: np.full((2, 2), r, dtype=float) for r in (1, 2)}
    y = np.array([0, 1])
    tracker.update(1, {"global/acc": 0.5, "client0/acc": 0.9}, {"global": (p[1], y), "client0": (p[1], y)})
    tracker.update(2, {"global/acc": 0.7, "client0/acc": 0.4}, {"global": (p[2], y), "client0": (p[2], y)})
    # FAA-CLIP's code writes a client's curves when that client's accuracy improves
    assert tracker.predictions["best_test"]["client0/round"] == 1 and tracker.predictions["best_test"]["global/round"] == 2
    assert tracker.predictions["best_test"]["client0/probs"][0, 0] == 1
    assert tracker.predictions["best_test_round"]["round"] == 2
    assert tracker.predictions["best_test_round"]["client0/probs"][0, 0] == 2


def test_tracker_resumes_from_a_checkpoint_without_per_key_bests():
    from fedrepro.fl.selection import PredictionTracker

    old = {"best": {"best_val": 0.5, "best_test": 0.7}, "predictions": {"best_test": {"round": 3, "global/probs": np.ones((1, 2))}}}
    tracker = PredictionTracker("acc")
    tracker.load_state_dict(old)
    assert tracker.best["best_test_round"] == 0.7 and tracker.predictions["best_test_round"]["round"] == 3
    tracker.update(4, {"global/acc": 0.6}, {"global": (np.zeros((1, 2)), np.array([0]))})
    assert tracker.predictions["best_test"]["global/round"] == 4 and tracker.predictions["best_test_round"]["round"] == 3
