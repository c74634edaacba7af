"""Where pretrained weights come from: open_clip tags, timm hub weights, Hugging Face repositories.

Each source fetches a :class:`~fedrepro.models.weights.WeightSpec` into a folder (the ``weights``
rule, on a machine with internet) and tells a job how to load the local copy offline the way the
library would have loaded it from the hub:

- ``open_clip`` (name, tag): the tag's checkpoint file from its Hugging Face repository (or its URL),
  loaded with ``pretrained=<file>`` plus the tag's own settings (QuickGELU, mean/std, interpolation,
  resize mode) that open_clip would apply to the tag (:func:`open_clip_options`).
- ``timm`` (name): the file ``timm.create_model(name, pretrained=True)`` downloads, resolved to the
  full ``architecture.tag`` name once; loaded through timm's own pretrained loader
  (``pretrained_cfg_overlay={"file": ...}``), so head removal, input-channel adaptation and
  position-embedding resampling are timm's (:func:`timm_options`).
- ``hf`` (repository, ``model`` | ``tokenizer``): the root-level config and tokenizer files of one
  revision, plus (``model``) its PyTorch weights (safetensors preferred, shards included); loaded with
  ``from_pretrained(<folder>)``.
- ``composite`` (name, ``aligned``): not fetched but built here, offline, from weights that ship as
  Python packages: the projections of a composite CLIP fitted by :func:`fedrepro.models.composite.align`.

The only functions that touch the network are :func:`hub_listing`, :func:`hub_download` and
:func:`url_download`; every error they raise becomes a :class:`WeightsFetchError` that names the
resource and what to check (tests replace them with a local fake hub).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from ..registry import register_weight_source
from .weights import WeightsError, WeightsFetchError, WeightSource, WeightSpec, local_manifest, local_path

FETCH_HINT = ("Run the weights step on a machine that reaches huggingface.co (the login node, not a compute node); "
              "check the name in the config; for a gated or private repository log in first (`hf auth login`, or "
              "set HF_TOKEN).")


def _short(error: Exception) -> str:
    text = str(error).strip()
    return f"{type(error).__name__}: {text.splitlines()[0] if text else ''}"


def hub_listing(repo: str, revision: str | None = None) -> tuple[str, list[str]]:
    """(commit hash, file names) of a Hugging Face model repository."""
    try:
        from huggingface_hub import HfApi

        info = HfApi().model_info(repo, revision=revision)
        return info.sha, [s.rfilename for s in info.siblings or []]
    except Exception as error:   # noqa: BLE001 - hub, HTTP and connection errors alike
        raise WeightsFetchError(f"could not list the Hugging Face repository {repo!r} ({_short(error)}). {FETCH_HINT}") from None


def hub_download(repo: str, filename: str, revision: str, dest: Path) -> Path:
    """Download one file of a repository at ``revision`` into ``dest`` (a plain file, no cache links)."""
    try:
        from huggingface_hub import hf_hub_download

        return Path(hf_hub_download(repo, filename, revision=revision, local_dir=dest))
    except Exception as error:   # noqa: BLE001
        raise WeightsFetchError(f"could not download {filename} of {repo!r} at {revision} ({_short(error)}). "
                                f"{FETCH_HINT}") from None


def url_download(url: str, dest: Path) -> Path:
    try:
        import torch

        torch.hub.download_url_to_file(url, str(dest), progress=False)
        return dest
    except Exception as error:   # noqa: BLE001
        Path(dest).unlink(missing_ok=True)
        raise WeightsFetchError(f"could not download {url} ({_short(error)}). Run the weights step on a machine with "
                                f"internet (the login node).") from None


def _first_present(candidates: list[str], files: list[str], repo: str) -> str:
    for name in candidates:
        if name in files:
            return name
    raise WeightsFetchError(f"the Hugging Face repository {repo!r} has none of {candidates}")


def _single_file(repo_and_revision: str, candidates: list[str], dest: Path) -> dict:
    repo, _, pinned = repo_and_revision.partition("@")
    revision, files = hub_listing(repo, pinned or None)
    name = _first_present(candidates, files, repo)
    hub_download(repo, name, revision, dest)
    return {"primary": name, "source": {"hub": repo, "revision": revision, "file": name}}


def _url_file(url: str, dest: Path) -> dict:
    filename = os.path.basename(url.split("?")[0])
    url_download(url, dest / filename)
    return {"primary": filename, "source": {"url": url}}


def _load_state_dict(path: Path) -> dict:
    import torch

    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        return load_file(str(path))
    state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    return state.get("state_dict", state) if isinstance(state, dict) else state


# --------------------------------------------------------------------------------------------
# open_clip

def _open_clip_cfg(name: str, tag: str) -> dict:
    from open_clip.pretrained import get_pretrained_cfg, list_pretrained_tags_by_model

    cfg = get_pretrained_cfg(name, tag)
    if not cfg:
        raise WeightsError(f"open_clip has no pretrained tag {tag!r} for model {name!r}; its tags: "
                           f"{list_pretrained_tags_by_model(name) or 'none'} (or give a checkpoint path, or none)")
    return cfg


def open_clip_options(name: str, tag: str) -> dict:
    """What ``open_clip.create_model_and_transforms(name, pretrained=tag)`` takes from the tag, as
    arguments for loading the tag's file by path: the activation the weights were trained with
    (OpenAI's CLIPs use QuickGELU) and the tag's preprocessing."""
    cfg = _open_clip_cfg(name, tag)
    return {"force_quick_gelu": bool(cfg.get("quick_gelu", False)), "image_mean": cfg.get("mean"),
            "image_std": cfg.get("std"), "image_interpolation": cfg.get("interpolation"),
            "image_resize_mode": cfg.get("resize_mode")}


OPEN_CLIP_FILES = ("open_clip_model.safetensors", "open_clip_pytorch_model.bin")


@register_weight_source("open_clip")
class OpenClipSource(WeightSource):
    has_variant = True

    def check_spec(self, spec):
        if "/" in spec.name:
            raise ValueError(f"open_clip weights name a model config (e.g. ViT-B-16), not {spec.name!r}")

    def describe(self, spec):
        return f"open_clip {spec.name} (pretrained tag {spec.variant})"

    def fetch(self, spec, dest):
        cfg = _open_clip_cfg(spec.name, spec.variant)
        if cfg.get("hf_hub"):
            repo, filename = os.path.split(cfg["hf_hub"].rstrip())
            safe = [filename[:-4] + ".safetensors"] if filename.endswith((".bin", ".pth")) else []
            info = _single_file(repo, [*safe, filename] if filename else list(OPEN_CLIP_FILES), dest)
        elif cfg.get("url"):
            info = _url_file(cfg["url"], dest)
        else:
            raise WeightsFetchError(f"open_clip's tag {spec.variant!r} of {spec.name!r} names no download")
        return {**info, "load": {"quick_gelu": bool(cfg.get("quick_gelu", False))}}

    def check_loadable(self, folder, manifest):
        from open_clip.factory import load_state_dict

        load_state_dict(str(folder / manifest["primary"]))


def open_clip_checkpoint(name: str, tag: str) -> tuple[WeightSpec, Path, dict]:
    """(spec, verified local file, load options) of an open_clip tag, for a job."""
    spec = WeightSpec("open_clip", name, tag)
    return spec, local_path(spec), open_clip_options(name, tag)


# --------------------------------------------------------------------------------------------
# timm

def _timm_cfg(name: str):
    import timm
    from timm.models import get_pretrained_cfg

    if not timm.is_model(name):
        raise WeightsError(f"timm has no model {name!r}")
    try:
        cfg = get_pretrained_cfg(name)
    except RuntimeError as error:
        raise WeightsError(f"timm: {error}") from None
    if cfg is None or not (cfg.hf_hub_id or cfg.url):
        raise WeightsError(f"timm has no pretrained weights for {name!r} (use pretrained: false or a checkpoint path)")
    return cfg


TIMM_FILES = ("model.safetensors", "pytorch_model.bin")


@register_weight_source("timm")
class TimmSource(WeightSource):
    def check_spec(self, spec):
        if "/" in spec.name:
            raise ValueError(f"timm weights name a model (architecture[.tag], e.g. resnet50.tv_in1k), not {spec.name!r}")

    def describe(self, spec):
        return f"timm {spec.name} hub weights"

    def fetch(self, spec, dest):
        cfg = _timm_cfg(spec.name)
        resolved = f"{cfg.architecture}.{cfg.tag}" if cfg.tag else cfg.architecture
        if cfg.hf_hub_id:
            candidates = [cfg.hf_hub_filename] if cfg.hf_hub_filename else list(TIMM_FILES)
            info = _single_file(cfg.hf_hub_id, candidates, dest)
        else:
            info = _url_file(cfg.url, dest)
        return {**info, "resolved": resolved}

    def check_loadable(self, folder, manifest):
        from timm.models import load_state_dict

        load_state_dict(str(folder / manifest["primary"]))


def timm_checkpoint(name: str) -> tuple[WeightSpec, str, dict]:
    """(spec, the resolved ``architecture.tag`` name, ``timm.create_model`` options) of ``name``'s hub
    weights, for a job: timm's own pretrained loader reads the verified local file."""
    spec = WeightSpec("timm", name)
    path = local_path(spec)
    resolved = local_manifest(spec).get("resolved") or name
    return spec, resolved, {"pretrained": True, "pretrained_cfg_overlay": {"file": str(path)}}


# --------------------------------------------------------------------------------------------
# Hugging Face repositories

HF_TEXT_SUFFIXES = (".json", ".txt", ".model", ".tiktoken")
HF_WEIGHTS = (("model.safetensors", "model.safetensors.index.json"), ("pytorch_model.bin", "pytorch_model.bin.index.json"))


@register_weight_source("hf")
class HuggingFaceSource(WeightSource):
    has_variant = True
    VARIANTS = ("model", "tokenizer")

    def check_spec(self, spec):
        if spec.variant not in self.VARIANTS:
            raise ValueError(f"hf weights variant must be one of {list(self.VARIANTS)}, not {spec.variant!r}")

    def describe(self, spec):
        what = "config, tokenizer and weights" if spec.variant == "model" else "config and tokenizer"
        return f"Hugging Face {spec.name} ({what})"

    def fetch(self, spec, dest):
        revision, files = hub_listing(spec.name)
        root = [f for f in files if "/" not in f]
        wanted = [f for f in root if f.endswith(HF_TEXT_SUFFIXES) and not f.endswith(".index.json")]
        if spec.variant == "model":
            for single, index in HF_WEIGHTS:
                if single in root:
                    wanted.append(single)
                    break
                if index in root:
                    hub_download(spec.name, index, revision, dest)
                    shards = sorted(set(json.loads((dest / index).read_text())["weight_map"].values()))
                    wanted += [index, *shards]
                    break
            else:
                raise WeightsFetchError(f"the Hugging Face repository {spec.name!r} has no PyTorch weights "
                                        f"({', '.join(s for s, _ in HF_WEIGHTS)} or their shards)")
        if "config.json" not in wanted:
            raise WeightsFetchError(f"the Hugging Face repository {spec.name!r} has no config.json")
        for name in dict.fromkeys(wanted):
            if not (dest / name).exists():
                hub_download(spec.name, name, revision, dest)
        return {"primary": None, "source": {"hub": spec.name, "revision": revision}}

    def check_loadable(self, folder, manifest):
        from transformers import AutoConfig, AutoTokenizer

        AutoConfig.from_pretrained(folder)
        AutoTokenizer.from_pretrained(folder)
        for name in manifest["files"]:
            if name.endswith((".safetensors", ".bin")):
                _load_state_dict(folder / name)


def hf_folder(spec: WeightSpec) -> Path:
    """The verified local folder of a Hugging Face repository, for ``from_pretrained``."""
    return local_path(spec)


# --------------------------------------------------------------------------------------------
# composite CLIPs (built, not fetched)

@register_weight_source("composite")
class CompositeAlignmentSource(WeightSource):
    """The fitted projections of a composite CLIP (:mod:`fedrepro.models.composite`): built on this
    machine from the towers' packaged weights and held-out pairs, once, like a download."""

    has_variant = True
    needs_internet = False

    def check_spec(self, spec):
        from . import composite

        if composite.config(spec.name) is None or spec.variant != "aligned":
            raise ValueError(f"composite weights are <composite CLIP>--aligned, not {spec.name!r} ({spec.variant!r})")

    def encoder_specs(self, name, pretrained, where):
        from . import composite

        return composite.weights(name, pretrained, where) if composite.config(name) is not None else None

    def describe(self, spec):
        return f"the aligned projections of the composite CLIP {spec.name}"

    def fetch(self, spec, dest):
        import torch

        from . import composite

        fitted = composite.align(spec.name)
        torch.save({"state": fitted["state"]}, dest / composite.ALIGNED_FILE)
        return {"primary": composite.ALIGNED_FILE, "source": {"built": "fedrepro.models.composite.align", "seed": 0,
                                                               **fitted["report"]}}

    def check_loadable(self, folder, manifest):
        from . import composite

        composite.read_alignment(WeightSpec("composite", manifest["spec"]["name"], "aligned"), folder / manifest["primary"])
