"""Plug-ins and extensions (docs/plugins.md): a method or dataset from outside the package is found by the registry
like a built-in one, joins the papers' tables as a twin of their baseline rows, and every bad input stops the
configuration before any job, naming the plug-in, file or key; nothing built in changes when an extension is added.

Plug-ins here are real distributions on ``sys.path`` (a dist-info folder with an ``entry_points.txt``, as ``pip``
writes it), found through ``importlib.metadata`` as installed ones are. The end-to-end run of the example package,
installed with ``pip install -e`` and run through Snakemake, is tests/test_plugin_example.py.
"""

from __future__ import annotations

import importlib
import os
import sys
import textwrap
from pathlib import Path

import pandas as pd
import pytest
from PIL import Image

from fedrepro import paths, registry
from fedrepro.config import ConfigError, load_project

ROOT = Path(__file__).resolve().parents[1]
DEMO = [ROOT / "config/demo.yaml"]
PAPERS = {"papers": ["fediic", "facmic"]}       # two demo twins: fast to plan, both kinds of table

METHOD_MODULE = '''
from fedrepro.methods.fedavg import FedAvg
from fedrepro.registry import register_method


@register_method("{name}", params={{"beta": {{"type": "number", "minimum": 0, "maximum": 1, "default": 0.5}}}},
                 inputs={inputs})
class Mine(FedAvg):
    """A FedAvg with a parameter, standing for a researcher's method."""
'''


@pytest.fixture()
def plugins(monkeypatch, tmp_path):
    """A clean slate for plug-ins: the registries as built in, entry points looked up again, and every plug-in
    module, path and declaration a test adds gone afterwards."""
    for catalogue in registry.REGISTRIES:
        catalogue.load_builtin()
    saved = [(c, dict(c._entries)) for c in registry.REGISTRIES]
    state, imported, found = dict(registry._STATE), set(registry._IMPORTED), dict(registry._PLUGINS)
    modules = set(sys.modules)
    monkeypatch.setattr(sys, "path", list(sys.path))
    for var in (registry.PLUGINS_ENV, registry.DATASETS_ENV):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(paths, "folder_check", lambda name: str(tmp_path / "checks" / f"{name}.json"))
    registry._STATE.update(entry_points=False, datasets=None)
    for catalogue, entries in saved:     # only built-ins: a plug-in another test left must not be seen
        catalogue._entries = {k: e for k, e in entries.items() if e.origin is None}
    yield tmp_path
    for catalogue, entries in saved:
        catalogue._entries = entries
    registry._STATE.clear()
    registry._STATE.update(state)
    registry._IMPORTED.clear()
    registry._IMPORTED.update(imported)
    registry._PLUGINS.clear()
    registry._PLUGINS.update(found)
    for name in set(sys.modules) - modules:
        del sys.modules[name]
    importlib.invalidate_caches()
    paths.use_results_dir("results")


def distribution(folder: Path, dist: str, module: str, source: str, entry: str | None = None) -> Path:
    """An installed distribution ``dist`` 0.1 whose entry point (group fedrepro.plugins) is ``module``."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{module}.py").write_text(textwrap.dedent(source))
    info = folder / f"{dist.replace('-', '_')}-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[fedrepro.plugins]\n{entry or module} = {module}\n")
    sys.path.insert(0, str(folder))
    importlib.invalidate_caches()
    return folder


def project(extra: dict | None = None, base: dict | None = None):
    return load_project(DEMO, overrides={**PAPERS, **(base or {}), **(extra or {})}, root=ROOT)


def extension(**methods) -> dict:
    return {"extension": {"name": "mine", "methods": methods}}


# ---- found like the built-ins --------------------------------------------------------------------

def test_an_installed_plugin_is_found_checked_and_counted(plugins, capsys):
    distribution(plugins / "site", "fedrepro-mine", "mine_plugin", METHOD_MODULE.format(name="mine", inputs=registry.INPUTS))
    entry = registry.METHODS.get("mine")
    assert entry.origin == "mine_plugin" and entry["schema"]["properties"]["beta"]["default"] == 0.5
    assert registry.METHODS.get("fedavg").origin is None
    from fedrepro.cli import main

    main(["validate", "--configfile", str(DEMO[0])])
    out = capsys.readouterr().out
    assert "plug-in mine_plugin (entry point mine_plugin = mine_plugin of fedrepro-mine 0.1): 1 method (mine)" in out


def test_a_module_named_in_the_configuration_is_loaded_and_a_misspelt_one_is_named(plugins):
    folder = plugins / "mods"
    folder.mkdir()
    (folder / "my_methods.py").write_text(METHOD_MODULE.format(name="mine2", inputs=registry.INPUTS))
    sys.path.insert(0, str(folder))
    project({"plugins": ["my_methods"]})
    assert registry.METHODS.get("mine2").origin == "my_methods"
    with pytest.raises(ConfigError, match=r"plug-in 'my_methodz' \(config: plugins\) failed to import: "
                                          r"ModuleNotFoundError.*correct the name"):
        project({"plugins": ["my_methodz"]})


def test_a_plugin_that_fails_to_import_is_named_with_its_distribution_and_line(plugins):
    distribution(plugins / "site", "fedrepro-broken", "broken_plugin", "import fedrepro\nraise RuntimeError('no GPU here')\n")
    with pytest.raises(ConfigError) as error:
        project()
    text = str(error.value)
    assert "plug-in 'broken_plugin' (entry point broken_plugin = broken_plugin of fedrepro-broken 0.1)" in text
    assert "RuntimeError: no GPU here" in text and "broken_plugin.py:2" in text
    assert "pip uninstall fedrepro-broken" in text


def test_a_name_that_clashes_with_a_builtin_is_refused_and_nothing_is_replaced(plugins):
    builtin = registry.METHODS._entries["fedavg"].obj      # (get() would look for plug-ins before the one below exists)
    distribution(plugins / "site", "fedrepro-clash", "clash_plugin", METHOD_MODULE.format(name="fedavg", inputs=registry.INPUTS))
    with pytest.raises(ConfigError, match=r"plug-in 'clash_plugin' \(entry point .* of fedrepro-clash 0.1\) registers the "
                                          r"method 'fedavg', which the built-in fedrepro.methods.fedavg already "
                                          r"registers; nothing is replaced"):
        project()
    assert registry.METHODS.get("fedavg").obj is builtin


def test_two_plugins_with_one_name_are_both_named(plugins):
    distribution(plugins / "a", "fedrepro-a", "plugin_a", METHOD_MODULE.format(name="twice", inputs=registry.INPUTS))
    distribution(plugins / "b", "fedrepro-b", "plugin_b", METHOD_MODULE.format(name="twice", inputs=registry.INPUTS))
    with pytest.raises(ConfigError, match=r"plug-in 'plugin_b' .* registers the method 'twice', which plug-in 'plugin_a' "
                                          r"\(entry point plugin_a = plugin_a of fedrepro-a 0.1\) already registers"):
        project()


# ---- extensions: twins of the baseline rows ------------------------------------------------------

def test_the_method_joins_every_table_with_a_fedavg_row_and_the_check_says_what_it_skipped(plugins):
    distribution(plugins / "site", "fedrepro-mine", "mine_plugin", METHOD_MODULE.format(name="mine", inputs=registry.INPUTS))
    proj = project(extension(mine={"label": "Mine", "params": {"beta": 0.3}, "papers": ["fediic", "facmic"]}))
    table = proj.papers["fediic"]["tables"]["table1"]
    assert [r["method"] for r in table["rows"]] == ["fedavg", "mine", "fediic"]
    assert list(proj.papers["fediic"]["tables"]) == ["table1"] and proj.papers["facmic"]["tables"] == {}
    notes = "\n".join(proj.extension.notes())
    assert "fediic/table1: rows Mine" in notes
    assert "fediic/imbalance skipped: a class_balance table" in notes
    assert "facmic/table2 skipped: for Mine: no row of fedavg (its like:) to swap it into; its rows: FACMIC, FedCLIP" in notes
    # the twin runs as the FedAvg row beside it: the same train block, the extension's method and params
    fedavg = proj.resolver.run_config(proj.resolver.run_key("fediic", "lt_creff", "fedavg", 0))
    mine = proj.resolver.run_config(proj.resolver.run_key("fediic", "lt_creff", "mine", 0))
    assert mine["train"] == fedavg["train"] and mine["split_id"] == fedavg["split_id"]
    assert mine["algorithm"] == {"name": "mine", "params": {"beta": 0.3}}
    # the extension's reports go beside the configuration's own results (the demo's: results/demo)
    assert paths.table("clean", "fediic", "table1") == f"{proj.config['results_dir']}/extensions/mine/tables/clean/fediic/table1.md"


def test_a_method_that_cannot_train_the_rows_runs_is_skipped_saying_why(plugins):
    distribution(plugins / "site", "fedrepro-feat", "feat_plugin", METHOD_MODULE.format(name="featonly", inputs=("features",)))
    proj = project(extension(featonly={"papers": ["fediic"]},
                             mine2={"method": "fedprox", "label": "FedProx 2", "papers": ["fediic"]}))
    notes = "\n".join(proj.extension.notes())
    assert ("fediic/table1 skipped: row featonly: featonly trains features (classification, retrieval; as plug-in "
            "'feat_plugin' (entry point feat_plugin = feat_plugin of fedrepro-feat 0.1) registers it)") in notes and "these runs train proj_classifier on images (classification)" in notes
    assert [r["method"] for r in proj.papers["fediic"]["tables"]["table1"]["rows"]] == ["fedavg", "mine2", "fediic"]
    assert "featonly" not in proj.papers["fediic"]["methods"]


def test_an_extension_that_fits_nowhere_says_why_for_every_table(plugins):
    with pytest.raises(ConfigError, match=r"(?s)config: extension \(mine\) adds nothing to any table:\n.*facmic/table2 skipped: "
                                          r"for mine2: no row of fedavg"):
        project(extension(mine2={"method": "fedprox", "papers": ["facmic"]}))


def test_params_the_schema_rejects_and_misspelt_keys_stop_before_any_job(plugins):
    distribution(plugins / "site", "fedrepro-mine", "mine_plugin", METHOD_MODULE.format(name="mine", inputs=registry.INPUTS))
    with pytest.raises(ConfigError, match=r"config: extension/methods/mine/params: 'beta' = 3 is out of range; allowed: 0 <= value <= 1"):
        project(extension(mine={"params": {"beta": 3}, "papers": ["fediic"]}))
    with pytest.raises(ConfigError, match=r"unknown key\(s\) \['paper'\] under 'extension/methods/mine'.*did you mean 'papers'"):
        project(extension(mine={"paper": ["fediic"]}))
    with pytest.raises(ConfigError, match=r"extension/methods/mine/papers.*'fedic' is not allowed \(did you mean 'fediic'\?\)"):
        project(extension(mine={"papers": ["fedic"]}))
    with pytest.raises(ConfigError, match=r"extension/methods/mine/method.*'mnie' is not allowed \(did you mean 'mine'\?\)"):
        project(extension(mine={"method": "mnie", "papers": ["fediic"]}))


def test_adding_an_extension_changes_no_builtin_run_or_definition(plugins):
    from fedrepro.report.definitions import definition_hash, evidence_definition, item_definition, scorecard_definition
    from fedrepro.report.tables import table_item

    def fingerprint(proj):
        runs = {k: proj.resolver.run_config(k)["config_hash"] for k in proj.plan.runs()}
        tables = {(p, t): definition_hash(item_definition(table_item(proj, protocol, p, t)))
                  for protocol, p, t in proj.plan.tables()}
        cards = {p: definition_hash(scorecard_definition(proj, p)) for p in [*proj.papers, "all"]}
        return runs, tables, cards, definition_hash(evidence_definition(proj)), paths.table("clean", "fediic", "table1")

    before = fingerprint(project())
    extended = project(extension(mine2={"method": "fedprox", "params": {"mu": 0.1}, "papers": ["fediic"]}))
    runs = {k: extended.resolver.run_config(k)["config_hash"] for k in extended.plan.runs()}
    shared = set(runs) & set(before[0])
    assert shared and all(runs[k] == before[0][k] for k in shared)       # the baselines' runs are the very same
    assert {k.method for k in set(runs) - shared} == {"mine2"}
    assert paths.table("clean", "fediic", "table1") != before[4]          # its reports go elsewhere
    assert fingerprint(project()) == before                               # and removing it changes nothing


# ---- folder datasets ------------------------------------------------------------------------------

def shapes(folder: Path, rows: list[tuple[str, str]], broken: str | None = None) -> dict:
    (folder / "images").mkdir(parents=True)
    for i, (name, label) in enumerate(rows):
        Image.new("RGB", (8, 8), (40 * i % 255, 0, 0)).save(folder / "images" / name)
    if broken:
        (folder / "images" / broken).write_bytes(b"not a png at all")
        rows = [*rows, (broken, "circle")]
    pd.DataFrame(rows, columns=["path", "class_name"]).assign(source="site").to_csv(folder / "labels.csv", index=False)
    return {"images": str(folder / "images"), "labels": str(folder / "labels.csv"), "classes": ["circle", "square"]}


def with_dataset(declaration: dict, split: dict | None = None) -> dict:
    return {"datasets": {"toy": declaration}, "extension": {"name": "toy", "settings": {"toy": {
        "dataset": "toy", "split": split or {"kind": "iid", "clients": 2, "global_test": {"fraction": 0.25}},
        "papers": {"fediic": "lt_creff"}}}}}


SPLITTER_MODULE = '''
import numpy as np
from fedrepro.registry import splitter


@splitter("halves")
def halves(labels, sources, spec, rng):
    """The pool cut in two at spec["options"]["at"]: a researcher's own splitter."""
    order = rng.permutation(len(labels))
    cut = int(len(labels) * spec["options"]["at"])
    return [np.sort(order[:cut]), np.sort(order[cut:])]
'''


def test_a_plugin_splitter_splits_a_folder_dataset(plugins):
    from fedrepro.data.partition import make_split

    distribution(plugins / "site", "fedrepro-halves", "halves_plugin", SPLITTER_MODULE)
    rows = [(f"{c}{i}.png", c) for c in ("circle", "square") for i in range(10)]
    split = {"kind": "halves", "options": {"at": 0.25}, "ratios": {"train": 1.0, "val": 0.0, "test": 0.0}}
    proj = project(with_dataset(shapes(plugins / "toy", rows), split))
    spec = proj.resolver.setting("fediic", "toy")["split"]
    manifest = pd.DataFrame({"label": [0] * 10 + [1] * 10, "source": "", "split": "", "path": [r[0] for r in rows]})
    parts = make_split(manifest, spec, 0)
    assert [len(parts.clients[c]["train"]) for c in sorted(parts.clients)] == [5, 15]
    with pytest.raises(ConfigError, match=r"split/kind: 'halvs' is not allowed \(did you mean 'halves'\?\)"):
        project(with_dataset(shapes(plugins / "toy2", rows), {**split, "kind": "halvs"}))


def test_a_folder_dataset_becomes_a_setting_of_twin_tables(plugins):
    rows = [(f"{c}{i}.png", c) for c in ("circle", "square") for i in range(6)]
    proj = project(with_dataset(shapes(plugins / "toy", rows)))
    tables = proj.papers["fediic"]["tables"]
    assert set(tables) == {"table1@toy", "imbalance@toy"}
    assert {c["setting"] for c in tables["table1@toy"]["columns"]} == {"toy"} and "published" not in tables["table1@toy"]
    assert tables["imbalance@toy"]["settings"] == ["toy"]
    key = proj.resolver.run_key("fediic", "toy", "fediic", 0)
    assert proj.resolver.run_config(key)["train"] == proj.resolver.run_config(
        proj.resolver.run_key("fediic", "lt_creff", "fediic", 0))["train"]          # trains as lt_creff does
    assert registry.DATASETS.get("toy").origin == "config"
    environment = proj.job_environment()
    assert '"classes": ["circle", "square"]' in environment[registry.DATASETS_ENV]


def test_an_unknown_label_a_missing_and_an_unreadable_image_are_named(plugins):
    rows = [(f"{c}{i}.png", c) for c in ("circle", "square") for i in range(3)]
    declaration = shapes(plugins / "a", rows)
    labels = pd.read_csv(declaration["labels"])
    labels.loc[4, "class_name"] = "sqare"
    labels.to_csv(declaration["labels"], index=False)
    with pytest.raises(ConfigError, match=r"config: datasets/toy: labels .*labels.csv:\n  line 6: class 'sqare' is not one "
                                          r"of the classes \['circle', 'square'\] \(did you mean 'square'\?\)"):
        project(with_dataset(declaration))

    declaration = shapes(plugins / "b", rows, broken="circle9.png")
    with pytest.raises(ConfigError, match=r"config: datasets/toy: 1 image\(s\) listed in .* cannot be read:\n  "
                                          r".*circle9.png: UnidentifiedImageError"):
        project(with_dataset(declaration))

    declaration = shapes(plugins / "c", rows)
    os.remove(Path(declaration["images"]) / "square1.png")
    with pytest.raises(ConfigError, match=r"1 image\(s\) listed in .* are not in .*\n  .*square1.png"):
        project(with_dataset(declaration))


def test_a_folder_dataset_may_not_take_a_builtin_name(plugins):
    declaration = shapes(plugins / "d", [("a.png", "circle"), ("b.png", "square")])
    with pytest.raises(ConfigError, match=r"config: datasets/demo_bt: fedrepro itself \(built in\) already declares a dataset of this name"):
        project({"datasets": {"demo_bt": declaration}})


def test_the_download_step_links_the_folder_and_the_manifest_keeps_its_columns(plugins):
    from fedrepro.data import folder
    from fedrepro.data.download import download_dataset
    from fedrepro.data.prepare import prepare_dataset

    declaration = shapes(plugins / "e", [("a.png", "circle"), ("b.png", "square"), ("c.png", "circle")])
    spec = folder.declare({"toy": declaration})[0]
    raw = plugins / "raw"
    download_dataset(spec, raw)
    assert (raw / "toy" / "images").is_symlink() and (raw / "toy" / ".complete").exists()
    manifest = prepare_dataset(spec, raw, manifest_dir=plugins)
    assert list(manifest["path"]) == ["toy/images/a.png", "toy/images/b.png", "toy/images/c.png"]
    assert list(manifest["label"]) == [0, 1, 0] and set(manifest["source"]) == {"site"}
    assert all((raw / p).is_file() for p in manifest["path"])


# ---- the report side and the fork-server ------------------------------------------------------------

def test_the_scorecard_lists_the_extension_cells_as_unpublished_and_does_not_count_them(tmp_path):
    from fedrepro.report import scorecard

    csv = tmp_path / "t.csv"
    pd.DataFrame({"row": ["FedAvg", "Mine", "FedAvg"], "column": ["acc", "acc", "f1"], "mean": [50.0, 52.0, 40.0],
                  "ci95": [1.0, 1.0, 1.0], "n": [3, 3, 3], "published": [50.5, None, None]}).to_csv(csv, index=False)
    card = scorecard.build([("p", "t", "clean", csv)], {("p", "t"): {"rows": {"Mine"}, "columns": set(), "all": False}})
    assert list(zip(card["row"], card["verdict"])) == [("FedAvg", "reproduced"), ("Mine", "unpublished")]
    line = scorecard.summary_line(card)
    assert line.startswith("p (clean): of the 1 published numbers that could be judged, 1 reproduced"), line
    assert line.endswith("And 1 numbers of the extension, which have no published value."), line
    assert len(scorecard.build([("p", "t", "clean", csv)])) == 1      # without an extension: as before


def test_a_forked_job_sees_what_its_environment_adds_to_the_import_path(tmp_path, monkeypatch):
    from fedrepro import forkserver

    extra, site_dir = tmp_path / "extra", tmp_path / "site"
    extra.mkdir()
    site_dir.mkdir()
    (tmp_path / "editable").mkdir()
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.setitem(forkserver._SITE, "pth", set())
    (site_dir / "__editable__.mine.pth").write_text(str(tmp_path / "editable") + "\n")
    monkeypatch.setattr(forkserver, "_pth_files", lambda: {str(site_dir / "__editable__.mine.pth")})
    monkeypatch.setenv("PYTHONPATH", str(extra))
    forkserver.refresh_import_path()
    assert str(extra) in sys.path and str(tmp_path / "editable") in sys.path


def test_a_twin_in_an_overlay_paper_gets_what_the_overlay_gives_its_baseline(plugins):
    """The evidence run's FedDRA overlay gives FedMAE a ViT of its own; FedMAE's twin trains that ViT too."""
    proj = load_project([ROOT / "config/evidence.yaml"], root=ROOT, overrides={
        "papers": ["feddra"], "extension": {"name": "ev", "methods": {"mine3": {
            "method": "fedprox", "like": "fedmae", "papers": ["feddra"]}}}})
    setting = next(iter(proj.papers["feddra"]["settings"]))
    twin, base = (proj.resolver.run_config(proj.resolver.run_key("feddra", setting, m, 0)) for m in ("mine3_convirt", "fedmae_convirt"))
    assert twin["train"]["model"]["image"]["backbone"] == "test_vit" and twin["train"] == base["train"]
