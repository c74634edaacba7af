"""Per-client state kept on disk between a client's turns (fedrepro.fl.client_state): one file per client,
resume.pt references them, a round rewrites only the files of clients that trained, state of a round
that was never committed is ignored, and at most one client's optimizer state is held in memory."""

from __future__ import annotations

import logging
import weakref

import pandas as pd
import pytest
import torch

from fedrepro.fl.client_state import INDEX_KEY, ClientStates, MissingClientState, state_bytes
from fedrepro.fl.comm import CommLedger
from fedrepro.fl.engine import run_rounds
from fedrepro.fl.method import MethodContext
from fedrepro.methods.fedclip import FedCLIP
from test_engine import eval_columns, run_config, synthetic_federation

pytestmark = pytest.mark.usefixtures("one_thread")


def drive(run, checkpoint, state_dir, cls=FedCLIP, fed=None, method_hook=None):
    fed = fed or synthetic_federation(n_clients=4)
    ctx = MethodContext(run, fed, torch.device("cpu"), CommLedger(), logging.getLogger("test"), state_dir=state_dir)
    method = cls(ctx)
    if method_hook:
        method_hook(method)
    return method, run_rounds(method, fed, run, checkpoint)


def disk_run(rounds=4, **train):
    return run_config(rounds=rounds, client_state="disk", **train)


# ---- the store ----------------------------------------------------------------------------------

def test_store_modes_and_versioned_files(tmp_path):
    small, large = {"w": torch.zeros(4)}, {"w": torch.zeros(2**20)}        # 16 B and 4 MiB
    assert state_bytes(large) == 4 * 2**20 and state_bytes({"a": large["w"], "b": large["w"]}) == 4 * 2**20
    memory = ClientStates("m", "memory", tmp_path, num_clients=100)
    memory["c0"] = large
    assert memory.resident() == 1 and not (tmp_path / "m").exists()
    auto = ClientStates("a", "auto", tmp_path, num_clients=100)           # 100 x 4 MiB > 256 MiB: to disk
    auto["c0"], auto["c1"] = large, small                                  # 100 x 16 B: stays in memory
    assert auto.resident() == 1 and set(auto.files) == {"c0"}
    assert torch.equal(auto["c0"]["w"], large["w"]) and auto["c0"] is not large

    disk = ClientStates("d", "disk", tmp_path, num_clients=2)
    disk.round = 3
    disk["c0"] = small
    first = disk.files["c0"]
    assert first.startswith("c0.r3.") and (tmp_path / "d" / first).exists()
    disk["c0"] = {"w": torch.ones(4)}                  # a new file; the committed one stays until the next commit
    assert disk.files["c0"] != first and (tmp_path / "d" / first).exists()
    assert torch.equal(disk["c0"]["w"], torch.ones(4))
    index = disk.state_dict()
    assert index == {INDEX_KEY: {"c0": disk.files["c0"]}}
    disk.committed()
    assert sorted(p.name for p in (tmp_path / "d").iterdir()) == [disk.files["c0"]]
    assert "c0" in disk and "c1" not in disk and disk.get("c1") is None and list(disk) == ["c0"]


def test_resume_adopts_the_committed_index_and_drops_uncommitted_files(tmp_path):
    store = ClientStates("opt", "disk", tmp_path, num_clients=2)
    store["c0"], store["c1"] = {"v": torch.zeros(3)}, {"v": torch.ones(3)}
    committed = store.state_dict()
    store.committed()
    store["c0"] = {"v": torch.full((3,), 7.0)}         # written in a round that is then killed
    uncommitted = store.files["c0"]

    fresh = ClientStates("opt", "disk", tmp_path, num_clients=2)   # the restarted job
    fresh["c0"] = {"v": torch.full((3,), 9.0)}                      # its set-up writes before loading
    fresh.load_state_dict(committed)
    assert torch.equal(fresh["c0"]["v"], torch.zeros(3)) and torch.equal(fresh["c1"]["v"], torch.ones(3))
    names = {p.name for p in (tmp_path / "opt").iterdir()}
    assert names == set(committed[INDEX_KEY].values()) and uncommitted not in names

    (tmp_path / "opt" / committed[INDEX_KEY]["c1"]).unlink()
    with pytest.raises(MissingClientState, match="delete"):
        ClientStates("opt", "disk", tmp_path, num_clients=2).load_state_dict(committed)


# ---- through the engine -------------------------------------------------------------------------

def test_disk_and_memory_runs_are_bit_identical(tmp_path):
    _, memory = drive(run_config(rounds=3, client_state="memory"), tmp_path / "m.pt", tmp_path / "m")
    method, disk = drive(disk_run(rounds=3), tmp_path / "d.pt", tmp_path / "d")
    pd.testing.assert_frame_equal(eval_columns(memory.history), eval_columns(disk.history))
    assert method.optimizer_states.resident() == 0 and len(method.optimizer_states.files) == 4
    saved = torch.load(tmp_path / "d.pt", weights_only=False)["method"]["optimizer"]
    assert set(saved) == {INDEX_KEY}                   # resume.pt names the files instead of holding the states
    assert sorted(p.name for p in (tmp_path / "d/optimizer").iterdir()) == sorted(saved[INDEX_KEY].values())


def test_at_most_one_clients_optimizer_state_is_held_in_memory(tmp_path, monkeypatch):
    """Every optimizer-state tensor that goes into or out of the store is tracked by client; at every
    client's start of training and after every update, the clients with a live one are counted."""
    def peak(mode: str) -> int:
        live: list[tuple[str, weakref.ref]] = []
        get, put = ClientStates.__getitem__, ClientStates.__setitem__

        def track(client, value):
            for entry in (value.get("state") or {}).values() if isinstance(value, dict) else []:
                live.extend((client, weakref.ref(t)) for t in entry.values() if isinstance(t, torch.Tensor) and t.dim())

        def tracked_get(self, client):
            value = get(self, client)
            if self.name == "optimizer":
                track(client, value)
            return value

        def tracked_put(self, client, value):
            if self.name == "optimizer":
                track(client, value)
            put(self, client, value)

        counts = []

        def count():        # no gc.collect(): what is freed must be freed by reference counting, at once
            counts.append(len({client for client, ref in live if ref() is not None}))

        class Counted(FedCLIP):
            def before_local_training(self, client, rnd):
                super().before_local_training(client, rnd)
                count()

            def local_update(self, client, message, rnd):
                update = super().local_update(client, message, rnd)
                count()
                return update

        with monkeypatch.context() as mp:
            mp.setattr(ClientStates, "__getitem__", tracked_get)
            mp.setattr(ClientStates, "__setitem__", tracked_put)
            drive(run_config(rounds=2, client_state=mode), tmp_path / f"{mode}.pt", tmp_path / mode, Counted)
        return max(counts)

    assert peak("disk") == 1
    assert peak("memory") == 4                         # the control: every client's state stays resident


class Alternating(FedCLIP):
    """Clients 0 and 2 train in even rounds, 1 and 3 in odd ones."""

    def participants(self):
        return [c for c in self.fed.clients if c.index % 2 == max(self.round, 0) % 2]


def test_a_round_rewrites_only_the_files_of_clients_that_trained(tmp_path, monkeypatch):
    snapshots = []

    def snapshot(method):
        original = method.checkpoint_committed

        def committed():
            original()
            folder = tmp_path / "s/optimizer"
            snapshots.append({p.name.split(".")[0]: (p.name, p.stat().st_mtime_ns) for p in folder.iterdir()})

        method.checkpoint_committed = committed

    drive(disk_run(rounds=4), tmp_path / "s.pt", tmp_path / "s", Alternating, method_hook=snapshot)
    assert set(snapshots[0]) == {"client0", "client2"}
    assert set(snapshots[1]) == {"client0", "client1", "client2", "client3"}
    for rnd in range(1, 4):
        before, after = snapshots[rnd - 1], snapshots[rnd]
        changed = {c for c in after if after[c] != before.get(c)}
        assert changed == ({"client1", "client3"} if rnd % 2 else {"client0", "client2"}), rnd
        assert all(after[c] == before[c] for c in before if c not in changed)       # untouched files


def test_a_kill_mid_round_resumes_bit_identical_and_ignores_the_uncommitted_files(tmp_path, monkeypatch):
    run = disk_run(rounds=4, client_eval="local")      # optimizer states and every client's local model on disk
    full_method, full = drive(run, tmp_path / "full.pt", tmp_path / "full")
    original = FedCLIP.local_update

    def killed(self, client, message, rnd):
        if rnd == 2 and client.index == 2:             # clients 0 and 1 of round 3 already wrote their files
            raise KeyboardInterrupt("simulated kill")
        return original(self, client, message, rnd)

    monkeypatch.setattr(FedCLIP, "local_update", killed)
    with pytest.raises(KeyboardInterrupt):
        drive(run, tmp_path / "killed.pt", tmp_path / "killed")
    monkeypatch.setattr(FedCLIP, "local_update", original)
    committed = torch.load(tmp_path / "killed.pt", weights_only=False)
    assert committed["next_round"] == 2
    index = committed["method"]["optimizer"][INDEX_KEY]
    on_disk = {p.name for p in (tmp_path / "killed/optimizer").iterdir()}
    uncommitted = on_disk - set(index.values())
    assert {name.split(".")[0] for name in uncommitted} == {"client0", "client1"}
    assert all(".r2." in name for name in uncommitted)

    method, resumed = drive(run, tmp_path / "killed.pt", tmp_path / "killed")
    assert resumed.resumed_from == 2
    pd.testing.assert_frame_equal(eval_columns(full.history), eval_columns(resumed.history))
    for key, value in full_method.server.state_dict().items():
        assert torch.equal(method.server.state_dict()[key], value), key
    for client in full_method.optimizer_states:
        a, b = full_method.optimizer_states[client]["state"], method.optimizer_states[client]["state"]
        assert all(torch.equal(a[i][k], b[i][k]) for i in a for k in ("exp_avg", "exp_avg_sq"))
    assert not uncommitted & {p.name for p in (tmp_path / "killed/optimizer").iterdir()}
