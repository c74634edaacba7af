"""PRR-Imb (FedIIC Table 1 baseline; the PRR-Imbalance code's defaults, one local epoch), two rounds.

Specification: PRR-Imb (Chen et al., TMI'22; CityU-AIM-Group/PRR-Imbalance ``main.py``,
``local_train.py::DET``, ``loss_func.py``, ``server.py::communication``) with FedIIC's shared recipe
(:mod:`tests.parity.spec_fediic`). Every client keeps a personalized model and a deputy (both start
as the initial model). Each round, each client, with a fresh Adam for each model:

- one local epoch (the code's ``wk_iters < 2``): both models learn from each other on every batch,
      L_p = CPA(z_p, y) + KL(softmax(z_d) || softmax(z_p)),   L_d = CPA(z_d, y) + KL(softmax(z_p) || softmax(z_d))
  (teachers detached, KL batch-mean), the personalized model's forward first;
- CPA (the first 15 rounds, ``CPA_Loss_init``): with the global class counts n and s_yj = (n_j / n_y)^0.8
  where n_y > n_j (else 1), after subtracting the row maximum,
      CPA = mean_b -log( e^{z_y} / (sum_{j != y} s_yj e^{z_j} + e^{z_y} + 1e-6) + 1e-6 );
- the server mixes the deputies (Progressive Fourier Aggregation, L = 0.7 + (r / R)(0.95 - 0.7)):
  every conv / linear weight (a conv kernel N x C x kh x kw as the (C kh) x (kw N) matrix) gets, in
  its centred 2-D spectrum, the block of half-widths floor(L h / 2), floor(L w / 2) around
  (floor(h/2), floor(w/2)) replaced by the clients' mean amplitude and mean phase; the classifier's
  rows get the same with a 1-D FFT; BatchNorm stays local; other parameters get the plain client
  mean; each client continues from its mixed deputy;
- the global model FedIIC evaluates is the size-weighted average (FedAvg) of the uploaded deputies.

The second round starts from mixed deputies and the personalized models of the first.
"""

import copy

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from .harness import client_batches, mean_state, optimizer_for, seed_client, train_sizes
from .spec_fedavg import averaged, check_global
from .spec_fediic import ADAM, CLASSES, drive_tiny, logits

pytestmark = pytest.mark.usefixtures("one_thread")

BETA, BAND_START, EPS = 0.8, 0.7, 1e-6


def cpa(z, y, counts):
    n = counts.double()
    s = torch.where(n[:, None] > n[None, :], (n[None, :] / n[:, None]) ** BETA, torch.ones(len(n), len(n))).float()
    e = (z - z.max(dim=1, keepdim=True).values).exp()
    den = (s[y] * e).sum(dim=1)                  # e^{z_y} + sum_{j != y} s_yj e^{z_j}  (s_yy = 1)
    return -torch.log(e[torch.arange(len(y)), y] / (den + EPS) + EPS).mean()


def kl(student, teacher):
    return F.kl_div(F.log_softmax(student, dim=1), F.softmax(teacher.detach(), dim=1), reduction="batchmean")


def mix(arrays, band, axes=(-2, -1)):
    """np.fft over ``axes`` of each client's array; the centred low block (half-widths
    floor(L size / 2) around size // 2 on each axis) <- the clients' mean amplitude and mean phase."""
    spectra = [np.fft.fftshift(np.fft.fftn(a, axes=axes), axes=axes) for a in arrays]
    amp, pha = np.mean([np.abs(s) for s in spectra], 0), np.mean([np.angle(s) for s in spectra], 0)
    block = [slice(None)] * arrays[0].ndim
    for ax in axes:
        size = arrays[0].shape[ax]
        half = int(np.floor(size * band / 2))
        block[ax] = slice(size // 2 - half, size // 2 + half)
    block = tuple(block)
    out = []
    for s in spectra:
        a, p = np.abs(s), np.angle(s)
        a[block], p[block] = amp[block], pha[block]
        out.append(np.real(np.fft.ifftn(np.fft.ifftshift(a * np.exp(1j * p), axes=axes), axes=axes)))
    return out


def pfa(model, states, band):
    roles = {}
    for prefix, module in model.named_modules():
        for name, _ in list(module.named_parameters(recurse=False)) + list(module.named_buffers(recurse=False)):
            key = f"{prefix}.{name}" if prefix else name
            if isinstance(module, nn.modules.batchnorm._BatchNorm):
                roles[key] = "local"
            elif name == "weight" and module is model.head:
                roles[key] = "rows"
            elif name == "weight" and isinstance(module, (nn.Conv2d, nn.Linear)):
                roles[key] = "fourier"
    mixed = [copy.deepcopy(s) for s in states]
    for key in states[0]:
        role = roles.get(key, "average")
        if role == "local":
            continue
        if role == "average":
            mean = mean_state(states, [1.0] * len(states), [key])[key].to(states[0][key].dtype)
            for m in mixed:
                m[key] = mean.clone()
            continue
        ws = [s[key].double().numpy() for s in states]
        if role == "rows":
            out = mix(ws, band, axes=(-1,))                  # every row on its own
        elif ws[0].ndim == 4:
            n, c, kh, kw = ws[0].shape
            out = [m.reshape(c, kh, kw, n).transpose(3, 0, 1, 2)
                   for m in mix([w.transpose(1, 2, 3, 0).reshape(c * kh, kw * n) for w in ws], band)]
        else:
            out = mix(ws, band)
        for m, o in zip(mixed, out):
            m[key] = torch.from_numpy(np.ascontiguousarray(o)).float()
    return mixed


def test_two_rounds_match_the_prr_code(tmp_path):
    rounds = 2
    run, fed, start, driven = drive_tiny("prr_imb", tmp_path, rounds=rounds)
    counts = torch.bincount(torch.cat([torch.as_tensor(c.train.labels) for c in fed.clients]), minlength=CLASSES)
    personal = {c.name: copy.deepcopy(start) for c in fed.clients}
    deputy_states = {c.name: copy.deepcopy(start.state_dict()) for c in fed.clients}
    for rnd in range(rounds):
        uploads = []
        for client in fed.clients:
            p_model, d_model = personal[client.name], copy.deepcopy(start)
            d_model.load_state_dict(deputy_states[client.name])
            opt_p, opt_d = optimizer_for(p_model.parameters(), ADAM), optimizer_for(d_model.parameters(), ADAM)
            p_model.train(), d_model.train()
            seed_client(run, rnd, client)
            for batch in client_batches(run, client, rnd):
                z_p, z_d = logits(p_model, batch["x"]), logits(d_model, batch["x"])
                loss_p = cpa(z_p, batch["y"], counts) + kl(z_p, z_d)
                loss_d = cpa(z_d, batch["y"], counts) + kl(z_d, z_p)
                opt_p.zero_grad(), opt_d.zero_grad()
                loss_p.backward()
                loss_d.backward()
                opt_p.step(), opt_d.step()
            uploads.append(copy.deepcopy(d_model.state_dict()))
        glob = averaged(start, uploads, train_sizes(fed))
        band = BAND_START + (rnd / rounds) * (0.95 - BAND_START)
        for client, state in zip(fed.clients, pfa(start, uploads, band)):
            deputy_states[client.name] = state
    check_global(driven, fed, glob, logits, what="FedAvg of the deputies")
    for client in fed.clients:
        held = driven.method.clients_state[client.name]
        for key, value in deputy_states[client.name].items():
            if value.is_floating_point():
                assert torch.allclose(held["deputy"][key], value, atol=1e-6), (client.name, key)
        mine = personal[client.name].state_dict()
        assert all(torch.allclose(held["personal"][k], mine[k], atol=1e-6) for k in mine if mine[k].is_floating_point())
