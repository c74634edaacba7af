"""Client splits: a partition spec + a split seed -> which manifest rows each client holds.

Flow (every step deterministic in its seed: the split seed, or where the spec names them ``partition_seed`` for
step 5 and ``client_seed`` for step 6, as an authors' code that redraws only one of them with its run seed):
1. ``subset``: optionally restrict the manifest to some sources/classes.
2. ``external``: set aside whole sources as an external evaluation set (e.g. another dataset of
   a derived manifest), evaluated on but never trained on.
3. ``global_test``: set aside the global evaluation set: the official test split, whole target
   sources (leave-one-domain-out), a stratified fraction, or nothing. A sources rule (here or in
   ``external``) may keep only a stratified ``fraction`` of those sources; their other rows are then
   used by nobody (the demo keeps its evaluation sets small this way).
4. ``reference``: carve a disjoint part of the global set out as *unlabeled* target images for
   domain adaptation under the clean protocol (never evaluated on).
5. partition the remaining pool among clients with a registered splitter (iid, per-class
   Dirichlet, by source, pathological, ...). A splitter may also hold out pool rows as (part of)
   the global test set by returning a :class:`Partition` (e.g. a held-out site chosen by rank).
   A splitter may be held to the client sizes a paper printed (``sizes``: :func:`split_iid`,
   :func:`dirichlet_with_sizes`).
6. split each client into train/val/test with the configured ratios.
   With ``client_split: official`` each client is instead cut by the manifest's official split
   column, so that every client's test part comes from the dataset's official test split
   (MIMIC-CXR in FedDRA; ``merge_splits`` reads one official split as another part, e.g. MGCA's "valid").
   ``client_split: imagefolder`` is the FACMIC / FAA-CLIP code's cut (:func:`_imagefolder_parts`), which may
   leave a row or two of a client in no part: the split records every client's whole ``size``.

Every pool row ends up in exactly one client and one of its splits, and the clients, the global test,
reference and external sets are disjoint; a splitter that reproduces an overlap on purpose (FedAdapterProto's
authors' indexing) says so in its :class:`Partition`, and the split file lists it under ``declared_overlaps``
(each training run checks the rest: :func:`fedrepro.fl.federation.check_disjoint`). A client whose training part
would be smaller than ``min_train`` is an error, or (``on_empty: resample``) the partition is drawn
again with the next stream of the split seed, at most ``max_draws`` times; the number of draws is
recorded in the split file.
"""

from __future__ import annotations

import difflib
import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from ..io import broken, content_damage, hash_obj
from ..registry import SPLITTERS, splitter
from ..seeding import numpy_rng
from .margins import MarginError, apportion, fit_table


class SplitError(ValueError):
    pass


def check_sources(names, present, key: str, where: str = "the manifest") -> None:
    """Refuse source names a split lists that are not among ``present`` (the manifest's ``source`` values, or the
    pool's): a typo would otherwise drop that source's rows without a word. The dataset does not declare its
    sources (only its manifest knows them), so this is the split job's check, not the configuration's."""
    present = sorted(set(map(str, present)))
    unknown = sorted(set(names) - set(present))
    if unknown:
        close = difflib.get_close_matches(unknown[0], present, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise SplitError(f"{key}: sources {unknown} are not in {where}{hint}; available: {present}")


OVERLAP_PARTS = ("clients", "global_test", "reference", "external")


def check_overlaps(declared: list[dict], where: str) -> list[dict]:
    """``declared_overlaps`` entries: ``{"parts": [a, b], "reason": "..."}`` with a, b in :data:`OVERLAP_PARTS`
    (``clients`` = every client's train/val/test; ``[clients, clients]``: clients may share rows)."""
    for entry in declared:
        parts = entry.get("parts") if isinstance(entry, dict) else None
        if (not isinstance(parts, list) or len(parts) != 2 or not set(parts) <= set(OVERLAP_PARTS)
                or not str(entry.get("reason", "")).strip()):
            raise SplitError(f"{where}: declared_overlaps entry {entry!r} must be {{parts: [a, b], reason: ...}} with "
                             f"a, b in {list(OVERLAP_PARTS)} and a reason")
    return declared


@dataclass
class Split:
    clients: dict[str, dict[str, np.ndarray]]   # client name -> {"train", "val", "test"} -> row indices
    global_test: np.ndarray
    reference: np.ndarray
    draws: int = 1
    external: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=int))   # external evaluation set
    # overlaps the splitter produces on purpose: [{"parts": [a, b], "reason": ...}] (else every part is disjoint)
    declared_overlaps: list[dict] = field(default_factory=list)
    # every client's whole size before its train/val/test cut (the rows a cut leaves out included; e.g. the
    # FACMIC code's int() cuts): the "samples of each client" a paper prints. Missing: train + val + test
    sizes: dict[str, int] = field(default_factory=dict)

    def size(self, client: str) -> int:
        return int(self.sizes.get(client, sum(len(v) for v in self.clients[client].values())))

    def assigned(self) -> np.ndarray:
        parts = [idx for client in self.clients.values() for idx in client.values()]
        return np.concatenate(parts + [self.global_test, self.reference, self.external]).astype(int)

    def to_json(self) -> dict:
        return {
            "clients": {name: {k: v.tolist() for k, v in parts.items()} for name, parts in self.clients.items()},
            "global_test": self.global_test.tolist(),
            "reference": self.reference.tolist(),
            "external": self.external.tolist(),
            "draws": self.draws,
            "declared_overlaps": self.declared_overlaps,
            "sizes": {name: int(n) for name, n in self.sizes.items()},
        }

    @classmethod
    def from_json(cls, data: dict) -> "Split":
        as_array = lambda v: np.asarray(v, dtype=int)  # noqa: E731
        return cls(
            clients={name: {k: as_array(v) for k, v in parts.items()} for name, parts in data["clients"].items()},
            global_test=as_array(data["global_test"]),
            reference=as_array(data["reference"]),
            draws=data.get("draws", 1),
            external=as_array(data.get("external", [])),
            declared_overlaps=check_overlaps(data.get("declared_overlaps", []), "split file"),
            sizes={name: int(n) for name, n in data.get("sizes", {}).items()},
        )


SPLIT_FILE_KEYS = ("dataset", "seed", "manifest_sha256", "clients", "global_test", "reference")


def read_split_file(path: str | Path) -> dict:
    """A split file as ``fedrepro split`` wrote it; a truncated or corrupt one, or one whose content no longer
    matches the SHA-256 recorded in it (:func:`fedrepro.io.with_content_digest`), is set aside and named with the
    command that rebuilds it."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise broken(path, f"not a readable split file ({error})") from None
    missing = [k for k in SPLIT_FILE_KEYS if k not in data] if isinstance(data, dict) else list(SPLIT_FILE_KEYS)
    if missing:
        raise broken(path, f"not a complete split file (missing {missing})")
    damage = content_damage(data)
    if damage:
        raise broken(path, damage)
    return data


@dataclass
class Partition:
    """What a splitter returns when it also holds rows out: the clients' parts, plus pool rows that
    join the global test set (e.g. a held-out site picked by rank). Indices are relative to the pool.
    A client's part is its rows (cut into train/val/test by the spec's ``ratios``) or, where the
    splitter cuts them itself (an authors' own validation set), ``{"train": ..., "val": ...}``.
    ``overlaps``: the overlaps it produces on purpose, as the split file's ``declared_overlaps``."""

    clients: list[np.ndarray] | list[dict[str, np.ndarray]]
    held_out: np.ndarray
    overlaps: list[dict] = field(default_factory=list)


# --------------------------------------------------------------------------------------------
# splitters: (labels of the pool, sources of the pool, spec, rng) -> one index array per client
# (or a Partition), indices relative to the pool. Register new ones with @splitter("name")
# (fedrepro.registry). A splitter may set ``fn.pool_order = "<manifest column>"`` to receive the pool
# sorted by that column (``fn.pool_order_required = True``: a manifest without it is an error;
# ``fn.pool_order_only = True``: rows without a value are left out), and ``fn.legacy_rng = True`` to
# receive ``numpy.random.RandomState(split seed)``, the stream an authors' numpy code draws from, instead
# of a derived ``numpy.random.Generator``.


def client_sizes(spec: dict, pool: int) -> np.ndarray | None:
    """The clients' sizes a split spec fixes (``sizes``: one per client, as a paper printed them), or None. They
    may sum to less than the pool (the rest is used by nobody), never to more."""
    if "sizes" not in spec:
        return None
    sizes = np.asarray(spec["sizes"], dtype=np.int64)
    if len(sizes) != spec["clients"]:
        raise SplitError(f"{spec['kind']}: sizes lists {len(sizes)} clients, clients is {spec['clients']}")
    if sizes.sum() > pool:
        raise SplitError(f"{spec['kind']}: sizes sum to {int(sizes.sum())} but the pool holds {pool} rows")
    return sizes


@splitter("iid")
def split_iid(labels, sources, spec, rng):
    """Shuffle and cut into ``clients`` parts of equal size (sizes differ by at most one), or of the
    ``sizes`` given (the rest of the shuffle is used by nobody)."""
    order = rng.permutation(len(labels))
    sizes = client_sizes(spec, len(labels))
    if sizes is not None:
        return [np.sort(part) for part in np.split(order[:sizes.sum()], np.cumsum(sizes)[:-1])]
    return [np.sort(part) for part in np.array_split(order, spec["clients"])]


@splitter("dirichlet")
def split_dirichlet(labels, sources, spec, rng):
    """FACMIC's non-IID split: for each class draw p ~ Dir(alpha * 1_N) and divide that class's
    (shuffled) examples among the N clients in proportions p. With ``sizes`` the draw is made to hold
    them exactly (:func:`dirichlet_with_sizes`)."""
    n_clients, alpha = spec["clients"], float(spec["alpha"])
    if "sizes" in spec:
        return dirichlet_with_sizes(labels, spec, rng)
    parts: list[list[np.ndarray]] = [[] for _ in range(n_clients)]
    for c in np.unique(labels):
        members = rng.permutation(np.flatnonzero(labels == c))
        p = rng.dirichlet(np.full(n_clients, alpha))
        cuts = np.round(np.cumsum(p)[:-1] * len(members)).astype(int)
        for client, chunk in enumerate(np.split(members, cuts)):
            parts[client].append(chunk)
    return [np.sort(np.concatenate(p)) for p in parts]


DIRICHLET_CANDIDATES = 1000


def dirichlet_with_sizes(labels: np.ndarray, spec: dict, rng) -> list[np.ndarray]:
    """A per-class Dirichlet partition with the clients' sizes a paper printed (``sizes``), every client
    holding at least ``min_per_class`` images of every class (the FACMIC / FAA-CLIP loaders read each
    client with a torchvision ImageFolder, which refuses an empty class folder). A constrained draw:

    1. ``candidates`` (1000) draws of the class x client proportions, p_c ~ Dir(alpha 1_N) for every class;
    2. the draw whose client shares (sum_c n_c p_c / n) are nearest the printed ones (Kullback-Leibler);
    3. its class x client counts n_c p_c fitted to the class counts and the printed sizes exactly
       (:func:`fedrepro.data.margins.fit_table`: proportional fitting above the floor, integer rounding);
       where the sizes sum to less than the pool, one more column takes the rest (a class-proportional
       share of every class), used by nobody;
    4. each class's shuffled rows cut at those counts.
    """
    n_clients, alpha = spec["clients"], float(spec["alpha"])
    sizes = client_sizes(spec, len(labels))
    classes = np.unique(labels)
    counts = np.array([(labels == c).sum() for c in classes], dtype=np.int64)
    draws = rng.dirichlet(np.full(n_clients, alpha), size=(int(spec.get("candidates", DIRICHLET_CANDIDATES)), len(classes)))
    shares = np.einsum("c,kcn->kn", counts / counts.sum(), draws)
    target = sizes / sizes.sum()
    best = draws[int(np.argmin((target * np.log(target / np.maximum(shares, 1e-300))).sum(axis=1)))]
    unused = len(labels) - int(sizes.sum())
    seed = np.hstack([counts[:, None] * best * (sizes.sum() / len(labels)), counts[:, None] * unused / len(labels)])
    floor = np.zeros(seed.shape, dtype=np.int64)
    floor[:, :n_clients] = int(spec.get("min_per_class", 0))
    try:
        table = fit_table(seed, counts, np.append(sizes, unused), floor)
    except MarginError as error:
        raise SplitError(f"dirichlet with sizes {sizes.tolist()} and min_per_class {int(floor.max(initial=0))} on class "
                         f"counts {counts.tolist()}: {error}") from None
    parts: list[list[np.ndarray]] = [[] for _ in range(n_clients)]
    for c, row in zip(classes, table):
        members = rng.permutation(np.flatnonzero(labels == c))
        for client, chunk in enumerate(np.split(members, np.cumsum(row)[:-1])[:n_clients]):
            parts[client].append(chunk)
    return [np.sort(np.concatenate(p)) for p in parts]


@splitter("by_source")
def split_by_source(labels, sources, spec, rng):
    """One client per source (site, domain), in the order of ``sources`` (default: sorted); with
    ``per_source`` each source is itself split into several clients by another splitter."""
    names = spec.get("sources") or sorted(set(sources))
    check_sources(names, sources, "by_source", "the pool")
    inner = spec.get("per_source")
    out = []
    for name in names:
        members = np.flatnonzero(sources == name)
        if inner is None:
            out.append(members)
            continue
        for part in SPLITTERS.get(inner["kind"]).obj(labels[members], sources[members], inner, rng):
            out.append(members[part])
    return out


@splitter("pathological")
def split_pathological(labels, sources, spec, rng):
    """Each client holds ``classes_per_client`` classes; classes are dealt out round-robin over a
    shuffled class order, and a class held by several clients is divided equally among them.
    With clients * classes_per_client == number of classes, clients hold disjoint classes."""
    n_clients, k = spec["clients"], spec["classes_per_client"]
    classes = rng.permutation(np.unique(labels))
    if k > len(classes):
        raise SplitError(f"pathological: classes_per_client={k} but the pool has only {len(classes)} classes")
    holders: dict[int, list[int]] = {}
    for client in range(n_clients):
        for j in range(k):
            holders.setdefault(int(classes[(client * k + j) % len(classes)]), []).append(client)
    parts: list[list[np.ndarray]] = [[] for _ in range(n_clients)]
    for c, owners in holders.items():
        members = rng.permutation(np.flatnonzero(labels == c))
        for owner, chunk in zip(owners, np.array_split(members, len(owners))):
            parts[owner].append(chunk)
    return [np.sort(np.concatenate(p)) if p else np.zeros(0, dtype=int) for p in parts]


# --------------------------------------------------------------------------------------------

DEFAULT_RATIOS = {"train": 0.8, "val": 0.1, "test": 0.1}


CLIENT_SPLITS = ("random", "official", "imagefolder")


def make_split(manifest: pd.DataFrame, spec: dict, seed: int, class_folders: list[str] | None = None) -> Split:
    """``seed``: the split seed. The clients' draw takes ``spec['partition_seed']`` where the spec names one, their
    train/val/test cut ``spec['client_seed']`` (default: the partition seed), so that an authors' code that seeds
    only one of them with its run seed is followed (the configuration turns ``run`` into the run's seed); the
    external, global and reference sets always take the split seed. ``class_folders``: the folder name of every class, in label order, that the
    authors' ImageFolder sorted (``client_split: imagefolder``; default the manifest's class names)."""
    labels_all = manifest["label"].to_numpy()
    sources_all = manifest["source"].to_numpy().astype(str)
    rows = _subset_rows(manifest, spec.get("subset"))
    external, rows = _external(manifest, rows, spec.get("external"), numpy_rng(seed, "split", "external"))

    rng = numpy_rng(seed, "split", "global")
    global_rows, pool = _global_test(manifest, rows, spec.get("global_test", "none"), rng)
    fraction = float(spec.get("reference_fraction", 0.0))
    reference, global_rows = _reference(global_rows, fraction, rng)

    kind = spec["kind"]
    if kind not in SPLITTERS:
        raise SplitError(f"unknown split kind {kind!r}; allowed: {SPLITTERS.names()}")
    split_fn = SPLITTERS.get(kind).obj
    order_column = getattr(split_fn, "pool_order", None)
    if getattr(split_fn, "pool_order_required", False) and order_column not in manifest.columns:
        raise SplitError(f"split kind {kind!r} needs the manifest column {order_column!r} (the order of the authors' "
                         f"table); prepare the dataset again (fedrepro prepare <dataset>) or use another split kind")
    pool = _in_pool_order(manifest, pool, order_column, getattr(split_fn, "pool_order_only", False))
    min_train = int(spec.get("min_train", 1))
    max_draws = int(spec.get("max_draws", 100)) if spec.get("on_empty", "error") == "resample" else 1
    legacy = getattr(split_fn, "legacy_rng", False)
    if legacy and max_draws > 1:
        raise SplitError(f"split kind {kind!r} draws from the authors' RandomState(seed) once: on_empty: resample "
                         f"cannot redraw it")
    client_split = spec.get("client_split", "random")
    if client_split not in CLIENT_SPLITS:
        raise SplitError(f"unknown client_split {client_split!r}; allowed: {list(CLIENT_SPLITS)}")
    if client_split == "official" and spec.get("global_test", "none") == "official":
        raise SplitError("client_split: official keeps each client's official test rows, so global_test cannot also "
                         "be 'official'; use global_test: none (or a fraction / sources)")
    if spec.get("merge_splits") and client_split != "official":
        raise SplitError("merge_splits renames official splits: it needs client_split: official")
    partition_seed = spec.get("partition_seed", seed)
    client_seed = spec.get("client_seed", partition_seed)
    for key, value in (("partition_seed", partition_seed), ("client_seed", client_seed)):
        if not isinstance(value, int):
            raise SplitError(f"{key} {value!r}: an integer here (the configuration turns 'run' into the run's seed)")
    cut = _client_cut(manifest, spec, client_split, client_seed, class_folders)
    for draw in range(1, max_draws + 1):
        rng = np.random.RandomState(partition_seed) if legacy else numpy_rng(partition_seed, "split", "partition", draw)
        parts = split_fn(labels_all[pool], sources_all[pool], spec, rng)
        held_ref, held_test = np.zeros(0, dtype=int), np.zeros(0, dtype=int)
        overlaps: list[dict] = []
        if isinstance(parts, Partition):
            held = pool[np.asarray(parts.held_out, dtype=int)]
            held_ref, held_test = _reference(held, fraction, numpy_rng(seed, "split", "held_out", draw))
            overlaps = check_overlaps(parts.overlaps, f"split kind {kind!r}")
            parts = parts.clients
        keep = spec.get("keep_clients") or len(parts)
        if keep > len(parts):
            raise SplitError(f"split keep_clients: {keep} exceeds the {len(parts)} clients the {kind} split makes")
        parts = parts[:keep]                     # the rows of the clients left out: used by nobody
        clients = {f"client{i}": _given_parts(pool, part) if isinstance(part, dict) else cut(pool[part], i)
                   for i, part in enumerate(parts)}
        sizes = {f"client{i}": len(part) if not isinstance(part, dict) else sum(len(v) for v in part.values())
                 for i, part in enumerate(parts)}
        small = {name: len(p["train"]) for name, p in clients.items() if len(p["train"]) < min_train}
        if not small:
            return Split(clients, np.sort(np.concatenate([global_rows, held_test])).astype(int),
                         np.sort(np.concatenate([reference, held_ref])).astype(int), draws=draw, external=external,
                         declared_overlaps=overlaps, sizes=sizes)
    hint = " (set on_empty: resample to redraw)" if max_draws == 1 else f" after {max_draws} draws"
    shown = dict(list(small.items())[:10])                   # a handful: 5000 clients must not make a 80 KB line
    more = f" and {len(small) - len(shown)} more" if len(small) > len(shown) else ""
    too_many = (f" ({len(clients)} clients for the {len(pool)} images of the pool: at most {len(pool) // max(min_train, 1)} "
                f"can each have {min_train})" if len(clients) * min_train > len(pool) else "")
    raise SplitError(
        f"{kind} split leaves {len(small)} of {len(clients)} clients with fewer than min_train={min_train} training "
        f"samples{hint}{too_many}: {shown}{more}. Use fewer clients, a larger alpha, or a smaller min_train."
    )


def _client_cut(manifest: pd.DataFrame, spec: dict, client_split: str, client_seed: int, class_folders):
    """(a client's manifest rows, its index) -> its {"train", "val", "test"} rows, by ``client_split``."""
    ratios = spec.get("ratios", DEFAULT_RATIOS)
    if client_split == "official":
        marks = manifest["split"].to_numpy().astype(object)
        for official, part in (spec.get("merge_splits") or {}).items():
            marks = np.where(marks == official, part, marks)
        return lambda rows, i: _official_parts(rows, marks)
    if client_split == "imagefolder":
        rank = imagefolder_rank(manifest, class_folders)
        return lambda rows, i: _imagefolder_parts(rows, ratios, rank, client_seed)
    return lambda rows, i: _client_parts(rows, ratios, numpy_rng(client_seed, "split", "client", i))


def imagefolder_rank(manifest: pd.DataFrame, class_folders: list[str] | None = None) -> np.ndarray:
    """Each row's position in the order a torchvision ImageFolder lists a folder of class folders holding these
    images (``make_dataset``: the class folders sorted by name, the file names sorted within each):
    sorted by (the class's folder name, the file's name)."""
    names = list(class_folders) if class_folders is not None else None
    labels = manifest["label"].to_numpy()
    folders = [names[label] for label in labels] if names else manifest["class_name"].astype(str).tolist()
    files = [path.rsplit("/", 1)[-1] for path in manifest["path"].astype(str)]
    order = sorted(range(len(manifest)), key=lambda i: (folders[i], files[i]))
    rank = np.empty(len(manifest), dtype=np.int64)
    rank[order] = np.arange(len(manifest))
    return rank


def _in_pool_order(manifest: pd.DataFrame, pool: np.ndarray, column: str | None, only: bool = False) -> np.ndarray:
    """The pool as the splitter sees it: manifest order, or sorted by a manifest column a splitter
    names as its ``pool_order`` (e.g. a dataset's original table order; rows without a value last, or, where the
    splitter sets ``pool_order_only``, left out: rows that were never in that table)."""
    if column is None or column not in manifest.columns:
        return pool
    key = pd.to_numeric(manifest[column].to_numpy()[pool], errors="coerce")
    if only:
        pool, key = pool[~np.isnan(key)], key[~np.isnan(key)]
    return pool[np.argsort(np.where(np.isnan(key), np.inf, key), kind="stable")]


def task_classes(classes, spec: dict) -> list[int]:
    """The dataset labels a split's task classifies, in label order: the classes its ``subset`` keeps, or every
    class of the dataset. A model trained on the split scores exactly these (a 5-class subset is a 5-way task,
    not a 10-way classifier with 5 classes never seen)."""
    kept = (spec.get("subset") or {}).get("classes")
    return [i for i, name in enumerate(classes) if kept is None or name in kept]


def task_labels(labels: np.ndarray, classes: list[int] | None) -> np.ndarray:
    """Dataset labels as the task's labels: the position of each in ``classes`` (the dataset labels the task
    keeps, :func:`task_classes`); None = every class, labels unchanged."""
    labels = np.asarray(labels, dtype=np.int64)
    if classes is None:
        return labels
    lookup = np.full(int(max(labels.max(initial=0), max(classes)) + 1), -1, dtype=np.int64)
    lookup[list(classes)] = np.arange(len(classes))
    return lookup[labels]        # -1 for a class the task does not keep: such rows are in no part of the split


def _subset_rows(manifest: pd.DataFrame, subset: dict | None) -> np.ndarray:
    mask = np.ones(len(manifest), dtype=bool)
    if subset:
        if "sources" in subset:
            check_sources(subset["sources"], manifest["source"].unique(), "subset")
            mask &= manifest["source"].isin(subset["sources"]).to_numpy()
        if "classes" in subset:
            mask &= manifest["class_name"].isin(subset["classes"]).to_numpy()
        if "splits" in subset:
            mask &= manifest["split"].isin(subset["splits"]).to_numpy()
    rows = np.flatnonzero(mask)
    if not len(rows):
        raise SplitError(f"subset {subset} selects no rows")
    return rows


def _external(manifest: pd.DataFrame, rows: np.ndarray, rule: dict | None, rng) -> tuple[np.ndarray, np.ndarray]:
    """-> (external evaluation rows, remaining rows): the rows of the listed sources (a stratified
    ``fraction`` of them if given; the others are left out of the split)."""
    if not rule:
        return np.zeros(0, dtype=int), rows
    sources = manifest["source"].to_numpy().astype(str)[rows]
    check_sources(rule["sources"], sources, "external")
    chosen = np.isin(sources, rule["sources"])
    return _source_fraction(manifest, rows[chosen], rule, rng), rows[~chosen]


def _source_fraction(manifest: pd.DataFrame, rows: np.ndarray, rule: dict, rng) -> np.ndarray:
    """``rows`` (the rows of a rule's sources), or a stratified ``fraction`` of them when the rule has one."""
    if "fraction" not in rule:
        return rows
    picked = _stratified_pick(manifest["label"].to_numpy()[rows], float(rule["fraction"]), rng)
    return np.sort(rows[picked])


def _global_test(manifest, rows, rule, rng) -> tuple[np.ndarray, np.ndarray]:
    """-> (global test rows, pool rows for the clients)."""
    if rule == "none":
        return np.zeros(0, dtype=int), rows
    if rule == "official":
        is_test = manifest["split"].to_numpy()[rows] == "test"
        if not is_test.any():
            raise SplitError("global_test: official, but the manifest has no rows with split == 'test'")
        return rows[is_test], rows[~is_test]
    if isinstance(rule, dict) and "sources" in rule:
        check_sources(rule["sources"], manifest["source"].to_numpy().astype(str)[rows], "global_test", "the pool")
        in_target = np.isin(manifest["source"].to_numpy()[rows], rule["sources"])
        return _source_fraction(manifest, rows[in_target], rule, rng), rows[~in_target]
    if isinstance(rule, dict) and ("fraction" in rule or "size" in rule):
        labels = manifest["label"].to_numpy()[rows]
        chosen = _stratified_pick(labels, float(rule.get("fraction", 0.0)), rng, rule.get("size"))
        mask = np.zeros(len(rows), dtype=bool)
        mask[chosen] = True
        return rows[mask], rows[~mask]
    raise SplitError(f"unknown global_test rule {rule!r}; allowed: none, official, {{sources: [...]}}, {{fraction: f}}, "
                     f"{{size: n}}")


def _stratified_pick(labels: np.ndarray, fraction: float, rng, size: int | None = None) -> np.ndarray:
    """round(fraction n_c) random members of every class c, or, with ``size``, exactly ``size`` rows divided among
    the classes in proportion to their counts (largest remainders)."""
    classes = np.unique(labels)
    if size is not None and size > len(labels):
        raise SplitError(f"global_test: size {size} but the pool holds {len(labels)} rows")
    quota = apportion(int(size), [(labels == c).sum() for c in classes]) if size is not None else None
    picked = []
    for i, c in enumerate(classes):
        members = rng.permutation(np.flatnonzero(labels == c))
        picked.append(members[: int(quota[i]) if quota is not None else int(round(fraction * len(members)))])
    return np.concatenate(picked) if picked else np.zeros(0, dtype=int)


def _reference(global_rows: np.ndarray, fraction: float, rng) -> tuple[np.ndarray, np.ndarray]:
    if fraction <= 0 or not len(global_rows):
        return np.zeros(0, dtype=int), global_rows
    shuffled = rng.permutation(global_rows)
    n_ref = int(round(fraction * len(shuffled)))
    return shuffled[:n_ref], shuffled[n_ref:]


def _client_parts(rows: np.ndarray, ratios: dict, rng) -> dict[str, np.ndarray]:
    shuffled = rng.permutation(rows)
    n = len(shuffled)
    n_val = int(round(ratios.get("val", 0.0) * n))
    n_test = int(round(ratios.get("test", 0.0) * n))
    n_train = n - n_val - n_test
    return {
        "train": np.sort(shuffled[:n_train]),
        "val": np.sort(shuffled[n_train:n_train + n_val]),
        "test": np.sort(shuffled[n_train + n_val:]),
    }


def _imagefolder_parts(rows: np.ndarray, ratios: dict, rank: np.ndarray, seed: int) -> dict[str, np.ndarray]:
    """The FACMIC / FAA-CLIP code's cut of one client (AIPMLab/FACMIC and AIPMLab/FAA-CLIP
    utils/prepare_data_dg_clip.py::getfeadataloader): the client's ImageFolder order, indexed by
    ``np.random.seed(args.seed); np.random.shuffle(arange(n))``; the first ``int(r_train n)`` indices are its
    training part, the next ``int(r_val n)`` its validation part, the next ``int(r_test n)`` its test part, and
    the rest (at most one row a part) is used by nobody."""
    ordered = rows[np.argsort(rank[rows], kind="stable")]
    index = np.random.RandomState(seed).permutation(len(ordered))
    n = len(ordered)
    n_train, n_val, n_test = (int(n * ratios.get(part, 0.0)) for part in ("train", "val", "test"))
    cuts = {"train": index[:n_train], "val": index[n_train:n_train + n_val],
            "test": index[n_train + n_val:n_train + n_val + n_test]}
    return {part: np.sort(ordered[positions]) for part, positions in cuts.items()}


def _given_parts(pool: np.ndarray, part: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """A client's train/val/test as a splitter cut them (pool positions -> manifest rows)."""
    return {name: np.sort(pool[np.asarray(part.get(name, []), dtype=int)]) for name in ("train", "val", "test")}


def _official_parts(rows: np.ndarray, official: np.ndarray) -> dict[str, np.ndarray]:
    """A client's rows divided by the manifest's official split (rows without one count as train)."""
    marks = official[rows]
    return {
        "train": np.sort(rows[(marks == "train") | (marks == "")]),
        "val": np.sort(rows[marks == "val"]),
        "test": np.sort(rows[marks == "test"]),
    }


def count_table(split: Split, manifest: pd.DataFrame, class_names: list[str], classes: list[int] | None = None) -> pd.DataFrame:
    """Client x class counts (training parts), plus val/test/total columns, ``size`` (the whole client before its
    cut: total plus the rows a cut leaves out) and a global row. ``class_names``: the task's classes, which are
    the dataset labels ``classes`` (None: every class of the dataset)."""
    labels = task_labels(manifest["label"].to_numpy(), classes)
    records = []
    for name, parts in split.clients.items():
        counts = np.bincount(labels[parts["train"]], minlength=len(class_names))
        records.append({"client": name, **dict(zip(class_names, counts.tolist())),
                        "train": len(parts["train"]), "val": len(parts["val"]), "test": len(parts["test"]),
                        "size": split.size(name)})
    for name, rows in (("global_test", split.global_test), ("reference", split.reference), ("external", split.external)):
        if len(rows):
            counts = np.bincount(labels[rows], minlength=len(class_names))
            records.append({"client": name, **dict(zip(class_names, counts.tolist())), "train": 0, "val": 0,
                            "test": len(rows), "size": len(rows)})
    frame = pd.DataFrame(records)
    frame["total"] = frame[["train", "val", "test"]].sum(axis=1)
    return frame


def split_id_of(dataset: str, spec: dict, split_seed: int) -> str:
    """The id of the split of ``dataset`` by ``spec`` under ``split_seed``: what a split file records of itself
    (its dataset, spec and seed) gives the id of the split it is, so a training job can tell its own split from
    another one copied over it."""
    alpha = f"-a{spec['alpha']:g}" if "alpha" in spec else ""
    clients = f"-c{spec['clients']}" if "clients" in spec else ""
    cut = "".join(f"{mark}{spec[key]}" for key, mark in (("partition_seed", "p"), ("client_seed", "c")) if key in spec)
    return f"{dataset}-{spec['kind']}{alpha}{clients}-s{split_seed}{cut}-{hash_obj([dataset, spec], 6)}"
