"""A replay: a run fed what another run - the authors' own code, recorded from outside - started from and drew, so
that the two can be compared round by round (``fedrepro parity``, docs/parity.md).

A train job replays when its run config has a ``replay`` block (off by default; ``train.py`` reads the files, so
nothing here touches a file):

- ``initial_model`` + ``layout``: every parameter and buffer of the first global model, heads and projectors
  included, saved in the authors' key layout; the model family maps it onto its own keys
  (:meth:`fedrepro.models.families.ModelFamily.authors_state`) and the method starts from it instead of its own
  initialisation;
- ``record``: the data passes the recorded run made, each a list of batches of (image, random states): the local
  batches of every client and round (purpose ``local``, keys (round, client)) and a method's own passes over the
  clients' data (e.g. FedIIC's per-class losses, purpose ``fediic-difficulty``, keys (client,)). Every item is
  loaded under the random states its transform started from in the recorded run
  (:class:`fedrepro.data.loader.ItemState`), so the same crops and colour draws come out where the transforms draw
  the same numbers.

Stochastic layers (dropout, drop-path) draw from the training loop's own stream, which no record aligns: an exact
comparison switches them off on both sides (``model.drop_rate: 0``, ``model.drop_path_rate: 0`` here).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..data.loader import ItemState

Plan = list[list[tuple[int, ItemState]]]     # batches of (position in the dataset, the item's random states)


class ReplayError(ValueError):
    """A replay that asks for something its record does not hold."""


@dataclass
class Replay:
    initial_state: dict | None = None       # the first global model, in the authors' layout
    layout: str | None = None               # which authors' layout (a key map the model family knows)
    passes: dict[tuple, Plan] = field(default_factory=dict)   # (purpose, *keys) -> batches
    source: str = "record"                  # where the record came from, for messages

    @property
    def purposes(self) -> set[str]:
        return {key[0] for key in self.passes}

    def plan(self, purpose: str, *keys: int) -> Plan | None:
        """The recorded batches of one pass, or None when the record holds no pass of this purpose (the run draws
        its own). A recorded purpose without these keys is an error: the replay would silently diverge."""
        if purpose not in self.purposes:
            return None
        found = self.passes.get((purpose, *keys))
        if found is None:
            have = sorted(k[1:] for k in self.passes if k[0] == purpose)
            raise ReplayError(f"{self.source} holds no {purpose!r} pass for {list(keys)} (it holds {have[:6]}"
                              f"{' ...' if len(have) > 6 else ''}): replay at most the rounds and clients it recorded")
        return found
