"""A depth cut for smoke tests: real widths, real input shapes and heads, fewer blocks.

The full-size smoke test (``tests/test_fullsize.py``, docs/fullsize.md) builds every model of the grid
at its real architecture. At full depth a ViT-B/16 CLIP round takes minutes on a CPU, so the
per-method combinations run inside :func:`depth_limit`: every encoder the builders create
(:func:`fedrepro.models.encoders.load_open_clip`, :func:`~fedrepro.models.encoders.create_timm`, the
FedDRA text tower) keeps only its first ``blocks`` blocks per stack, which still exercises every
shape, wiring and device path. Nothing else uses it: outside the context it does nothing, and no
configuration can switch it on.

What is cut, per architecture:

- transformers (open_clip's image and text towers, timm ViTs, BERT): the first ``blocks`` residual blocks;
- timm ResNets: the first ``blocks`` blocks of each of the four stages (every stage, its channel
  change and downsampling kept, so adapters and heads after each stage still fit);
- timm EfficientNets: the first ``blocks`` blocks of each stage (the stage's first block changes
  the width; the stem and head are kept).
"""

from __future__ import annotations

import contextlib
from typing import Iterator

from torch import nn

_LIMIT: list[int | None] = [None]


@contextlib.contextmanager
def depth_limit(blocks: int | None) -> Iterator[None]:
    """Inside: encoders are built with at most ``blocks`` blocks per stack (None: no cut)."""
    if blocks is not None and blocks < 1:
        raise ValueError(f"depth limit must be >= 1, not {blocks}")
    before = _LIMIT[0]
    _LIMIT[0] = blocks
    try:
        yield
    finally:
        _LIMIT[0] = before


def current_limit() -> int | None:
    return _LIMIT[0]


def _cut(stack: nn.Module, n: int) -> nn.Module:
    return stack[:n] if len(stack) > n else stack


def cut_depth(model: nn.Module) -> nn.Module:
    """Apply the current limit to an encoder built by one of the libraries (in place; returns it)."""
    n = _LIMIT[0]
    if n is None:
        return model
    for tower in (getattr(model, "visual", None), model):                       # open_clip CLIP
        transformer = getattr(tower, "transformer", None)
        if isinstance(getattr(transformer, "resblocks", None), nn.ModuleList):
            transformer.resblocks = _cut(transformer.resblocks, n)
            transformer.layers = len(transformer.resblocks)
    stages = [f"layer{i}" for i in range(1, 5)]
    if all(isinstance(getattr(model, s, None), nn.Sequential) for s in stages):   # timm ResNet
        for s in stages:
            setattr(model, s, _cut(getattr(model, s), n))
    blocks = getattr(model, "blocks", None)
    if isinstance(blocks, nn.Sequential) and len(blocks) and all(isinstance(b, nn.Sequential) for b in blocks):
        model.blocks = nn.Sequential(*[_cut(stage, n) for stage in blocks])       # timm EfficientNet stages
    elif isinstance(blocks, (nn.Sequential, nn.ModuleList)):
        model.blocks = _cut(blocks, n)                                            # timm ViT
    layers = getattr(getattr(model, "encoder", None), "layer", None)
    if isinstance(layers, nn.ModuleList):                                         # transformers BERT
        model.encoder.layer = _cut(layers, n)
        model.config.num_hidden_layers = len(model.encoder.layer)
    return model
