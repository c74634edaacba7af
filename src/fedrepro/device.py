"""Which device a job computes on, and how: numeric precision and memory layout (one place).

- ``device``: ``auto`` = the first CUDA GPU if one is visible, else the CPU.
- ``train.precision``: ``fp32``; ``bf16`` or ``fp16`` = mixed precision through :func:`torch.autocast`
  (weights, gradients and optimizer states stay fp32; matmuls and convolutions of the forward pass run
  in 16 bits); ``auto`` = bf16 on a CUDA GPU that supports it (``torch.cuda.is_bf16_supported()``),
  fp32 otherwise (always fp32 on the CPU). fp16 needs a gradient scaler (:meth:`Compute.scaler`),
  bf16 does not (its exponent range is fp32's).
- ``train.channels_last``: ``true`` / ``false``, or ``auto`` = on for convolutional models
  (:func:`is_convolutional`) on a CUDA GPU, where cuDNN's NHWC kernels are faster; off on the CPU.

Scores whose softmax or cross-entropy is taken are computed in fp32 whatever the precision: the
functions that build them (cosine logits with a scale, contrastive losses, prototype distances) run
under :func:`full_precision`, and :func:`fp32` casts a tensor up. With ``fp32`` every helper here is
an identity: results are bit-identical to code that never heard of mixed precision.
"""

from __future__ import annotations

import contextlib
import functools
from dataclasses import dataclass

import torch

PRECISIONS = ("fp32", "bf16", "fp16")
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
HALF = (torch.bfloat16, torch.float16)
AUTOCAST_DEVICES = ("cpu", "cuda", "xpu", "mps")


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("device: cuda was requested but no CUDA device is visible to this job")
    return torch.device(name)


def resolve_precision(setting: str, device: torch.device) -> str:
    """``train.precision`` -> fp32 | bf16 | fp16 on ``device``."""
    if setting == "auto":
        if device.type == "cuda" and torch.cuda.is_available() and torch.cuda.is_bf16_supported():
            return "bf16"
        return "fp32"
    if setting not in PRECISIONS:
        raise ValueError(f"train.precision: {setting!r} is not one of auto, {', '.join(PRECISIONS)}")
    return setting


def is_convolutional(model: torch.nn.Module) -> bool:
    """A CNN (ResNet, EfficientNet, a CLIP ResNet tower): more than one 2-D convolution. A ViT has one
    (its patch embedding), which channels_last does not speed up."""
    return sum(isinstance(m, torch.nn.Conv2d) for m in model.modules()) > 1


def resolve_channels_last(setting: bool | str, model: torch.nn.Module, device: torch.device) -> bool:
    if setting == "auto":
        return device.type == "cuda" and is_convolutional(model)
    return bool(setting)


@dataclass(frozen=True)
class Compute:
    """How a job's models compute: the device, the resolved precision and memory layout."""

    device: torch.device
    precision: str = "fp32"
    channels_last: bool = False

    @classmethod
    def for_run(cls, train: dict, device: torch.device) -> "Compute":
        """From a (resolved or not) train block; channels_last is settled per model by :meth:`with_model`."""
        return cls(device, resolve_precision(train.get("precision", "auto"), device), False)

    def with_model(self, setting: bool | str, model: torch.nn.Module) -> "Compute":
        return Compute(self.device, self.precision, resolve_channels_last(setting, model, self.device))

    @property
    def dtype(self) -> torch.dtype:
        return DTYPES[self.precision]

    def autocast(self):
        """The forward pass (and the loss) of a training step or an evaluation batch runs inside this."""
        if self.precision == "fp32":
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.dtype)

    def scaler(self) -> "torch.amp.GradScaler | None":
        """A fresh gradient scaler for fp16 (its state persists with the optimizer's); None otherwise."""
        if self.precision != "fp16":
            return None
        return torch.amp.GradScaler(self.device.type)

    def prepare(self, model: torch.nn.Module) -> torch.nn.Module:
        """A model moved to channels_last (in place) if that was chosen."""
        if self.channels_last:
            model.to(memory_format=torch.channels_last)
        return model

    def batch(self, batch: dict) -> dict:
        """A batch on the device; image tensors (B x C x H x W) in channels_last if that was chosen."""
        out = {k: v.to(self.device, non_blocking=True) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}
        x = out.get("x")
        if self.channels_last and isinstance(x, torch.Tensor) and x.dim() == 4:
            out["x"] = x.contiguous(memory_format=torch.channels_last)
        return out

    def describe(self) -> dict:
        return {"precision": self.precision, "channels_last": self.channels_last}


def backward_step(loss: torch.Tensor, optimizers, scaler: "torch.amp.GradScaler | None") -> None:
    """zero_grad -> backward -> step of one or more optimizers that share one loss; with an fp16
    scaler the loss is scaled, steps with inf/NaN gradients are skipped and the scale adapts."""
    optimizers = optimizers if isinstance(optimizers, (list, tuple)) else [optimizers]
    for optimizer in optimizers:
        optimizer.zero_grad(set_to_none=True)
    if scaler is None:
        loss.backward()
        for optimizer in optimizers:
            optimizer.step()
        return
    scaler.scale(loss).backward()
    for optimizer in optimizers:
        scaler.step(optimizer)
    scaler.update()


def fp32(x: torch.Tensor) -> torch.Tensor:
    """A floating tensor in fp32 (itself if it already is)."""
    return x.float() if x.is_floating_point() and x.dtype != torch.float32 else x


def full_precision(fn):
    """Run ``fn`` with autocast off and its floating tensor arguments in fp32: for functions that turn
    features into scores or losses (a scaled cosine, a softmax, a distance by expansion), where 16-bit
    rounding would move the result. An identity on code that runs without autocast in fp32."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        tensors = [a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)]
        device_type = tensors[0].device.type if tensors else "cpu"
        if device_type not in AUTOCAST_DEVICES:        # e.g. "meta" (fedrepro.fl.memory builds models there)
            return fn(*args, **kwargs)
        if not torch.is_autocast_enabled(device_type) and all(t.dtype not in HALF for t in tensors):
            return fn(*args, **kwargs)
        args = tuple(fp32(a) if isinstance(a, torch.Tensor) else a for a in args)
        kwargs = {k: fp32(v) if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}
        with torch.autocast(device_type, enabled=False):
            return fn(*args, **kwargs)

    return wrapper
