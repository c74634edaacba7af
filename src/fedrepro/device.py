"""Which device a job computes on, and how: numeric precision and memory layout (one place).

- ``device``: ``auto`` = the first CUDA GPU if one is visible, else the CPU.
- ``train.precision``: ``fp32``; ``bf16`` or ``fp16`` = mixed precision through :func:`torch.autocast`
  (weights, gradients and optimizer states stay fp32; matmuls and convolutions of the forward pass run
  in 16 bits); ``auto`` = bf16 on a CUDA GPU that supports it (``torch.cuda.is_bf16_supported()``),
  fp32 otherwise (always fp32 on the CPU). fp16 needs a gradient scaler (:meth:`Compute.scaler`),
  bf16 does not (its exponent range is fp32's).
- ``fp16_weights``: how the FACMIC and FAA-CLIP authors fine-tuned CLIP, reproduced as their code does it. OpenAI's
  ``clip.load`` on a GPU stores the weights of every linear, convolution and attention projection (and ``proj``,
  ``text_projection``) in fp16 (openai/CLIP ``clip/model.py::convert_weights``) and normalises in fp32
  (``clip/model.py::LayerNorm``: the input cast to fp32, the result back to its dtype); the model then runs in pure
  fp16 (no autocast: every activation, residual sum and gradient of those weights is fp16; ``encode_image`` casts
  the images to fp16). Their training loops (AIPMLab/FACMIC and AIPMLab/FAA-CLIP ``utils/training.py::train``)
  cast every weight and gradient to fp32 right before ``optimizer.step()``
  (``utils/clip_util.py::convert_models_to_fp32``) and the fp16 ones back right after it
  (``clip.model.convert_weights``), with no loss scaling: Adam's moments are fp32, an update smaller than half an
  fp16 step of the weight is lost. Here :meth:`Compute.round_weights` makes a model so (fp16 storage, fp32
  LayerNorm), :meth:`Compute.keep_fp16_weights` wraps each optimizer step in the two casts (and loads a saved
  optimizer state without rounding its fp32 moments), and the average of the clients' fp16 weights is summed in
  fp32 and copied into fp16 weights (``utils/aggregation.py::communication``; :func:`fedrepro.fl.method.weighted_average`).
  LayerNorm, embeddings and the logit scale stay fp32, as in the authors' models.
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

PRECISIONS = ("fp32", "bf16", "fp16", "fp16_weights")
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16, "fp16_weights": torch.float16}
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
        """The forward pass (and the loss) of a training step or an evaluation batch runs inside this (under
        fp16_weights the model itself is fp16: no autocast, as the authors' code)."""
        if self.precision in ("fp32", "fp16_weights"):
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.dtype)

    def scaler(self) -> "torch.amp.GradScaler | None":
        """A fresh gradient scaler for fp16 (its state persists with the optimizer's); None otherwise."""
        if self.precision != "fp16":
            return None
        return torch.amp.GradScaler(self.device.type)

    def keep_fp16_weights(self, optimizer: torch.optim.Optimizer, model: torch.nn.Module) -> None:
        """Under ``fp16_weights``, each step of ``optimizer`` as the authors' loop takes it: every parameter of
        ``model`` and its gradient cast to fp32 before the step (``convert_models_to_fp32``), the fp16 weights
        (:func:`fp16_weight_parameters`) cast back after it (``clip.model.convert_weights``). Call it before
        loading a saved state into ``optimizer``: its fp32 moments are then loaded as fp32 (torch casts a loaded
        state to its parameters' dtype). Nothing otherwise."""
        if self.precision != "fp16_weights":
            return
        halves = fp16_weight_parameters(model)
        to_fp32 = lambda *_: convert_models_to_fp32(model)   # noqa: E731
        to_fp16 = lambda *_: to_half(halves)                 # noqa: E731
        optimizer.register_step_pre_hook(to_fp32)
        optimizer.register_step_post_hook(to_fp16)
        optimizer.register_load_state_dict_pre_hook(to_fp32)
        optimizer.register_load_state_dict_post_hook(to_fp16)

    def round_weights(self, model: torch.nn.Module) -> None:
        """Under ``fp16_weights``: ``model`` (freshly built or aggregated) as ``clip.load`` gives OpenAI's CLIP on a
        GPU, in place: its fp16 weights stored in fp16, its LayerNorms computing in fp32 (:func:`authors_fp16`);
        nothing otherwise."""
        if self.precision == "fp16_weights":
            authors_fp16(model)

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


def fp16_weight_parameters(model: torch.nn.Module) -> list[torch.nn.Parameter]:
    """The parameters OpenAI's CLIP keeps in fp16 (``clip.model.convert_weights``): weights and biases of
    every Conv1d, Conv2d and Linear, the input projections and biases of nn.MultiheadAttention, and the
    ``proj`` / ``text_projection`` matrices. Norms, embeddings and scalars are not among them."""
    found: dict[int, torch.nn.Parameter] = {}
    for module in model.modules():
        tensors = [getattr(module, name, None) for name in ("text_projection", "proj")]
        if isinstance(module, (torch.nn.Conv1d, torch.nn.Conv2d, torch.nn.Linear)):
            tensors += [module.weight, module.bias]
        if isinstance(module, torch.nn.MultiheadAttention):
            tensors += [getattr(module, name, None) for name in
                        ("in_proj_weight", "q_proj_weight", "k_proj_weight", "v_proj_weight", "in_proj_bias", "bias_k", "bias_v")]
        found.update((id(t), t) for t in tensors if isinstance(t, torch.nn.Parameter))
    return list(found.values())


@torch.no_grad()
def round_to_fp16(tensors) -> None:
    """Each tensor in place to the nearest fp16 value (round to nearest even, as ``.half()``), kept in its dtype."""
    for t in tensors:
        t.copy_(t.to(torch.float16))


class Fp32LayerNorm(torch.nn.LayerNorm):
    """LayerNorm computed in fp32 whatever its input's dtype, returned in that dtype (openai/CLIP
    ``clip/model.py::LayerNorm``; open_clip's ``LayerNormFp32`` does the same)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weight = None if self.weight is None else self.weight.float()
        bias = None if self.bias is None else self.bias.float()
        return torch.nn.functional.layer_norm(x.float(), self.normalized_shape, weight, bias, self.eps).to(x.dtype)


def authors_fp16(model: torch.nn.Module) -> torch.nn.Module:
    """``model`` in place as OpenAI's ``clip.load(name, device="cuda")`` holds CLIP: the parameters
    ``clip.model.convert_weights`` halves (:func:`fp16_weight_parameters`) stored in fp16, every LayerNorm computing in
    fp32 (:class:`Fp32LayerNorm`); the model then computes in fp16, its inputs cast to fp16."""
    to_half(fp16_weight_parameters(model))
    for module in model.modules():
        if isinstance(module, torch.nn.LayerNorm) and not isinstance(module, Fp32LayerNorm):
            module.__class__ = Fp32LayerNorm
    return model


def to_half(parameters) -> None:
    """Each parameter stored in fp16 (``clip.model.convert_weights``: ``.data = .data.half()``)."""
    for p in parameters:
        p.data = p.data.half()


def convert_models_to_fp32(model: torch.nn.Module) -> None:
    """Every parameter of ``model`` and its gradient cast to fp32 in place (AIPMLab/FACMIC and AIPMLab/FAA-CLIP
    ``utils/clip_util.py::convert_models_to_fp32``, called right before ``optimizer.step()``)."""
    for p in model.parameters():
        p.data = p.data.float()
        if p.grad is not None:
            p.grad.data = p.grad.data.float()


def input_dtype(model: torch.nn.Module) -> torch.dtype | None:
    """The dtype a model's images must have: its first convolution's weight's (fp16 for an fp16 CLIP, as
    OpenAI's ``encode_image`` casts them: ``image.type(self.dtype)``), or None without a convolution."""
    conv = next((m for m in model.modules() if isinstance(m, torch.nn.Conv2d)), None)
    return None if conv is None else conv.weight.dtype


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
        if device_type not in AUTOCAST_DEVICES:        # e.g. "meta" (fedrepro.cost.memory builds models there)
            return fn(*args, **kwargs)
        if not torch.is_autocast_enabled(device_type) and all(t.dtype not in HALF for t in tensors):
            return fn(*args, **kwargs)
        args = tuple(fp32(a) if isinstance(a, torch.Tensor) else a for a in args)
        kwargs = {k: fp32(v) if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}
        with torch.autocast(device_type, enabled=False):
            return fn(*args, **kwargs)

    return wrapper
