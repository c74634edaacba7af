"""Run the FedIIC authors' unmodified training script (wnn2000/FedIIC ``train_FedIIC.py``) and record, from the
outside, everything a replay needs and everything a comparison reads.

This file runs in the *authors'* Python environment (torch, efficientnet_pytorch, pretrainedmodels, tensorboardX,
pandas, scikit-learn): it imports nothing from fedrepro. ``fedrepro parity fediic`` starts it as a script:

    python fediic_recorder.py --authors CHECKOUT --data ISIC_ROOT --torch-home DIR --out RECORD \
        [--stochastic off] [--threads N] -- [train_FedIIC.py's own arguments]

What it changes, and nothing else (each is a wrapper around the authors' object or an environment setting; none
draws a random number, so every random stream of their run is the one it would be):

- device: ``Tensor.cuda`` and ``Module.cuda`` return the object itself and ``torch.cuda.FloatTensor(list)`` builds a
  CPU float tensor (``utils/losses.py::DALA``), so the run stays on the CPU; ``torch.set_num_threads(threads)``;
- input: ``SkinDataset``'s hard-coded root (``dataset/get_dataset.py``: /home/wnn/dataset/...) is the fixture's;
  ``TORCH_HOME`` (set by the caller) holds the stand-in ``efficientnet-b0-355c32eb.pth`` where torch.hub looks;
- ``--stochastic off``: after ``EfficientNet.from_pretrained`` returns, its dropout rate and drop-connect rate are
  set to 0 (the exact comparison; rates and placement are compared with fedrepro's in the docs instead).

What it observes (each observed call returns what the original returns):

- ``SkinDataset.__getitem__`` on the training set: the python, numpy and torch CPU random states at entry (what the
  item's two augmentations draw from), the image and its index, in every loader worker and the main process;
- ``RandomSampler.__iter__``: each local epoch's order; ``clients_indices``: the clients;
- ``all_models.get_model``: the torch random state after the backbone is built (the classifier and projector are
  drawn from it); ``efficientb0.__init__``: the whole initial model;
- ``LocalUpdate.train_FedIIC``: per client and round the DALA input (``loss_class``), the prototypes, the returned
  weights and loss; ``FedAvg``: the aggregated weights; ``compute_loss_of_classes``: each client's per-class loss
  sums; ``compute_bacc``: the validation BACC, confusion matrix and logits (a forward hook on the model while it
  runs); ``SummaryWriter.add_scalar``: every logged scalar (per-step loss, CE, intra- and inter-client terms).
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import os
import random
import runpy
import sys
from pathlib import Path

import numpy as np
import torch


class Recorder:
    def __init__(self, out: Path):
        self.out = out
        self.items = out / "items"
        self.weights = out / "weights"
        self.items.mkdir(parents=True, exist_ok=True)
        self.weights.mkdir(parents=True, exist_ok=True)
        self.counter = itertools.count()
        self.main_pid = os.getpid()
        self.sampler_order: list[int] = []
        self.calls = 0
        self.clients: list[list[int]] = []
        self.record: dict = {"clients": None, "difficulty": None, "local": [], "class_loss_sums": [], "rounds": [],
                             "scalars": []}
        self.states: list[dict] = []
        self.arrays: dict[str, np.ndarray] = {}

    # ---- item states ---------------------------------------------------------------------------------------
    def item(self, load, index: int, name: str):
        """A training item's __getitem__ (``load()``), in whichever process loads it: the random states at its
        entry, and a digest of the two augmented views it returns."""
        py = random.getstate()
        _, keys, pos, has_gauss, gauss = np.random.get_state()
        states = dict(py=np.asarray(py[1], dtype=np.uint32), py_gauss=np.nan if py[2] is None else py[2],
                      np_keys=np.asarray(keys, dtype=np.uint32), np_pos=pos, np_has_gauss=has_gauss, np_gauss=gauss,
                      torch=torch.get_rng_state().numpy())
        result = load()
        views = result[0]
        digest = hashlib.sha256(b"".join(v.numpy().astype(np.float32).tobytes() for v in views)).hexdigest()
        np.savez(self.items / f"{os.getpid()}-{next(self.counter):06d}.npz", index=index, name=name, views=digest,
                 **states)
        return result

    def take_items(self) -> list[dict]:
        """Every item recorded since the last call, in the order each process recorded them."""
        files = sorted(self.items.glob("*.npz"), key=lambda p: (int(p.stem.split("-")[0]), p.stem))
        taken = []
        for path in files:
            with np.load(path) as data:
                taken.append({k: data[k] for k in data.files} | {"pid": int(path.stem.split("-")[0])})
            path.unlink()
        return taken

    def keep_state(self, item: dict) -> int:
        """Store an item's random states; -> its row in states.npz."""
        self.states.append({k: item[k] for k in ("py", "py_gauss", "np_keys", "np_pos", "np_has_gauss", "np_gauss",
                                                 "torch")})
        return len(self.states) - 1

    def difficulty_pass(self) -> None:
        """The main process loaded, for every client in turn, each of its images twice (``images_all``: the first
        view kept; ``labels_all``: the label only); the first loop's states are the images the per-class losses are
        measured on, in batches of 32 (``TensorDataset`` loader, no shuffle)."""
        items = [i for i in self.take_items() if i["pid"] == self.main_pid]
        passes, at = [], 0
        for client, indices in enumerate(self.clients):
            first = items[at:at + len(indices)]
            second = items[at + len(indices):at + 2 * len(indices)]
            if [int(i["index"]) for i in first] != list(indices) or [int(i["index"]) for i in second] != list(indices):
                raise RuntimeError(f"client {client}: the start-up loads are not its images twice in order")
            rows = [[str(i["name"]), self.keep_state(i), str(i["views"])] for i in first]
            passes.append([rows[s:s + 32] for s in range(0, len(rows), 32)])
            at += 2 * len(indices)
        self.record["difficulty"] = passes

    # ---- persistence ---------------------------------------------------------------------------------------
    def save(self) -> None:
        arrays = dict(self.arrays)
        if self.states:
            for key in self.states[0]:
                arrays[key] = np.stack([np.asarray(s[key]) for s in self.states])
        np.savez(self.out / "states.npz", **arrays)
        (self.out / "record.json").write_text(json.dumps(self.record, indent=1))


def install(rec: Recorder, data_root: str, stochastic: bool, batch_size: int) -> None:
    import dataset.dataset as authors_dataset
    import networks.all_models as all_models
    import networks.networks as networks
    import tensorboardX
    import utils.FedAvg as fedavg
    import utils.local_training as local_training
    import utils.sample_dirichlet as sample_dirichlet
    import val
    from torch.utils.data import RandomSampler

    # -- device: the CPU ---------------------------------------------------------------------------------------
    torch.Tensor.cuda = lambda self, *args, **kwargs: self
    torch.nn.Module.cuda = lambda self, *args, **kwargs: self
    torch.cuda.FloatTensor = lambda data: torch.tensor(data, dtype=torch.float32)

    # -- input: the fixture instead of /home/wnn/dataset/... -------------------------------------------------------
    skin_init = authors_dataset.SkinDataset.__init__

    def init(self, root, mode, transform=None):
        skin_init(self, data_root, mode, transform)
    authors_dataset.SkinDataset.__init__ = init

    get_item = authors_dataset.SkinDataset.__getitem__

    def getitem(self, index):
        if self.mode == "train":
            return rec.item(lambda: get_item(self, index), int(index), str(self.images[index]))
        return get_item(self, index)
    authors_dataset.SkinDataset.__getitem__ = getitem

    # -- observations ------------------------------------------------------------------------------------------
    sampler_iter = RandomSampler.__iter__

    def sampler(self):
        for index in sampler_iter(self):
            rec.sampler_order.append(int(index))
            yield index
    RandomSampler.__iter__ = sampler

    get_model = all_models.get_model

    def model(name, pretrained=False):
        built = get_model(name, pretrained)
        rec.arrays["head_init_torch_state"] = torch.get_rng_state().numpy()
        if not stochastic:
            built._dropout.p = 0.0
            built._global_params = built._global_params._replace(drop_connect_rate=0.0)
        return built
    all_models.get_model = model

    net_init = networks.efficientb0.__init__

    def efficientb0(self, *args, **kwargs):
        net_init(self, *args, **kwargs)
        torch.save(self.state_dict(), rec.weights / "initial.pt")
    networks.efficientb0.__init__ = efficientb0

    clients_indices = sample_dirichlet.clients_indices

    def clients(*args, **kwargs):
        result = clients_indices(*args, **kwargs)
        rec.clients = [[int(i) for i in part] for part in result]
        rec.record["clients"] = rec.clients
        return result
    sample_dirichlet.clients_indices = clients

    train_fediic = local_training.LocalUpdate.train_FedIIC

    def train(self, net, prototypes, writer):
        rnd, client = divmod(rec.calls, len(rec.clients))
        if rec.calls == 0:
            rec.difficulty_pass()
            rec.record["client_images"] = [[str(self.local_dataset.dataset.images[i]) for i in part]
                                           for part in rec.clients]
        rec.sampler_order = []
        w, loss = train_fediic(self, net, prototypes, writer)
        by_index = {int(i["index"]): i for i in rec.take_items()}
        names = self.local_dataset.dataset.images
        order = [self.local_dataset.idxs[p] for p in rec.sampler_order]
        if sorted(order) != sorted(by_index):
            raise RuntimeError(f"round {rnd} client {client}: the sampler's order and the loaded items differ")
        rows = [[str(names[i]), rec.keep_state(by_index[i]), str(by_index[i]["views"])] for i in order]
        rec.record["local"].append({
            "round": rnd, "client": client, "loss": float(loss), "lr": float(self.lr),
            "class_loss": self.loss_class.tolist(), "class_num": list(map(int, self.class_num_list)),
            "prototypes": prototypes.detach().tolist(),
            "batches": [rows[s:s + batch_size] for s in range(0, len(rows), batch_size)],
        })
        torch.save(w, rec.weights / f"round{rnd}_client{client}.pt")
        rec.calls += 1
        return w, loss
    local_training.LocalUpdate.train_FedIIC = train

    average = fedavg.FedAvg

    def fed_avg(w, dict_len):
        result = average(w, dict_len)
        rnd = rec.calls // len(rec.clients) - 1
        torch.save(result, rec.weights / f"round{rnd}_global.pt")
        rec.record["rounds"].append({"round": rnd, "weights": list(map(int, dict_len))})
        return result
    fedavg.FedAvg = fed_avg

    class_losses = val.compute_loss_of_classes

    def loss_of_classes(model, dataloader, n_classes):
        result = class_losses(model, dataloader, n_classes)
        rec.record["class_loss_sums"].append(result.tolist())
        return result
    val.compute_loss_of_classes = loss_of_classes

    bacc = val.compute_bacc

    def compute_bacc(model, dataloader, get_confusion_matrix, args):
        logits = []
        hook = model.register_forward_hook(lambda module, inputs, output: logits.append(output[1].detach().clone()))
        try:
            result = bacc(model, dataloader, get_confusion_matrix, args)
        finally:
            hook.remove()
        acc, conf = result if get_confusion_matrix else (result, None)
        rec.record["rounds"][-1].update({"bacc": float(acc), "confusion": None if conf is None else conf.tolist(),
                                         "logits": torch.cat(logits).tolist()})
        rec.record["validation_images"] = [str(n) for n in dataloader.dataset.images]
        return result
    val.compute_bacc = compute_bacc

    add_scalar = tensorboardX.SummaryWriter.add_scalar

    def scalar(self, tag, value, step=None, *args, **kwargs):
        number = float(value.detach()) if isinstance(value, torch.Tensor) else float(value)
        rec.record["scalars"].append([tag, number, None if step is None else int(step)])
        return add_scalar(self, tag, value, step, *args, **kwargs)
    tensorboardX.SummaryWriter.add_scalar = scalar


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--authors", required=True, help="the wnn2000/FedIIC checkout")
    parser.add_argument("--data", required=True, help="the ISIC 2019 fixture (ground-truth CSV + image folder)")
    parser.add_argument("--out", required=True, help="where the record goes")
    parser.add_argument("--stochastic", choices=("on", "off"), default="off")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("script_args", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    script_args = [a for a in args.script_args if a != "--"]
    batch_size = int(script_args[script_args.index("--batch_size") + 1]) if "--batch_size" in script_args else 2

    torch.set_num_threads(args.threads)
    checkout = Path(args.authors).resolve()
    sys.path.insert(0, str(checkout))
    rec = Recorder(Path(args.out).resolve())
    install(rec, str(Path(args.data).resolve()) + "/", args.stochastic == "on", batch_size)
    sys.argv = [str(checkout / "train_FedIIC.py"), *script_args]
    try:
        runpy.run_path(str(checkout / "train_FedIIC.py"), run_name="__main__")
    finally:
        rec.save()


if __name__ == "__main__":
    main()
