"""fedrepro-fedavgm: FedAvgM (federated averaging with server momentum) as a fedrepro plug-in.

fedrepro imports this package through its entry point (group ``fedrepro.plugins`` in pyproject.toml); importing it
registers the method ``fedavgm`` (:mod:`fedrepro_fedavgm.fedavgm`). :mod:`fedrepro_fedavgm.shapes` writes a small
folder dataset to try it on. The configuration that puts FedAvgM into the papers' tables is ``fedavgm.yaml`` beside
this package (docs/plugins.md of the fedrepro repository walks through all of it).
"""

from .fedavgm import FedAvgM

__all__ = ["FedAvgM"]
