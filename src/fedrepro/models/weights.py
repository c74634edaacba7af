"""Pretrained weights as declared, checksummed resources: fetched once, loaded offline.

Compute nodes of a cluster often have no internet. So every model family declares, from its config
alone, the pretrained files it loads (``register_model(..., weights=fn)``, ``fn(cfg) ->
[WeightSpec]``; the functions below), the way it declares its decode specs. The ``weights`` rule (a
local job: it runs where Snakemake runs, on the login node, like the downloads) fetches each resource
once into ``resources/weights/<id>/`` and writes ``weights.json`` there last: every file's SHA-256
and size, the source and its revision. It changes only when the content does: fetching the same bytes
again (``--force``) leaves it as it was, so nothing made from it reruns; when and with which library
versions it was fetched is kept beside it (``.fetch.json``). Training, feature, embedding and
downstream jobs depend on those files, check them before they load any data (:func:`require`) and
load them from there with the hubs switched off (:func:`force_offline`): a compute node never reaches
the internet.

Configs name weights as they always did:

- CLIP encoders, ``encoder.pretrained: openai`` (an open_clip tag) -> ``open_clip--ViT-B-16--openai``:
  the tag's checkpoint file, loaded the way open_clip loads the tag (its QuickGELU and preprocessing
  settings included).
- timm backbones, ``pretrained: true`` -> ``timm--efficientnet_b0``: the file ``timm.create_model(name,
  pretrained=True)`` loads, resolved to its full name (e.g. ``efficientnet_b0.ra_in1k``) once.
- Hugging Face repositories (FedDRA's text tower and tokenizer): ``hf--bert-base-cased--model`` (config,
  tokenizer files and PyTorch weights of one revision) or ``hf--emilyalsentzer--Bio_ClinicalBERT--tokenizer``
  (config and tokenizer files only).

A path to a file or folder (a user's own checkpoint), ``package:<module>``, ``local-dir:`` and random
init (``pretrained: none`` / ``false``) need no resource. A missing resource, a file that is missing,
truncated or changed (size or SHA-256 against ``weights.json``), or one that does not load is a
:class:`WeightsError` naming the file and the exact command that fetches it.

The id of a resource is readable and reversible (:meth:`WeightSpec.from_id`), so ``fedrepro weights
<id>`` needs no configuration: ``<kind>--<name, "/" as "--">[--<variant>]``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from .. import paths
from ..io import file_digest, read_json, sha256_file, write_json

log = logging.getLogger(__name__)

MANIFEST = Path(paths.weights_manifest("x")).name          # weights.json, inside the resource's folder
FETCH_RECORD = Path(paths.weights_fetch_record("x")).name  # .fetch.json, beside it
OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
_PIECE = re.compile(r"[A-Za-z0-9_.+]+(?:-[A-Za-z0-9_.+]+)*")   # no leading/trailing "-", no "--"
LOCAL_SUFFIXES = (".bin", ".pt", ".pth", ".safetensors", ".ckpt")


class WeightsError(RuntimeError):
    """Pretrained weights a job needs are not usable; the message names the file and the fix."""


class WeightsMissing(WeightsError):
    pass


class WeightsCorrupt(WeightsError):
    pass


class WeightsFetchError(WeightsError):
    pass


# --------------------------------------------------------------------------------------------
# what a config needs

@dataclass(frozen=True)
class WeightSpec:
    """One pretrained-weights resource: a registered source ``kind`` (open_clip, timm, hf), the model
    name or repository id, and a ``variant`` (open_clip: the pretrained tag; hf: ``model`` or
    ``tokenizer``; timm: none). ``where`` says which config key asks for it (messages only)."""

    kind: str
    name: str
    variant: str = ""
    where: str = field(default="", compare=False)

    def __post_init__(self):
        source = weight_source(self.kind)
        if bool(self.variant) != source.has_variant:
            raise ValueError(f"{self.kind} weights {'need' if source.has_variant else 'take no'} variant "
                             f"({self.name!r}, variant {self.variant!r})")
        for piece in [*self.name.split("/"), *([self.variant] if self.variant else [])]:
            if not _PIECE.fullmatch(piece):
                raise ValueError(f"{self.kind} weights {self.name!r} ({self.variant!r}) cannot be named by an id: "
                                 f"{piece!r} is empty, has a '--' or starts or ends with '-'; use a local file or folder")
        source.check_spec(self)

    @property
    def id(self) -> str:
        return "--".join([self.kind, *self.name.split("/"), *([self.variant] if self.variant else [])])

    @classmethod
    def from_id(cls, weights_id: str) -> "WeightSpec":
        parts = weights_id.split("--")
        if len(parts) < 2:
            raise ValueError(f"{weights_id!r} is not a weights id (<kind>--<name>[--<variant>], e.g. "
                             f"open_clip--ViT-B-16--openai, timm--efficientnet_b0, hf--bert-base-cased--model)")
        from ..registry import WEIGHT_SOURCES

        kind = parts[0]
        if kind not in WEIGHT_SOURCES:
            raise ValueError(f"{weights_id!r}: unknown weights kind {kind!r}; known: {WEIGHT_SOURCES.names()}")
        source = weight_source(kind)
        name_parts = parts[1:-1] if source.has_variant else parts[1:]
        if not name_parts:
            raise ValueError(f"{weights_id!r}: {kind} weights ids are {kind}--<name>" + ("--<variant>" if source.has_variant else ""))
        return cls(kind, "/".join(name_parts), parts[-1] if source.has_variant else "")

    def describe(self) -> str:
        text = weight_source(self.kind).describe(self)
        return f"{text}, named by {self.where}" if self.where else text


def weight_source(kind: str) -> "WeightSource":
    from ..registry import WEIGHT_SOURCES

    return WEIGHT_SOURCES.get(kind).obj()


class WeightSource:
    """How weights of one kind are fetched (on a machine with internet) and checked."""

    has_variant = False
    needs_internet = True     # False: built here from what ships offline (a composite's alignment)

    def check_spec(self, spec: WeightSpec) -> None:
        """Refuse a spec this source cannot fetch (cheap, no import of the library)."""

    def encoder_specs(self, name: str, pretrained: str, where: str) -> list[WeightSpec] | None:
        """The resources of a CLIP encoder (``name``, ``pretrained``) this source builds itself, or None."""
        return None

    def describe(self, spec: WeightSpec) -> str:
        return f"{spec.kind} {spec.name}" + (f" ({spec.variant})" if spec.variant else "")

    def fetch(self, spec: WeightSpec, dest: Path) -> dict:
        """Download the files into ``dest``; -> {"primary": file the loaders open (or None for a
        folder), "source": where it came from (hub repo + revision, URL), ...}."""
        raise NotImplementedError

    def check_loadable(self, folder: Path, manifest: dict) -> None:
        """Raise if the fetched files do not load (run once, at fetch time)."""


def is_local_path(value) -> bool:
    """A ``pretrained`` value that names a user's own file (never fetched)."""
    return isinstance(value, str) and ("/" in value or value.endswith(LOCAL_SUFFIXES) or Path(value).is_file())


def encoder_weights(encoder: dict, where: str = "train.model.encoder") -> list[WeightSpec]:
    """The open_clip checkpoint of a CLIP encoder spec (``name``, ``pretrained``)."""
    from ..registry import WEIGHT_SOURCES

    name, pretrained = encoder["name"], encoder.get("pretrained")
    if pretrained in (None, "", "none") or name.startswith("local-dir:") or is_local_path(pretrained):
        return []
    for kind in WEIGHT_SOURCES.names():        # a source that builds this encoder itself (a composite CLIP)
        specs = weight_source(kind).encoder_specs(name, pretrained, f"{where}.pretrained: {pretrained}")
        if specs is not None:
            return specs
    if name.startswith("hf-hub:"):
        raise ValueError(f"{where}.name {name!r}: hf-hub: models are not fetched by the weights rule; export the "
                         f"model to a folder and use local-dir:<folder>, or use an open_clip name with a pretrained tag")
    return [WeightSpec("open_clip", name, pretrained, where=f"{where}.pretrained: {pretrained}")]


def clip_weights(cfg: dict) -> list[WeightSpec]:
    return encoder_weights(cfg["encoder"])


def timm_spec(backbone: str, pretrained, where: str) -> list[WeightSpec]:
    """``pretrained: true`` -> timm's hub weights of ``backbone``; false or a path -> nothing to fetch."""
    return [WeightSpec("timm", backbone, where=f"{where}: true")] if pretrained is True else []


def timm_weights(cfg: dict) -> list[WeightSpec]:
    return timm_spec(cfg["backbone"], cfg["pretrained"], "train.model.pretrained")


def weight_specs(model: dict) -> list[WeightSpec]:
    """The pretrained resources a model config (a resolved ``train.model``) loads, without duplicates."""
    from ..registry import MODELS

    fn = MODELS.get(model["family"])["weights"]
    return list(dict.fromkeys(fn(model))) if fn else []


# --------------------------------------------------------------------------------------------
# the local copies

def folder(spec: WeightSpec, root: str | Path = paths.WEIGHTS_DIR) -> Path:
    return Path(paths.weights_dir(spec.id, str(root)))


def manifest_path(spec: WeightSpec, root: str | Path = paths.WEIGHTS_DIR) -> Path:
    return Path(paths.weights_manifest(spec.id, str(root)))


def fetch_command(spec: WeightSpec, root: str | Path = paths.WEIGHTS_DIR, force: bool = False) -> str:
    """The commands that fetch ``spec`` (run them on a machine with internet, e.g. the login node)."""
    extra = f" --root {root}" if str(root) != paths.WEIGHTS_DIR else ""
    again = " --force" if force else ""
    return (f"    fedrepro weights {spec.id}{extra}{again}\n"
            f"or, through the workflow, `snakemake --cores 1 {manifest_path(spec, root)}`"
            + (f" after deleting {folder(spec, root)}" if force else "")
            + "; `snakemake --cores 1 all_weights` fetches every resource the configuration needs")


def read_manifest(spec: WeightSpec, root: str | Path = paths.WEIGHTS_DIR) -> dict:
    path = manifest_path(spec, root)
    if not path.is_file():
        raise WeightsMissing(
            f"pretrained weights {spec.describe()} are not on this machine: {path} does not exist. Jobs never "
            f"download (compute nodes often have no internet); fetch them once on a machine with internet, "
            f"e.g. the login node:\n{fetch_command(spec, root)}")
    try:
        manifest = read_json(path)
        files = manifest["files"]
        assert isinstance(files, dict) and files and manifest["id"] == spec.id
    except (ValueError, KeyError, TypeError, AssertionError):
        raise WeightsCorrupt(f"{path} is not a weights manifest of {spec.id}; fetch the weights again:\n"
                             f"{fetch_command(spec, root, force=True)}") from None
    return manifest


def check(spec: WeightSpec, root: str | Path = paths.WEIGHTS_DIR, deep: bool = True) -> dict:
    """The manifest of a local copy whose every file is present with its recorded size and (``deep``)
    SHA-256; else a :class:`WeightsError` naming the file and the command that fetches it again."""
    manifest = read_manifest(spec, root)
    base = folder(spec, root)
    for name, record in sorted(manifest["files"].items()):
        path = base / name
        if not path.is_file():
            raise WeightsMissing(f"{path} is missing ({manifest_path(spec, root)} lists it): the local copy of "
                                 f"{spec.describe()} is incomplete. Fetch it again:\n{fetch_command(spec, root, force=True)}")
        size = path.stat().st_size
        if size != record["bytes"]:
            raise WeightsCorrupt(f"{path} is {size} bytes but {manifest_path(spec, root)} records {record['bytes']}: "
                                 f"the file is truncated or was replaced. Fetch it again:\n"
                                 f"{fetch_command(spec, root, force=True)}")
        if deep:
            digest = file_digest(path)
            if digest != record["sha256"]:
                raise WeightsCorrupt(f"{path}: SHA-256 {digest} does not match {record['sha256']} recorded in "
                                     f"{manifest_path(spec, root)}: the file was changed or is corrupt. Fetch it "
                                     f"again:\n{fetch_command(spec, root, force=True)}")
    return manifest


def require(specs, root: str | Path = paths.WEIGHTS_DIR) -> dict[str, dict]:
    """Check every resource a job needs (full SHA-256) before it loads any data; -> provenance
    (id -> every file's SHA-256) for the job's manifest."""
    return {spec.id: {name: r["sha256"] for name, r in check(spec, root)["files"].items()} for spec in specs}


def local_path(spec: WeightSpec, root: str | Path = paths.WEIGHTS_DIR) -> Path:
    """The verified local file (single-file kinds) or folder (Hugging Face repositories) of ``spec``."""
    manifest = check(spec, root)
    return folder(spec, root) / manifest["primary"] if manifest.get("primary") else folder(spec, root)


def local_manifest(spec: WeightSpec, root: str | Path = paths.WEIGHTS_DIR) -> dict:
    return check(spec, root)


class WeightsLoadError(WeightsError):
    pass


@contextlib.contextmanager
def loading(spec: WeightSpec, path: Path, root: str | Path = paths.WEIGHTS_DIR):
    """Turn any failure of a library loading the verified local copy ``path`` into a
    :class:`WeightsLoadError` that names the file, the config key and the fetch command (no raw hub
    or unpickling error reaches the user)."""
    try:
        yield
    except WeightsError:
        raise
    except Exception as error:   # noqa: BLE001 - whatever the library raises, the user needs the same facts
        text = str(error).strip()
        raise WeightsLoadError(
            f"loading {path} ({spec.describe()}) failed: {type(error).__name__}: {text.splitlines()[0] if text else ''}\n"
            f"The file matches the SHA-256 recorded when it was fetched; check that the model settings in the config "
            f"fit these weights, or, if it was fetched with another library version, fetch it again:\n"
            f"{fetch_command(spec, root, force=True)}") from error


def force_offline() -> None:
    """Switch the Hugging Face hub (transformers, timm, open_clip use it) offline for this process:
    a job loads its weights from resources/weights and must never wait for a network it may not have."""
    os.environ.update(OFFLINE_ENV)
    constants = sys.modules.get("huggingface_hub.constants")
    if constants is not None:
        constants.HF_HUB_OFFLINE = True


# --------------------------------------------------------------------------------------------
# fetching (the weights rule, on a machine with internet)

def _versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for package in ("open_clip_torch", "timm", "transformers", "huggingface_hub", "torch"):
        with contextlib.suppress(PackageNotFoundError):
            out[package] = version(package)
    return out


def fetch(spec: WeightSpec, root: str | Path = paths.WEIGHTS_DIR, force: bool = False) -> dict:
    """Fetch ``spec`` into ``<root>/<id>/`` unless a verified copy is there (``force``: always); the
    files land in a staging folder, are hashed, checked to load, and replace the old copy at once;
    ``weights.json`` is written last. -> the manifest."""
    source = weight_source(spec.kind)
    if source.needs_internet and any(os.environ.get(name, "").lower() in ("1", "true", "yes")
                                     for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")):
        raise WeightsFetchError(f"cannot fetch {spec.id}: HF_HUB_OFFLINE / TRANSFORMERS_OFFLINE is set in this shell. "
                                f"Fetch on a machine with internet (the login node) with the hubs online.")
    if not force:
        with contextlib.suppress(WeightsError):
            manifest = check(spec, root)
            log.info("%s: already fetched and verified (%s)", spec.id, manifest_path(spec, root))
            return manifest
    final = folder(spec, root)
    for stale in final.parent.glob(f".{spec.id}.partial-*"):      # left by a fetch that was killed
        shutil.rmtree(stale, ignore_errors=True)
    staging = final.parent / f".{spec.id}.partial-{os.getpid()}"
    staging.mkdir(parents=True)
    try:
        log.info("%s: fetching %s", spec.id, spec.describe())
        info = source.fetch(spec, staging)
        for hidden in [p for p in staging.iterdir() if p.name.startswith(".")]:   # hub download metadata
            shutil.rmtree(hidden) if hidden.is_dir() else hidden.unlink()
        files = sorted(p for p in staging.rglob("*") if p.is_file())
        if not files:
            raise WeightsFetchError(f"{spec.id}: the source gave no files")
        if any(p.name == MANIFEST for p in files):
            raise WeightsFetchError(f"{spec.id}: the source has a file named {MANIFEST}, which would clash with the manifest")
        manifest = {
            "id": spec.id,
            "spec": {"kind": spec.kind, "name": spec.name, "variant": spec.variant},
            "primary": info.get("primary"),
            "files": {p.relative_to(staging).as_posix(): {"sha256": sha256_file(p), "bytes": p.stat().st_size}
                      for p in files},
            **{k: v for k, v in info.items() if k != "primary"},
        }
        source.check_loadable(staging, manifest)
        unchanged = recorded_content(final / MANIFEST) == manifest
        if unchanged:      # the same bytes again: the manifest stays as it was, so nothing made from it reruns
            shutil.copy2(final / MANIFEST, staging / MANIFEST)
        else:
            write_json(staging / MANIFEST, manifest)
        # when and with which libraries: beside the manifest, not in it (a refetch of the same bytes changes nothing)
        write_json(staging / FETCH_RECORD, {"fetched_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "versions": _versions()})
        if final.exists():
            shutil.rmtree(final)
        os.replace(staging, final)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    total = sum(r["bytes"] for r in manifest["files"].values())
    log.info("%s: %d file(s), %.1f MB -> %s%s", spec.id, len(manifest["files"]), total / 1e6, final,
             f" (the same content as before: {MANIFEST} unchanged)" if unchanged else "")
    return manifest


VOLATILE = ("fetched_at", "versions")   # what manifests written before kept in weights.json itself


def recorded_content(manifest: Path) -> dict | None:
    """What a weights manifest says about the content (files, source, revision), or None if there is none."""
    try:
        recorded = read_json(manifest)
    except (OSError, ValueError):
        return None
    return {k: v for k, v in recorded.items() if k not in VOLATILE} if isinstance(recorded, dict) else None
