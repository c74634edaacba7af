"""Client splits: coverage, disjointness, seed stability, the Dirichlet recipe, empty clients."""

import numpy as np
import pandas as pd
import pytest

from fedrepro.data.partition import SplitError, make_split, split_dirichlet


def toy_manifest(n_per_class=(40, 30, 20, 10), sources=None, test_fraction=0.0, seed=0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    labels = np.concatenate([np.full(n, c) for c, n in enumerate(n_per_class)])
    rng.shuffle(labels)
    frame = pd.DataFrame({"path": [f"img{i:04d}.png" for i in range(len(labels))], "label": labels,
                          "class_name": [f"c{c}" for c in labels], "source": "", "split": "train"})
    if sources is not None:
        frame["source"] = [sources[i % len(sources)] for i in range(len(frame))]
    if test_fraction:
        frame.loc[frame.index[: int(test_fraction * len(frame))], "split"] = "test"
    return frame


def all_rows(split):
    return split.assigned()


SPECS = [
    {"kind": "iid", "clients": 3},
    {"kind": "dirichlet", "clients": 3, "alpha": 0.5, "on_empty": "resample", "min_train": 2},
    {"kind": "pathological", "clients": 2, "classes_per_client": 2},
    {"kind": "by_source", "sources": ["a", "b", "c"]},
]


@pytest.mark.parametrize("spec", SPECS, ids=[s["kind"] for s in SPECS])
def test_every_row_in_exactly_one_place(spec):
    manifest = toy_manifest(sources=["a", "b", "c"])
    split = make_split(manifest, spec, seed=3)
    rows = all_rows(split)
    assert len(rows) == len(set(rows.tolist())), "a row is in two places"
    assert set(rows.tolist()) == set(range(len(manifest))), "a row is in no client"


@pytest.mark.parametrize("spec", SPECS, ids=[s["kind"] for s in SPECS])
def test_seed_stability_and_variation(spec):
    manifest = toy_manifest(sources=["a", "b", "c"])
    a, b, c = (make_split(manifest, spec, seed=s) for s in (5, 5, 6))
    assert a.to_json() == b.to_json()
    if spec["kind"] != "by_source":  # by-source membership is fixed; only the train/val/test cut moves
        assert a.to_json()["clients"] != c.to_json()["clients"]
    assert a.to_json() != c.to_json()


def test_dirichlet_divides_each_class_by_one_draw_per_class():
    labels = np.repeat(np.arange(3), 100)
    rng = np.random.default_rng(0)
    parts = split_dirichlet(labels, np.array([""] * 300), {"clients": 4, "alpha": 0.3}, rng)
    # replay the recipe with the same generator: per class, a permutation then p ~ Dir(alpha * 1_N)
    ref = np.random.default_rng(0)
    for c in range(3):
        ref.permutation(100)
        p = ref.dirichlet(np.full(4, 0.3))
        expected = np.diff(np.r_[0, np.round(np.cumsum(p)[:-1] * 100).astype(int), 100])
        got = [int(np.sum(labels[part] == c)) for part in parts]
        assert got == expected.tolist()


def test_small_alpha_is_more_skewed_than_large_alpha():
    manifest = toy_manifest(n_per_class=(200, 200, 200, 200))

    def skew(alpha):
        spec = {"kind": "dirichlet", "clients": 4, "alpha": alpha, "ratios": {"train": 1.0}, "on_empty": "resample"}
        values = []
        for seed in range(10):
            split = make_split(manifest, spec, seed)
            counts = np.array([np.bincount(manifest.label.to_numpy()[p["train"]], minlength=4) for p in split.clients.values()])
            values.append(np.mean(counts.max(0) / counts.sum(0)))
        return np.mean(values)

    assert skew(0.1) > skew(10.0) + 0.2


def test_empty_client_is_an_error_naming_the_fix_or_resampled():
    manifest = toy_manifest(n_per_class=(6, 6))
    spec = {"kind": "dirichlet", "clients": 5, "alpha": 0.05, "min_train": 2}
    with pytest.raises(SplitError, match="fewer than min_train=2.*resample"):
        make_split(manifest, spec, seed=0)
    spec_resample = dict(spec, on_empty="resample", max_draws=500, alpha=0.5)
    split = make_split(manifest, spec_resample, seed=0)
    assert split.draws >= 1
    assert all(len(p["train"]) >= 2 for p in split.clients.values())


def test_ratios_and_global_sets():
    manifest = toy_manifest(test_fraction=0.25)
    spec = {"kind": "iid", "clients": 2, "ratios": {"train": 0.8, "val": 0.1, "test": 0.1},
            "global_test": "official", "reference_fraction": 0.5}
    split = make_split(manifest, spec, seed=0)
    official_test = set(np.flatnonzero(manifest.split == "test"))
    assert set(split.global_test) | set(split.reference) == official_test
    assert not set(split.global_test) & set(split.reference)
    assert len(split.reference) == round(0.5 * len(official_test))
    for part in split.clients.values():
        n = sum(len(v) for v in part.values())
        assert len(part["val"]) == round(0.1 * n) and len(part["test"]) == round(0.1 * n)


def test_leave_one_domain_out():
    manifest = toy_manifest(sources=["A", "C", "P", "R"])
    spec = {"kind": "by_source", "global_test": {"sources": ["R"]}}
    split = make_split(manifest, spec, seed=0)
    assert len(split.clients) == 3
    assert set(manifest.source.to_numpy()[split.global_test]) == {"R"}
    for part in split.clients.values():
        assert "R" not in set(manifest.source.to_numpy()[np.concatenate(list(part.values()))])


def test_a_sources_rule_may_keep_a_stratified_fraction_of_its_sources():
    manifest = toy_manifest(n_per_class=(40, 40, 20, 20), sources=["A", "C", "P", "R"])
    spec = {"kind": "by_source", "global_test": {"sources": ["R"], "fraction": 0.5},
            "external": {"sources": ["P"], "fraction": 0.25}}
    split = make_split(manifest, spec, seed=0)
    sources, labels = manifest.source.to_numpy(), manifest.label.to_numpy()
    for rows, source, fraction in ((split.global_test, "R", 0.5), (split.external, "P", 0.25)):
        assert set(sources[rows]) == {source}
        every = np.flatnonzero(sources == source)
        for c in range(4):                    # stratified: the fraction of every class
            assert (labels[rows] == c).sum() == round(fraction * (labels[every] == c).sum())
    clients = np.concatenate([np.concatenate(list(p.values())) for p in split.clients.values()])
    assert set(sources[clients]) == {"A", "C"}    # the rest of R and P is used by nobody
    assert not set(clients) & (set(split.global_test) | set(split.external))
    again = make_split(manifest, spec, seed=0)
    assert np.array_equal(again.global_test, split.global_test) and np.array_equal(again.external, split.external)


def test_pathological_clients_hold_disjoint_class_sets():
    manifest = toy_manifest(n_per_class=(10,) * 6)
    split = make_split(manifest, {"kind": "pathological", "clients": 3, "classes_per_client": 2, "ratios": {"train": 1.0}}, 1)
    held = [set(manifest.label.to_numpy()[p["train"]]) for p in split.clients.values()]
    assert all(len(h) == 2 for h in held)
    assert len(set().union(*held)) == 6


def test_unknown_kind_lists_allowed():
    with pytest.raises(SplitError, match="allowed:.*dirichlet"):
        make_split(toy_manifest(), {"kind": "dirichlett", "clients": 2}, 0)


def test_more_clients_than_images_is_a_short_message():
    """``clients: 5000`` on a dozen images: one short line saying so (it listed every empty client: 80 KB)."""
    manifest = pd.DataFrame({"path": [f"p{i}.png" for i in range(12)], "label": [i % 3 for i in range(12)],
                             "class_name": ["a"] * 12, "source": [""] * 12, "split": [""] * 12})
    with pytest.raises(SplitError) as err:
        make_split(manifest, {"kind": "iid", "clients": 5000}, 0)
    text = str(err.value)
    assert len(text) < 1000 and "of 5000 clients" in text and "5000 clients for the 12 images" in text
