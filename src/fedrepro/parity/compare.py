"""What a whole-run parity comparison measures and prints, for any paper: relative differences of scalars, weight
differences relative to how far the weights moved, and the table per round and client.

Adam divides each gradient element by its own running magnitude, so on a first step any element whose gradient
differs in sign between the two runs - however small the difference that flipped it - moves by a whole +/- lr in
opposite directions. Weight differences are therefore read against the drift (how far the round moved the weights)
and as a count of such flips, not element by element.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import torch


class ParityError(RuntimeError):
    """A comparison that cannot be made as asked (the authors' run failed, a golden record cannot be rebuilt here):
    the message says what and what to do."""


def relative(a: float, b: float) -> float:
    """|a - b| / max(|a|, |b|) (0 for two zeros)."""
    scale = max(abs(a), abs(b))
    return abs(a - b) / scale if scale else 0.0


def max_relative(a, b) -> float:
    a, b = np.asarray(a, dtype=float).ravel(), np.asarray(b, dtype=float).ravel()
    if a.shape != b.shape:
        return math.inf
    return max((relative(x, y) for x, y in zip(a, b)), default=0.0)


def float_items(state: dict) -> dict[str, torch.Tensor]:
    """The floating-point entries of a state dict (parameters, BatchNorm statistics), as float64 on the CPU."""
    return {k: v.detach().cpu().double() for k, v in state.items() if v.is_floating_point()}


@dataclass
class WeightGap:
    """How far a replayed model is from the recorded one, against how far the round moved the recorded one."""

    difference: float          # ||ours - theirs||
    drift: float               # ||theirs - start||
    flips: int                 # elements whose difference exceeds half the learning rate (a flipped Adam step)
    largest: float             # max |ours - theirs|

    @property
    def ratio(self) -> float:
        return self.difference / self.drift if self.drift else math.inf

    @classmethod
    def between(cls, ours: dict, theirs: dict, start: dict, lr: float) -> "WeightGap":
        ours, theirs, start = float_items(ours), float_items(theirs), float_items(start)
        diff = drift = 0.0
        flips, largest = 0, 0.0
        for key, value in theirs.items():
            gap = ours[key] - value
            diff += float(gap.pow(2).sum())
            drift += float((value - start[key]).pow(2).sum())
            flips += int((gap.abs() > lr / 2).sum())
            largest = max(largest, float(gap.abs().max())) if gap.numel() else largest
        return cls(math.sqrt(diff), math.sqrt(drift), flips, largest)


@dataclass
class ClientRow:
    client: int
    steps: int
    loss: tuple[float, float]                   # (authors, fedrepro): the client's mean loss
    terms: dict[str, float] = field(default_factory=dict)    # term -> max relative difference over steps
    step_loss: float = 0.0                      # max relative difference of the per-step losses
    gap: WeightGap | None = None


@dataclass
class RoundRow:
    round: int
    clients: list[ClientRow]
    metric: tuple[float, float]                 # (authors, fedrepro)
    metric_name: str
    gap: WeightGap | None = None
    checks: dict[str, float] = field(default_factory=dict)    # name -> max relative difference (method inputs)


def table(rows: list[RoundRow], terms: list[str]) -> str:
    """The per-round, per-client comparison as text."""
    lines = []
    head = (f"{'round':>5} {'client':>6} {'steps':>5} {'loss authors':>13} {'loss fedrepro':>13} {'rel.diff':>9} "
            + " ".join(f"{t + ' rel':>9}" for t in terms) + f" {'|dW|/drift':>10} {'+-lr flips':>10}")
    lines.append(head)
    for rnd in rows:
        for c in rnd.clients:
            gap = c.gap
            lines.append(f"{rnd.round:>5} {c.client:>6} {c.steps:>5} {c.loss[0]:>13.7f} {c.loss[1]:>13.7f} "
                         f"{relative(*c.loss):>9.1e} " + " ".join(f"{c.terms.get(t, float('nan')):>9.1e}" for t in terms)
                         + (f" {gap.ratio:>10.2e} {gap.flips:>10d}" if gap else ""))
        gap = rnd.gap
        checks = "  ".join(f"{k} {v:.1e}" for k, v in rnd.checks.items())
        lines.append(f"{rnd.round:>5} {'global':>6} {'':>5} {rnd.metric_name} authors {rnd.metric[0]:.6f} fedrepro "
                     f"{rnd.metric[1]:.6f}" + (f"  |dW|/drift {gap.ratio:.2e} ({gap.flips} flips, max |dW| "
                                                f"{gap.largest:.1e})" if gap else "") + (f"  {checks}" if checks else ""))
    return "\n".join(lines)


@dataclass(frozen=True)
class Tolerances:
    """What counts as the same run: losses and each term within ``loss`` relative at every step; what the server sends
    besides the model and the validation probabilities within ``inputs``; metrics and the selected round identical;
    weights within ``weights`` of their drift."""

    loss: float = 1e-5
    inputs: float = 1e-5
    weights: float = 0.05

    def failures(self, rows: list[RoundRow], selection: tuple[int, int]) -> list[str]:
        bad = []
        for rnd in rows:
            for c in rnd.clients:
                worst = max([relative(*c.loss), c.step_loss, *c.terms.values()])
                if worst > self.loss:
                    bad.append(f"round {rnd.round} client {c.client}: a loss differs by {worst:.1e} relative")
                if c.gap is not None and c.gap.ratio > self.weights:
                    bad.append(f"round {rnd.round} client {c.client}: weights differ by {c.gap.ratio:.1e} of their drift")
            for name, value in rnd.checks.items():
                if value > self.inputs:
                    bad.append(f"round {rnd.round}: {name} differ by {value:.1e}")
            if rnd.metric[0] != rnd.metric[1] and not all(map(math.isnan, rnd.metric)):   # nan: not evaluated
                bad.append(f"round {rnd.round}: {rnd.metric_name} {rnd.metric[0]} vs {rnd.metric[1]}")
            if rnd.gap is not None and rnd.gap.ratio > self.weights:
                bad.append(f"round {rnd.round}: aggregated weights differ by {rnd.gap.ratio:.1e} of their drift")
        if selection[0] != selection[1]:
            bad.append(f"selected round {selection[0]} vs {selection[1]}")
        return bad

    def verdict(self, rows: list[RoundRow], selection: tuple[int, int]) -> tuple[str, bool]:
        bad = self.failures(rows, selection)
        rule = (f"losses and terms within {self.loss:g} relative, server messages and validation probabilities within "
                f"{self.inputs:g}, metrics and selection identical, weights within {self.weights:g} of their drift")
        if not bad:
            return f"PASS: {rule}", True
        return f"FAIL ({rule}):\n  " + "\n  ".join(bad), False
